"""Tasks graded by a Python `verify(...)`, on the real engine: the example dataset, the
parameters verify() gets, contract errors, an old Python, and the attempts to put another
`harbor_verifiers` in place of the engine's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fixtures import REPO_ROOT, Dataset, Server, run_harbor
from tests.model_server import ChatRequest, Reply, answer

pytestmark = pytest.mark.docker

EXAMPLE = REPO_ROOT / "example_datasets" / "python-verifiers"
#: The example dataset's image (one build, shared with it by its content).
PYTHON_DOCKERFILE = (EXAMPLE / "count-words" / "environment" / "Dockerfile").read_text()
TOML = '[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\n[environment]\nworkdir = "/app"\n'


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def python_task(
    dataset: Dataset,
    name: str,
    verifier: str,
    *,
    solve: str = "true\n",
    dockerfile: str = PYTHON_DOCKERFILE,
    toml: str = TOML,
    extra_files: dict[str, str] | None = None,
) -> Path:
    return dataset.task(
        name,
        toml=toml,
        dockerfile=dockerfile,
        solve_sh=solve,
        test_sh="",
        extra_files={"tests/verifier.py": verifier, **(extra_files or {})},
    )


def _no_test_sh(task: Path) -> Path:
    (task / "tests" / "test.sh").unlink()
    return task


def test_the_example_dataset_grades_each_kind_of_verifier(pytester: pytest.Pytester) -> None:
    copy = Dataset(pytester.path / "python-verifiers")
    shutil.copytree(EXAMPLE, copy.path)
    result = run_harbor(pytester, copy, "-n", "2")
    result.assert_outcomes(passed=4)
    rows = {row["task_id"]: row for row in copy.rows(pytester.path / "out")}
    assert {task: row["reward"] for task, row in rows.items()} == {
        "answer-or-file": 1.0,
        "async-checks": 1.0,
        "count-words": 1.0,
        "shared-grader": 1.0,
    }
    # A number becomes reward.txt, a dict reward.json (the async verifier's).
    assert rows["async-checks"]["verifier_rewards"] == {
        "reward": 1.0,
        "executable": 1.0,
        "greets": 1.0,
    }
    folder = Path(str(rows["async-checks"]["verifier_logs_dir"]))
    assert (folder / "reward.json").is_file() and not (folder / "reward.txt").exists()
    folder = Path(str(rows["count-words"]["verifier_logs_dir"]))
    assert (folder / "reward.txt").read_text() == "1.0\n"


def test_a_verify_that_requires_a_response_is_a_contract_error_under_the_oracle(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    _no_test_sh(python_task(dataset, "needs-response", "def verify(response):\n    return 1.0\n"))
    _no_test_sh(python_task(dataset, "returns-text", "def verify():\n    return 'yes'\n"))
    result = run_harbor(pytester, dataset)
    result.assert_outcomes(failed=2)
    rows = {row["task_id"]: row for row in dataset.rows(pytester.path / "out")}
    for row in rows.values():
        assert row["failure_kind"] == "harbor:verifier_contract"
        assert row["reward"] == 0.0 and not row["mask_sample"]
        assert not (Path(str(row["verifier_logs_dir"])) / "reward.txt").exists()
    assert "requires `response`, and this turn has none" in str(
        rows["needs-response"]["failure_reason"]
    )
    assert "returned str, not a number" in str(rows["returns-text"]["failure_reason"])


def test_an_agents_final_answer_reaches_verify_as_its_response(
    pytester: pytest.Pytester, dataset: Dataset, model_server: Server
) -> None:
    verifier = (
        "def verify(workspace, response=None):\n"
        "    assert response is not None and response['object'] == 'response'\n"
        "    text = response['output'][0]['content'][0]['text']\n"
        "    return 1.0 if response['output_text'] == text == 'Paris.' else 0.0\n"
    )
    _no_test_sh(python_task(dataset, "capital", verifier))

    def script(request: ChatRequest) -> Reply:
        return answer("Paris.")

    server = model_server(script)
    result = run_harbor(pytester, dataset, *server.options())
    result.assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out", validation=False)
    assert row["reward"] == 1.0 and row["response"] == "Paris."


def test_the_engines_helpers_shadow_any_of_the_tasks_or_the_images(
    pytester: pytest.Pytester, dataset: Dataset, built_images: list[Path]
) -> None:
    fake = "def fraction(checks):\n    return 1.0\n"
    # The image carries a module of that name in its site-packages, and a .pth file that
    # plants another in sys.modules at start-up; the task ships one beside its verifier
    # and points PYTHONPATH at a fourth. verify() uses the helper on checks of which one
    # in two holds: only the engine's gives 0.5.
    dockerfile = PYTHON_DOCKERFILE + (
        "RUN printf 'def fraction(checks):\\n    return 1.0\\n' "
        "> /usr/lib/python3/dist-packages/harbor_verifiers.py \\\n"
        ' && printf \'import sys, types; m = types.ModuleType("harbor_verifiers"); '
        'm.fraction = lambda checks: 1.0; sys.modules["harbor_verifiers"] = m\\n\' '
        "> /usr/lib/python3/dist-packages/zz-planted.pth\n"
    )
    verifier = (
        "import harbor_verifiers\n"
        "from harbor_verifiers import fraction\n\n\n"
        "def verify():\n"
        "    assert fraction is harbor_verifiers.fraction\n"
        "    version = float(harbor_verifiers.VERSION)\n"
        "    return {'reward': fraction([True, False]), 'version': version}\n"
    )
    task = python_task(
        dataset,
        "shadowed",
        verifier,
        dockerfile=dockerfile,
        toml=TOML.replace(
            "[verifier]\n", '[verifier]\nenv = { PYTHONPATH = "/tests/elsewhere" }\n'
        ),
        extra_files={
            "tests/harbor_verifiers.py": fake,
            "tests/elsewhere/harbor_verifiers/__init__.py": fake,
        },
    )
    _no_test_sh(task)
    built_images.append(task / "environment")
    result = run_harbor(pytester, dataset)
    result.assert_outcomes(failed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert row["verifier_rewards"] == {"reward": 0.5, "version": 1.0}


def test_a_python_older_than_3_8_is_refused_naming_it(
    pytester: pytest.Pytester, dataset: Dataset, built_images: list[Path]
) -> None:
    # An image whose python3 answers as 3.7.3 would.
    old = (
        "FROM debian:bookworm-slim\n"
        'RUN printf \'#!/bin/sh\\ncase "$*" in *"(3, 8)"*) exit 1;; '
        "*version_info*) echo 3.7.3;; esac\\nexit 1\\n' > /usr/local/bin/python3 "
        "&& chmod +x /usr/local/bin/python3\n"
    )
    task = _no_test_sh(
        python_task(dataset, "old-python", "def verify():\n    return 1.0\n", dockerfile=old)
    )
    built_images.append(task / "environment")
    result = run_harbor(pytester, dataset)
    result.assert_outcomes(failed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert row["failure_kind"] == "harbor:verifier_contract"
    assert row["failure_reason"] == (
        "the Python verifier needs Python 3.8 or newer; the image has python3 3.7.3"
    )
    (turn,) = row["turns"]  # type: ignore[misc]
    assert turn["verifier_exit_code"] == 127


def test_test_sh_wins_over_verifier_py(pytester: pytest.Pytester, dataset: Dataset) -> None:
    python_task(
        dataset,
        "both",
        "def verify():\n    return 0.0\n",
        extra_files={"tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n"},
    )
    result = run_harbor(pytester, dataset)
    result.assert_outcomes(passed=1)
