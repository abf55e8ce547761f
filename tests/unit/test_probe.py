"""The probe of check mode without a sandbox: which lines of a task's solution and tests
it looks for in an image, and which files its tests name."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

from pytest_harbor.engine.outcomes import probe_check_outcome, probe_findings
from pytest_harbor.engine.results import TurnResult
from pytest_harbor.harnesses.base import Deadline
from pytest_harbor.harnesses.probe import (
    PLACEHOLDERS,
    _create_named,
    config_matches,
    distinctive_lines,
    environment_git,
    named_files,
    placeholder,
    quoted_values,
    short_values,
)
from pytest_harbor.sandboxes.base import TRUSTED_BUSYBOX, ExecResult, ImageConfig
from pytest_harbor.tasks import load_task
from tests.fixtures import write_task


def test_it_looks_for_lines_that_carry_a_value_and_not_for_boilerplate(tmp_path: Path) -> None:
    task = write_task(
        tmp_path,
        "t",
        instruction="Write the passphrase to /tmp/pass.txt.\n",
        solve_sh=(
            "#!/bin/bash\nset -euo pipefail\nfrom pathlib import Path\n"
            "echo correct-horse-battery-staple-7731 > /tmp/pass.txt\n"
        ),
        test_sh=(
            "# a comment that is long enough to count\n"
            'expected="a sentence the answer holds"\n'
            "echo 1 > /logs/verifier/reward.txt\n"
        ),
    )
    turn = load_task(task).turns[0]
    found = distinctive_lines(turn, turn.instruction)
    assert "correct-horse-battery-staple-7731" in found
    assert 'expected="a sentence the answer holds"' in found
    assert "echo correct-horse-battery-staple-7731 > /tmp/pass.txt" in found
    assert not any("comment" in line or "pipefail" in line or "pathlib" in line for line in found)
    assert not any("/logs/verifier" in line for line in found)


def test_it_creates_the_files_the_tests_name_outside_the_systems_folders(tmp_path: Path) -> None:
    task = write_task(
        tmp_path,
        "t",
        test_sh=(
            "[ -f report.txt ] && [ -x /app/bin/tool ] && grep -q x /app/out/data.csv\n"
            "cat /etc/passwd /usr/bin/env $HOME/x /tests/helper.sh > /dev/null\n"
        ),
    )
    turn = load_task(task).turns[0]
    assert named_files(turn, "/work") == ["/app/bin/tool", "/app/out/data.csv", "/work/report.txt"]


def test_the_probes_item_fails_on_a_score_for_files_or_a_finding(tmp_path: Path) -> None:
    quiet = TurnResult(step="episode", reward=0.0, response='{"git": [], "image": []}')
    assert probe_check_outcome(quiet).status == "passed"
    scored = TurnResult(step="episode", reward=1.0, response='{"created": ["/app/x"]}')
    assert "for only creating the files" in probe_check_outcome(scored).headline
    git = TurnResult(step="episode", reward=0.0, response='{"git": ["/app/.git"]}')
    assert probe_check_outcome(git).status == "failed"
    assert probe_findings("not json") == {} and probe_findings("[1]") == {}


def test_the_probe_writes_a_placeholder_of_the_names_form_never_nothing() -> None:
    assert placeholder("/app/out/summary.json") == "{}"
    assert placeholder("/app/conf.YML") == "{}"
    assert placeholder("/app/notes/report.txt") == "placeholder"
    assert placeholder("/app/bin/tool") == placeholder("/app/run.sh") == "#!/bin/sh\nexit 0"
    assert all(PLACEHOLDERS.values())


class _LocalShell:
    """Runs the probe's scripts with this machine's shell in place of the sandbox's."""

    def exec(self, argv: list[str], **_: object) -> ExecResult:
        script = argv[3].replace(f"B={TRUSTED_BUSYBOX}", "B=")
        done = subprocess.run(["sh", "-c", script, *argv[4:]], capture_output=True, check=False)
        return ExecResult(exit_code=done.returncode, stdout_bytes=done.stdout)


def test_it_fills_missing_and_empty_files_and_leaves_the_others(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "empty.txt").parent.mkdir()
    (out / "empty.txt").write_text("")
    (out / "kept.json").write_text('{"kept": true}\n')
    (out / "folder.txt").mkdir()
    task = write_task(
        tmp_path / "tasks",
        "t",
        test_sh="".join(
            f"[ -s {out}/{name} ] || exit 1\n"
            for name in ("new.json", "empty.txt", "kept.json", "folder.txt", "deep/tool")
        ),
    )
    turn = load_task(task).turns[0]
    context = SimpleNamespace(sandbox=_LocalShell(), deadline=Deadline.after(30), agent_user=None)
    created = _create_named(context, turn, "/work")  # type: ignore[arg-type]
    assert created == [f"{out}/deep/tool", f"{out}/empty.txt", f"{out}/new.json"]
    assert (out / "new.json").read_text() == "{}\n"
    assert (out / "empty.txt").read_text() == "placeholder\n"
    assert (out / "deep" / "tool").read_text() == "#!/bin/sh\nexit 0\n"
    assert os.access(out / "deep" / "tool", os.X_OK)
    assert (out / "kept.json").read_text() == '{"kept": true}\n'


def test_a_git_entry_anywhere_in_the_environment_folder_is_found(tmp_path: Path) -> None:
    task = write_task(
        tmp_path,
        "t",
        extra_files={
            "environment/Dockerfile": "FROM debian:bookworm-slim\n",
            "environment/app/plugins/markdown/.git": "gitdir: ../../../.modules/markdown\n",
            "environment/app/a/b/c/d/.git/HEAD": "ref: refs/heads/main\n",
            "environment/app/a/b/c/d/.git/nested/.git": "not reported again\n",
        },
    )
    assert environment_git(task / "environment") == [
        "environment/app/a/b/c/d/.git",
        "environment/app/plugins/markdown/.git",
    ]


def test_ordinary_git_files_in_the_environment_folder_are_not_a_history(tmp_path: Path) -> None:
    task = write_task(
        tmp_path,
        "t",
        extra_files={
            "environment/.gitignore": "*.pyc\n",
            "environment/app/.gitattributes": "* text=auto\n",
            "environment/app/.github/workflows/ci.yml": "on: push\n",
            "environment/app/data/.gitkeep": "",
            "environment/app/git/config": "not a .git\n",
        },
    )
    assert environment_git(task / "environment") == []
    assert environment_git(tmp_path / "no-such-folder") == []


def test_the_answer_is_looked_for_in_the_images_configuration(tmp_path: Path) -> None:
    task = write_task(
        tmp_path,
        "t",
        instruction="Find the vault's key and write it to /tmp/key.\n",
        solve_sh="#!/bin/bash\necho 'ZEBRA-orchard-1187' > /tmp/key\n",
        test_sh='[ "$(cat /tmp/key)" = "ZEBRA-orchard-1187" ] || [ "$X" = "moon over the bay" ]\n',
    )
    turn = load_task(task).turns[0]
    patterns = distinctive_lines(turn, turn.instruction) + quoted_values(turn, turn.instruction)
    leaky = ImageConfig(
        env=("PATH=/usr/bin:/bin", "VAULT_HINT=ZEBRA-orchard-1187"),
        labels={"org.example.note": "the moon over the bay"},
        entrypoint=("/bin/sh", "-c", "echo ZEBRA-orchard-1187 >/dev/null; exec sleep 1d"),
        cmd=("--key", "ZEBRA-orchard-1187"),
        healthcheck=("CMD-SHELL", "test -s /tmp/key || echo ZEBRA-orchard-1187"),
    )
    found = config_matches(leaky, patterns)
    assert [entry["file"] for entry in found] == [
        "the image's ENV VAULT_HINT",
        "the image's LABEL org.example.note",
        "the image's ENTRYPOINT",
        "the image's CMD",
        "the image's HEALTHCHECK",
    ]
    assert found[0]["text"] == "ZEBRA-orchard-1187"
    assert found[1]["text"] == "moon over the bay"


def test_an_ordinary_images_configuration_holds_no_answer(tmp_path: Path) -> None:
    task = write_task(
        tmp_path,
        "t",
        instruction="Write the report to /app/report.txt, then print `all done`.\n",
        solve_sh='#!/bin/bash\necho "all done" > /app/report.txt\n',
        test_sh=(
            '#!/bin/bash\nexport PATH="/usr/local/bin:$PATH"\n'
            'grep -q "all done" "/app/report.txt" && python3 -c "import json"\n'
            "echo 1 > /logs/verifier/reward.txt\n"
        ),
    )
    turn = load_task(task).turns[0]
    patterns = distinctive_lines(turn, turn.instruction) + quoted_values(turn, turn.instruction)
    ordinary = ImageConfig(
        env=(
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG=C.UTF-8",
            "REPORT=/app/report.txt",
            "PYTHONDONTWRITEBYTECODE=1",
        ),
        labels={
            "org.opencontainers.image.title": "report tool",
            # The engine's own labels are not the task's.
            "pytest-harbor.task": 'grep -q "all done" "/app/report.txt" '
            '&& python3 -c "import json"',
        },
        cmd=("bash",),
        healthcheck=("CMD", "python3", "-c", "import json"),
    )
    assert config_matches(ordinary, patterns) == []


def test_short_values_the_tests_compare_with_or_the_solution_writes_are_looked_for(
    tmp_path: Path,
) -> None:
    task = write_task(
        tmp_path,
        "t",
        instruction="Count the errors in /app/log.txt and write the count to /app/count.txt.\n",
        solve_sh="#!/bin/bash\necho 17 > /app/count.txt\nprintf 'Paris' > /app/city.txt\n",
        test_sh=(
            '[ "$(cat /app/count.txt)" = "17" ] && [ "$(cat /app/city.txt)" == Paris ]\n'
            '[ "$n" -eq 3 ] && [ "$x" != "$y" ] && [ "$ok" = 1 ] && [ "$flag" = "true" ]\n'
            'python3 -c "assert len(rows) == 4" && timeout=10 && [ "$p" = /app/count.txt ]\n'
            "# [ x = commented ]\n"
        ),
    )
    turn = load_task(task).turns[0]
    # `1`, `true` too common; `$y` an expansion; `timeout=10` no comparison; a path; a
    # comment; `4)"` is cut where the word ends.
    assert short_values(turn, turn.instruction) == ["17", "3", "4", "Paris"]
    # A value the instruction names is no answer hidden in the image.
    assert "17" not in short_values(turn, "There are 17 errors.")


def test_a_short_value_is_found_whole_in_the_images_env_or_labels_only(tmp_path: Path) -> None:
    config = ImageConfig(
        env=("PATH=/usr/bin", "EXPECTED_COUNT=17", "PORT=1789"),
        labels={"org.example.count": " 17 ", "org.example.build": "build 17"},
        cmd=("sleep", "17"),
    )
    found = config_matches(config, [], exact=["17"])
    assert [entry["file"] for entry in found] == [
        "the image's ENV EXPECTED_COUNT",
        "the image's LABEL org.example.count",
    ]
