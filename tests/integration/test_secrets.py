"""Secrets given to the verifier never leave: not in the terminal, the junit XML or any
file of the run; they come from the environment or a file; their fingerprint is keyed."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest

from tests.fixtures import BASE_IMAGE, Dataset, multi_step, run_harbor

pytestmark = pytest.mark.docker

SECRET = "s3cr3t-Zq9-value"

#: A verifier given a secret, after an agent that is not root (a root agent's processes
#: may outlive its turn in the sandbox the verifier shares: that combination is refused).
KEYED = (
    '[agent]\nuser = "nobody"\n'
    '[verifier]\nenv = { TOKEN = "${API_TOKEN}" }\n'
    f'[environment]\ndocker_image = "{BASE_IMAGE}"\n'
)


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def test_a_failing_verifier_that_prints_its_secret_shows_it_nowhere(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    dataset.task(
        "leaky-verifier",
        toml=KEYED,
        test_sh=(
            'echo "the token is $TOKEN"\n'
            'echo "$TOKEN" > /logs/verifier/token.txt\n'
            'echo "{\\"reward\\": 0, \\"note\\": \\"$TOKEN\\"}" > /logs/verifier/reward.json\n'
            'echo "oops $TOKEN" >&2\n'
        ),
    )
    junit = pytester.path / "junit.xml"
    result = run_harbor(
        pytester,
        dataset,
        "--harbor-set=secrets.API_TOKEN=env:MY_API_TOKEN",
        f"--junitxml={junit}",
        "-rA",
    )
    result.assert_outcomes(failed=1)
    shown = result.stdout.str() + result.stderr.str()
    assert "the token is ***" in shown  # the failure report did show test-stdout.txt
    assert SECRET not in shown
    assert SECRET not in junit.read_text()
    written = [path for path in (pytester.path / "out").rglob("*") if path.is_file()]
    assert any(path.name == "token.txt" for path in written)
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path
    # A literal secret was not given, so no warning about one.
    assert "a secret on the command line" not in shown


def test_secrets_from_a_file_reach_the_verifier(
    pytester: pytest.Pytester, dataset: Dataset, tmp_path: Path
) -> None:
    secret_file = tmp_path / "token"
    secret_file.write_text(f"{SECRET}\n")
    dataset.task(
        "from-file",
        toml=KEYED,
        test_sh=f'[ "$TOKEN" = {SECRET} ] && echo 1 > /logs/verifier/reward.txt\n',
    )
    result = run_harbor(pytester, dataset, f"--harbor-set=secrets.API_TOKEN=file:{secret_file}")
    result.assert_outcomes(passed=1)


def test_a_literal_secret_on_the_command_line_is_warned_about(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "literal",
        toml=KEYED,
        test_sh=f'[ "$TOKEN" = {SECRET} ] && echo 1 > /logs/verifier/reward.txt\n',
    )
    result = run_harbor(pytester, dataset, f"--harbor-set=secrets.API_TOKEN={SECRET}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*--harbor-set secrets.API_TOKEN: a secret on the command line can be read by other*"]
    )
    assert SECRET not in result.stdout.str()


def test_an_unset_secret_variable_is_a_usage_error(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NOT_THERE", raising=False)
    dataset.task("any")
    result = run_harbor(pytester, dataset, "--harbor-set=secrets.API_TOKEN=env:NOT_THERE")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*setting secrets.API_TOKEN (from --harbor-set secrets.API_TOKEN=env:NOT_THERE): "
            "the variable NOT_THERE is not set*"
        ]
    )


def test_the_secrets_fingerprint_is_keyed_by_the_results_folder(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    dataset.task("keyed", toml=KEYED, test_sh="echo 1 > /logs/verifier/reward.txt\n")
    given = "--harbor-set=secrets.API_TOKEN=env:MY_API_TOKEN"
    run_harbor(pytester, dataset, given).assert_outcomes(passed=1)
    folder = dataset.results_folder(pytester.path / "out")
    manifest = json.loads((folder / "rollouts_manifest.json").read_text())
    plain = hashlib.sha256(f"API_TOKEN\0{SECRET}\n".encode()).hexdigest()
    assert manifest["secrets_fingerprint"] != plain  # no guessing at it without the key
    key_file = folder.parent / ".secrets_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    summary = dataset.summary(pytester.path / "out")
    assert ".secrets_key" not in summary["all_files"]
    # The same secret resumes; another is refused.
    run_harbor(pytester, dataset, given, "--harbor-resume").assert_outcomes()
    monkeypatch.setenv("MY_API_TOKEN", "another-value")
    refused = run_harbor(pytester, dataset, given, "--harbor-resume")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*setting secrets: the names or values differ*"])


ROOT_AGENT_KEYED = KEYED.replace('[agent]\nuser = "nobody"\n', "")
#: An agent under evaluation that does what the task's solve.sh says, as the agent's user:
#: the task's code, but run as an agent is (the oracle and `nop` are not refused).
SOLVE_AS_AGENT = """
from pytest_harbor.harnesses.base import AgentRun, Harness


class _Session:
    def run_turn(self, context):
        script = (context.turn.solution_dir / "solve.sh").read_text()
        ran = context.sandbox.exec(
            ["bash", "-c", script], user=context.agent_user, workdir=context.workdir,
            timeout=context.deadline.remaining(),
        )
        return AgentRun(exit_code=ran.exit_code)

    def close(self, context):
        pass


class SolveAsAgent(Harness):
    name = "solve-as-agent"

    def __init__(self, options=None):
        pass

    def open_session(self, context):
        return _Session()


def pytest_harbor_harnesses():
    return {"solve-as-agent": SolveAsAgent}
"""
AS_AGENT = "--harbor-agent=solve-as-agent"


def as_agent(pytester: pytest.Pytester) -> str:
    pytester.makeconftest(SOLVE_AS_AGENT)
    return AS_AGENT


#: A root agent's process left behind that copies every environment it can read.
ENVIRONMENT_THIEF = (
    "cat > /tmp/steal.sh <<'EOF'\n"
    "while :; do cat /proc/[0-9]*/environ >> /tmp/stolen 2>/dev/null; sleep 0.05; done\n"
    "EOF\n"
    "setsid sh /tmp/steal.sh > /dev/null 2>&1 < /dev/null &\n"
)


def test_a_secret_is_not_handed_to_a_verifier_beside_a_root_agent(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root agent's processes outlive its turn in the sandbox the verifier shares: the
    episode is refused, naming the settings that would make it safe, and the verifier
    never runs there."""
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    dataset.task(
        "root-thief",
        toml=ROOT_AGENT_KEYED,
        solve_sh=ENVIRONMENT_THIEF,
        test_sh='echo "$TOKEN" > /tmp/handed; echo 1 > /logs/verifier/reward.txt\n',
    )
    result = run_harbor(
        pytester, dataset, as_agent(pytester), "--harbor-set=secrets.API_TOKEN=env:MY_API_TOKEN"
    )
    result.assert_outcomes(errors=1)
    (failure,) = dataset.failures(pytester.path / "out", validation=False)
    assert failure["failure_kind"] == "harbor:task_refused"
    reason = str(failure["failure_reason"])
    assert "API_TOKEN" in reason and "[verifier.environment]" in reason
    assert "[agent] user" in reason
    assert SECRET not in result.stdout.str()


def test_the_oracle_and_nop_run_beside_a_secret_as_any_verification_does(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """solve.sh is the task's own code, as trusted as the test.sh that gets the secret,
    and `nop` is the engine's: a task author's oracle check of an LLM-judge task runs,
    its secret masked everywhere, under a root agent as under any other."""
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    dataset.task(
        "judged",
        toml=ROOT_AGENT_KEYED,
        solve_sh="echo 42 > /tmp/answer\n",
        test_sh=(
            f'echo "judge with $TOKEN"\n'
            f'if [ "$TOKEN" = {SECRET} ] && [ -s /tmp/answer ]; then\n'
            "  echo 1 > /logs/verifier/reward.txt\n"
            "else echo 0 > /logs/verifier/reward.txt; fi\n"
        ),
    )
    given = "--harbor-set=secrets.API_TOKEN=env:MY_API_TOKEN"
    oracle = run_harbor(pytester, dataset, given, "-rA")
    oracle.assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out")
    assert row["reward"] == 1.0
    assert SECRET not in oracle.stdout.str() + oracle.stderr.str()
    written = [path for path in (pytester.path / "out").rglob("*") if path.is_file()]
    assert written and not any(SECRET.encode() in path.read_bytes() for path in written)
    nop = run_harbor(pytester, dataset, given, "--harbor-agent=nop")
    assert dataset.failures(pytester.path / "out", validation=False) == [], nop.stdout.str()
    (row,) = dataset.rows(pytester.path / "out", validation=False)
    assert row["reward"] == 0.0


#: A root agent's wrapper over the image's bash, which the verifier runs test.sh with:
#: it copies the environment where the agent's files go, then runs the real bash.
BASH_WRAPPER = (
    "cp /usr/bin/bash /usr/bin/bash.real\n"
    "cat > /tmp/bash <<'EOF'\n"
    "#!/usr/bin/bash.real\n"
    "env >> /logs/verifier/exfil.txt; env >> /tmp/stolen\n"
    'exec /usr/bin/bash.real "$@"\n'
    "EOF\n"
    "chmod 755 /tmp/bash && mv /tmp/bash /usr/bin/bash\n"
)


def test_a_root_agent_verified_from_a_snapshot_gets_no_secret(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot carries none of the agent's processes but all of its files: a root agent
    that put a wrapper over bash would have test.sh's environment. Refused, as beside a
    root agent in its own sandbox."""
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    dataset.task(
        "root-snapshot",
        toml=ROOT_AGENT_KEYED,
        solve_sh=BASH_WRAPPER,
        test_sh="echo 1 > /logs/verifier/reward.txt\n",
    )
    result = run_harbor(
        pytester,
        dataset,
        as_agent(pytester),
        "--harbor-set=secrets.API_TOKEN=env:MY_API_TOKEN",
        "--harbor-set=verify_from_snapshot=true",
    )
    result.assert_outcomes(errors=1)
    (failure,) = dataset.failures(pytester.path / "out", validation=False)
    assert failure["failure_kind"] == "harbor:task_refused"
    reason = str(failure["failure_reason"])
    assert "snapshot" in reason and "[verifier.environment]" in reason
    assert not list((pytester.path / "out").rglob("exfil.txt"))


def test_a_root_agent_verified_in_a_separate_sandbox_gets_its_secret_verified(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verifier's own sandbox holds none of the agent's processes or programs: the
    thief and the bash wrapper are left behind, and the verifier has its secret."""
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    dataset.task(
        "root-separate",
        toml=ROOT_AGENT_KEYED + f'[verifier.environment]\ndocker_image = "{BASE_IMAGE}"\n',
        solve_sh=ENVIRONMENT_THIEF + BASH_WRAPPER + "sleep 0.2\n",
        test_sh=(
            f'if [ "$TOKEN" = {SECRET} ] && [ ! -e /usr/bin/bash.real ]; then\n'
            "  echo 1 > /logs/verifier/reward.txt\n"
            "fi\n"
        ),
    )
    result = run_harbor(pytester, dataset, "--harbor-set=secrets.API_TOKEN=env:MY_API_TOKEN")
    result.assert_outcomes(passed=1)
    assert not list((pytester.path / "out").rglob("exfil.txt"))


def test_a_root_agent_of_an_earlier_step_refuses_a_later_steps_secret(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root agent's processes outlive its step into the next: a later step's verifier
    given a secret is refused though that step's agent is not root."""
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    passing = "echo 1 > /logs/verifier/reward.txt\n"
    multi_step(
        dataset,
        "root-first",
        {"one": (ENVIRONMENT_THIEF, passing), "two": ("true\n", passing)},
        step_toml={
            "two": (
                '[steps.agent]\nuser = "nobody"\n'
                '[steps.verifier]\nenv = { TOKEN = "${API_TOKEN}" }\n'
            )
        },
    )
    result = run_harbor(
        pytester, dataset, as_agent(pytester), "--harbor-set=secrets.API_TOKEN=env:MY_API_TOKEN"
    )
    assert result.parseoutcomes().get("passed", 0) == 0
    (failure,) = dataset.failures(pytester.path / "out", validation=False)
    assert failure["failure_kind"] == "harbor:task_refused"
    assert "step 'two'" in str(failure["failure_reason"])
    assert "step 'one'" in str(failure["failure_reason"])


def test_a_verifier_that_names_files_after_its_secret_names_none_under_the_results(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    dataset.task(
        "named-leak",
        toml=KEYED,
        test_sh=(
            "cd /logs/verifier\n"
            'echo "file" > "$TOKEN.txt"\n'
            'mkdir "$TOKEN" && echo "inside" > "$TOKEN/inner.txt"\n'
            # Already there under the name the masked one takes: neither is lost.
            "echo 'plain' > '***.txt'\n"
            # The secret cut by a folder: each piece is 8 characters.
            'mkdir "${TOKEN:0:8}" && echo "split" > "${TOKEN:0:8}/${TOKEN:8}"\n'
            "echo 1 > reward.txt\n"
        ),
    )
    result = run_harbor(pytester, dataset, "--harbor-set=secrets.API_TOKEN=env:MY_API_TOKEN", "-rA")
    result.assert_outcomes(passed=1)
    out = pytester.path / "out"
    for path in out.rglob("*"):
        relative = str(path.relative_to(out))
        assert SECRET not in relative
        assert SECRET[:8] not in relative and SECRET[8:] not in relative, relative
    folder = dataset.results_folder(out) / "verifier" / "named-leak__r0"
    found = {
        str(path.relative_to(folder)): path.read_text().strip()
        for path in folder.rglob("*")
        if path.is_file() and path.name not in ("trajectory.json", "reward.txt")
    }
    # Which of two names that mask alike keeps it depends on the order the copy reads them.
    assert sorted(found) in (
        ["***.txt", "***/inner.txt", "***~2.txt", "***~2/***", "test-stdout.txt"],
        ["***.txt", "***/***", "***~2.txt", "***~2/inner.txt", "test-stdout.txt"],
    )
    assert {found["***.txt"], found["***~2.txt"]} == {"file", "plain"}
    assert sorted(found.values()) == ["", "file", "inside", "plain", "split"]


def test_what_a_verification_leaves_running_does_not_reach_the_next_step(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step one's verifier (as `nobody`, given the secret) leaves a process running,
    which holds its environment; step two's agent, also `nobody`, reads every environment
    it may. The verification's processes end with it: the agent finds nothing."""
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    look = (
        "for e in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$e\" 2>/dev/null; done"
        " | grep -c '^TOKEN=' > /tmp/found\n"
    )
    multi_step(
        dataset,
        "leftover",
        {
            "one": ("true\n", "sleep 300 &\necho 1 > /logs/verifier/reward.txt\n"),
            "two": (look, '[ "$(cat /tmp/found)" = 0 ] && echo 1 > /logs/verifier/reward.txt\n'),
        },
        toml='[agent]\nuser = "nobody"\n[verifier]\nuser = "nobody"\n',
        step_toml={"one": '[steps.verifier]\nenv = { TOKEN = "${API_TOKEN}" }\n'},
    )
    run_harbor(pytester, dataset, "--harbor-set=secrets.API_TOKEN=env:MY_API_TOKEN")
    (row,) = dataset.rows(pytester.path / "out")
    assert [turn["reward"] for turn in row["turns"]] == [1.0, 1.0]  # type: ignore[index]
