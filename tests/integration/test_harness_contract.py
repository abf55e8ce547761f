"""The harness contract on the real engine, with harnesses a conftest.py registers through
the `pytest_harbor_harnesses` hook: sessions and their calls, the agent deadline enforced
whatever the harness does, crashes, and `agent_outcome_policy`."""

from __future__ import annotations

import json
import signal
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.fixtures import (
    BASE_IMAGE,
    Dataset,
    containers_of,
    finish,
    multi_step,
    run_harbor,
    start_run,
)

pytestmark = pytest.mark.docker

#: Harnesses for these tests. Each writes what it was asked into the file the option
#: `journal` names, one JSON line per call.
HARNESSES = '''
import json, threading, time
from pathlib import Path

from pytest_harbor.harnesses import AgentFailure, AgentRun, Harness, Usage


class Journal:
    def __init__(self, options):
        self.path = Path(options.get("journal", "/dev/null"))
        self.options = options

    def note(self, **entry):
        with self.path.open("a") as handle:
            handle.write(json.dumps(entry) + "\\n")


class Scripted(Harness):
    """Does what its options say: `do` per step (a command), `then` (sleep, raise, hang,
    late, fail:<cause>)."""

    can_continue = True

    def __init__(self, options):
        self.journal = Journal(options)
        self.options = options
        self.name = options.get("name", "scripted")
        self.open_sleep = float(options.get("open_sleep", 0))

    def open_session(self, context):
        self.journal.note(call="open", episode=context.episode_id, user=context.agent_user,
                          host_dir=str(context.logs.host_dir), model=context.model)
        time.sleep(self.open_sleep)
        return Session(self)


class Session:
    def __init__(self, harness):
        self.harness = harness
        self.turns = 0

    def run_turn(self, context):
        self.turns += 1
        options = self.harness.options
        self.harness.journal.note(
            call="turn", step=context.step, index=context.index, instruction=context.instruction,
            turns_in_session=self.turns, remaining=round(context.deadline.remaining()),
            workdir=context.workdir, sandbox_dir=context.logs.sandbox_dir,
        )
        (context.logs.host_dir / "harness.log").write_text(f"turn {context.step}\\n")
        command = options.get("do", "echo 1 > /tmp/answer")
        context.sandbox.exec(["bash", "-c", command], user=context.agent_user,
                             workdir=context.workdir)
        then = options.get("then", "")
        if then == "raise":
            raise RuntimeError("the harness fell over")
        if then == "hang":  # ignores cancel, never returns in time
            time.sleep(600)
        if then == "late":  # ignores cancel, then tries to change the sandbox
            time.sleep(context.deadline.remaining() + 1)
            try:
                context.sandbox.exec(["touch", "/tmp/late"])
            except Exception as error:
                self.harness.journal.note(call="late", refused=str(error))
            return AgentRun(response="too late")
        if then == "long-exec":  # a command longer than the turn: cut at the deadline
            context.sandbox.exec(["bash", "-c", "sleep 300; touch /tmp/slept"])
            return AgentRun(response="slept")
        if then.startswith("fail:") and options.get("fail_step", context.step) == context.step:
            cause = then.split(":", 1)[1]
            marker = Path(options["journal"]).with_suffix(".attempts")
            attempts = int(marker.read_text()) if marker.exists() else 0
            marker.write_text(str(attempts + 1))
            if attempts < int(options.get("fail_times", 99)):
                context.sandbox.exec(["touch", "/tmp/failed-attempt"])
                return AgentRun(failure=AgentFailure(cause, f"{cause} on attempt {attempts + 1}",
                                                     status_code=429),
                                usage=Usage(prompt_tokens=7, requests=1))
        return AgentRun(exit_code=0, response=f"did {context.step}")

    def close(self, context):
        self.harness.journal.note(call="close", turns=self.turns)


def pytest_harbor_harnesses():
    return {"scripted": Scripted}
'''


@pytest.fixture
def dataset(harbor_dataset: Dataset, pytester: pytest.Pytester) -> Dataset:
    pytester.makeconftest(HARNESSES)
    return harbor_dataset


def journal(pytester: pytest.Pytester) -> list[dict[str, object]]:
    path = pytester.path / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def scripted(
    pytester: pytest.Pytester, dataset: Dataset, *args: str, **options: str
) -> pytest.RunResult:
    given = {"journal": str(pytester.path / "journal.jsonl"), **options}
    return run_harbor(
        pytester,
        dataset,
        "--harbor-agent=scripted",
        *(f"--harbor-agent-option={key}={value}" for key, value in given.items()),
        *args,
    )


ANSWER_OR_ZERO = (
    "if [ -e /tmp/answer ]; then cat /tmp/answer; else echo 0; fi > /logs/verifier/reward.txt\n"
)


def toml(agent: float = 30, extra: str = "") -> str:
    return textwrap.dedent(
        f"""\
        [agent]
        timeout_sec = {agent}
        [verifier]
        timeout_sec = 30
        [environment]
        docker_image = "{BASE_IMAGE}"
        {extra}"""
    )


def test_a_registered_harness_runs_one_session_per_episode(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("hello", toml=toml(extra='workdir = "/work"'))
    result = scripted(pytester, dataset, "-rA")
    result.assert_outcomes(passed=1)
    calls = journal(pytester)
    assert [call["call"] for call in calls] == ["open", "turn", "close"]
    opened, turn, closed = calls
    assert opened["episode"] == "hello__r0"
    assert opened["model"] is None
    assert (turn["step"], turn["index"], turn["workdir"]) == ("episode", 0, "/work")
    assert turn["instruction"] == "Write 1 to /tmp/answer.\n"
    assert turn["sandbox_dir"] == "/logs/agent"
    assert 25 <= turn["remaining"] <= 30  # the agent's budget, not the episode's
    assert closed["turns"] == 1
    (row,) = dataset.rows(pytester.path / "out", validation=False)
    assert (row["agent"], row["reward"], row["response"]) == ("scripted", 1.0, "did episode")
    # The harness's host folder is a staging folder while the episode runs, kept with the
    # results once its row is written.
    staged = Path(str(opened["host_dir"]))
    assert ".incoming" in staged.parts and staged.name == "hello__r0"
    host_log = pytester.path / "out/harbor" / dataset.name / "latest/agent/hello__r0/harness.log"
    assert host_log.read_text() == "turn episode\n"
    assert not staged.exists()
    # Without a trajectory of its own, the verifier gets the engine's two-step transcript.
    trajectory = json.loads((Path(row["verifier_logs_dir"]) / "trajectory.json").read_text())
    assert [step["message"] for step in trajectory["steps"]][1] == "did episode"


def test_fresh_and_continued_sessions_across_steps(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    multi_step(dataset, "two", {"01-a": ("true", None), "02-b": ("true", None)})
    scripted(pytester, dataset).assert_outcomes(passed=2)
    fresh = [call["call"] for call in journal(pytester)]
    assert fresh == ["open", "turn", "close", "open", "turn", "close"]

    (pytester.path / "journal.jsonl").unlink()
    scripted(pytester, dataset, "--harbor-set=turn_sessions=continue").assert_outcomes(passed=2)
    calls = journal(pytester)
    assert [call["call"] for call in calls] == ["open", "turn", "turn", "close"]
    assert [call.get("turns_in_session") for call in calls if call["call"] == "turn"] == [1, 2]
    assert [call.get("index") for call in calls if call["call"] == "turn"] == [0, 1]


def test_a_harness_that_never_returns_is_cut_off_and_the_verifier_still_runs(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("stuck", toml=toml(agent=2))
    result = scripted(pytester, dataset, then="hang")
    result.assert_outcomes(passed=1)  # it wrote the answer before it hung
    (row,) = dataset.rows(pytester.path / "out", validation=False)
    assert (row["reward"], row["failure_kind"], row["failure_cause"]) == (
        1.0,
        "agent_timeout",
        "timeout",
    )
    assert "did not finish within its budget of 2 s" in row["failure_reason"]
    # Cut at 2 s, left behind after its grace: far from its 600 s sleep.
    assert row["timings"]["agent_s"] < 20
    # The session is closed all the same.
    assert [call["call"] for call in journal(pytester)][-1] == "close"


def test_a_harness_cannot_touch_the_sandbox_after_its_deadline(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "late",
        toml=toml(agent=2),
        test_sh="if [ -e /tmp/late ]; then echo 0; else echo 1; fi > /logs/verifier/reward.txt\n",
    )
    scripted(pytester, dataset, then="late").assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out", validation=False)
    assert (row["reward"], row["failure_kind"]) == (1.0, "agent_timeout")
    (late,) = [call for call in journal(pytester) if call["call"] == "late"]
    assert "closed to it" in str(late["refused"])


def test_a_command_longer_than_the_turn_is_killed_at_the_deadline(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "long",
        toml=toml(agent=2),
        test_sh=(
            "sleep 1; if pgrep -x sleep >/dev/null || [ -e /tmp/slept ]; then echo 0; "
            "else echo 1; fi > /logs/verifier/reward.txt\n"
        ),
    )
    scripted(pytester, dataset, then="long-exec").assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out", validation=False)
    assert row["failure_kind"] == "agent_timeout"
    assert row["timings"]["agent_s"] < 20


def test_a_harness_that_raises_is_a_crash_that_is_verified(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("crash")
    result = scripted(pytester, dataset, then="raise")
    result.assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out", validation=False)
    assert (row["failure_kind"], row["failure_cause"]) == ("agent_crashed", "agent_crashed")
    assert "RuntimeError" in row["failure_reason"]
    assert "the harness fell over" in row["failure_reason"]
    assert [call["call"] for call in journal(pytester)][-1] == "close"


def test_a_set_up_past_its_allowance_is_a_timeout(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("slow-start", test_sh=ANSWER_OR_ZERO)
    result = scripted(pytester, dataset, "--harbor-set=harness_setup_allowance_s=1", open_sleep="4")
    result.assert_outcomes(failed=1)  # no turn ran: nothing wrote the answer
    (row,) = dataset.rows(pytester.path / "out", validation=False)
    assert (row["failure_kind"], row["reward"]) == ("agent_timeout", 0.0)
    assert "did not set up within 1 s" in row["failure_reason"]
    assert [call["call"] for call in journal(pytester)] == ["open", "close"]


def test_policy_fail_leaves_no_result_and_resume_retries_it(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("limited")
    result = scripted(
        pytester,
        dataset,
        "--harbor-set=agent_outcome_policy.rate_limited=fail",
        then="fail:rate_limited",
    )
    result.assert_outcomes(errors=1)
    assert dataset.rows(pytester.path / "out", validation=False) == []
    (failure,) = dataset.failures(pytester.path / "out", validation=False)
    assert (failure["failure_kind"], failure["retry"], failure["stage"]) == (
        "agent_rate_limited",
        True,
        "turn",
    )
    assert failure["failure_reason"] == "rate_limited on attempt 1"


def test_policy_retry_runs_the_episode_again_in_a_fresh_sandbox(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "flaky-endpoint",
        # A sandbox the failed attempt touched scores 0.
        test_sh=(
            "if [ -e /tmp/failed-attempt ]; then echo 0; else cat /tmp/answer; fi"
            " > /logs/verifier/reward.txt\n"
        ),
    )
    result = scripted(
        pytester,
        dataset,
        "--harbor-set=agent_outcome_policy.api_error={action: retry, retries: 2, backoff_s: 0.1}",
        then="fail:api_error",
        fail_times="2",
    )
    result.assert_outcomes(passed=1)
    (row,) = dataset.rows(pytester.path / "out", validation=False)
    assert (row["reward"], row["attempts"], row["failure_kind"]) == (1.0, 3, None)
    # What the two attempts given up cost still counts, apart from the kept one's.
    assert row["usage"] is None
    assert row["retried_usage"] == {
        "prompt_tokens": 14,
        "completion_tokens": 0,
        "requests": 2,
        "cost_usd": None,
    }
    opened = [call for call in journal(pytester) if call["call"] in ("open", "close")]
    assert [call["call"] for call in opened] == ["open", "close"] * 3


def test_policy_retry_gives_up_after_its_retries(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("down")
    result = scripted(
        pytester,
        dataset,
        "--harbor-set=agent_outcome_policy.api_error={action: retry, retries: 1, backoff_s: 0}",
        then="fail:api_error",
    )
    result.assert_outcomes(errors=1)
    (failure,) = dataset.failures(pytester.path / "out", validation=False)
    assert failure["failure_kind"] == "agent_api_error"
    assert (
        failure["failure_reason"]
        == "api_error on attempt 2 (still after 1 retry in a fresh sandbox)"
    )


def test_a_retry_in_a_later_turn_leaves_the_episode_without_a_result(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    multi_step(dataset, "two", {"01-a": ("true", None), "02-b": ("true", None)})
    result = scripted(
        pytester,
        dataset,
        "--harbor-set=agent_outcome_policy.rate_limited={action: retry, backoff_s: 0}",
        then="fail:rate_limited",
        fail_step="02-b",
    )
    result.assert_outcomes(passed=1, errors=1)
    assert dataset.rows(pytester.path / "out", validation=False) == []
    (failure,) = dataset.failures(pytester.path / "out", validation=False)
    assert (failure["step"], failure["failure_kind"], failure["retry"]) == (
        "02-b",
        "agent_rate_limited",
        True,
    )
    assert "a retry would run the earlier turns again" in failure["failure_reason"]
    # One attempt only: the first turn's work is not thrown away and redone.
    assert [call["call"] for call in journal(pytester)].count("open") == 2


def test_an_interrupt_cancels_the_turn_and_closes_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker_client: object
) -> None:
    """Ctrl-C while a harness works: its cancel signal is set, its session closed, its
    sandbox removed, and the episode recorded as interrupted."""
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    (plugin_dir / "patient_harness.py").write_text(
        HARNESSES
        + textwrap.dedent(
            """
            class Patient(Scripted):
                def open_session(self, context):
                    self.journal.note(call="open")
                    return PatientSession(self)


            class PatientSession(Session):
                def run_turn(self, context):
                    self.harness.journal.note(call="turn")
                    cancelled = context.cancel.wait(600)
                    self.harness.journal.note(call="woke", cancelled=cancelled)
                    return AgentRun()


            def pytest_harbor_harnesses():
                return {"patient": Patient}
            """
        )
    )
    monkeypatch.setenv("PYTHONPATH", str(plugin_dir))
    dataset = Dataset(tmp_path / f"ds-{uuid.uuid4().hex[:8]}")
    dataset.path.mkdir()
    dataset.task("waiting")
    journal_file = tmp_path / "journal.jsonl"
    run = start_run(
        dataset,
        "-p",
        "patient_harness",
        "--harbor-agent=patient",
        f"--harbor-agent-option=journal={journal_file}",
    )
    deadline = time.monotonic() + 120
    while '"turn"' not in (journal_file.read_text() if journal_file.exists() else ""):
        assert run.poll() is None and time.monotonic() < deadline, "the turn never started"
        time.sleep(0.1)
    run.send_signal(signal.SIGINT)
    output = finish(run)
    calls = [json.loads(line) for line in journal_file.read_text().splitlines()]
    assert [call["call"] for call in calls] == ["open", "turn", "woke", "close"], output
    assert calls[2]["cancelled"] is True
    assert containers_of(docker_client, dataset.name, "waiting") == []  # type: ignore[arg-type]
    (failure,) = dataset.failures(tmp_path / "results", validation=False)
    assert failure["failure_kind"] == "harbor:interrupted"
