"""Every parser of bytes from a sandbox is total: whatever it is given (random bytes, JSON
nested thousands deep, numbers no float holds, odd Unicode) it returns a value or a
failure it was made to give, never another exception."""

from __future__ import annotations

import functools
import io
import json
import math
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_harbor import strict_json
from pytest_harbor.engine import FailureKind, read_reward
from pytest_harbor.harnesses.base import Usage
from pytest_harbor.harnesses.chat import ChatClient, ChatError, RetryPolicy, UsageMeter
from pytest_harbor.harnesses.converters import BUILT_IN_CONVERTERS, ConverterInput, convert
from pytest_harbor.harnesses.harbor_agents.harness import _trajectory
from pytest_harbor.harnesses.model import ModelConfig, endpoint_words
from pytest_harbor.harnesses.model_request import _not_an_answer
from pytest_harbor.harnesses.shell_agent import _arguments
from pytest_harbor.redaction import Redactor
from pytest_harbor.report import load_taskset, render_report
from pytest_harbor.report.transcripts import Budget, transcript_html
from pytest_harbor.run.durations import read_history
from pytest_harbor.sandboxes.archives import unpack_files
from pytest_harbor.sandboxes.copies import CopyLimits, RepackedArtifact, bounded
from pytest_harbor.untrusted import MAX_DEPTH, load_json
from pytest_harbor.writers.resume import ResumePoint, _json_lines
from tests.unit.hostile import DEEP, DEEP_TEXTS, deep, json_texts, payloads
from tests.unit.test_report import row, write_results

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")

fast = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fast
@given(payloads())
def test_load_json_returns_a_value_or_a_reason(data: bytes) -> None:
    parsed = load_json(data)
    assert (parsed.error is None) or (parsed.value is None and parsed.error)
    if parsed.error is None:
        json.dumps(parsed.value, allow_nan=True).encode("utf-8")  # writable as it is


@fast
@given(json_texts())
def test_load_json_of_text_agrees_with_json_where_json_can(text: str) -> None:
    parsed = load_json(text, constants="null")
    try:
        expected = json.loads(text.removeprefix("\ufeff"), parse_constant=lambda _: None)
    except (ValueError, RecursionError):
        return
    if parsed.error is None and "\\ud" not in text.lower() and "\\ue" not in text.lower():
        assert json.dumps(parsed.value, sort_keys=True) == json.dumps(expected, sort_keys=True)


@pytest.mark.parametrize("text", DEEP_TEXTS[:5])
def test_deep_json_is_refused_before_it_is_parsed(text: str) -> None:
    parsed = load_json(text)
    assert parsed.value is None
    assert parsed.error == f"nests arrays or objects deeper than {MAX_DEPTH} levels"


def test_brackets_in_strings_are_not_nesting() -> None:
    text = json.dumps({"command": "[" * DEEP + '\\"]' + "{" * DEEP})
    assert load_json(text).value == json.loads(text)
    assert load_json(deep(MAX_DEPTH)).error is None


@fast
@given(
    st.recursive(st.just(1), lambda items: st.lists(items, min_size=1, max_size=3), max_leaves=40)
)
def test_the_depth_limit_is_exact_for_json(value: object) -> None:
    """Nested around the limit: refused exactly when deeper than it."""

    def depth(item: object) -> int:
        return 1 + max(map(depth, item)) if isinstance(item, list) else 0

    wrapped = value
    for _ in range(MAX_DEPTH - 5):
        wrapped = [wrapped]
    parsed = load_json(json.dumps(wrapped))
    assert (parsed.error is None) == (depth(wrapped) <= MAX_DEPTH)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1" * 5_000, math.inf),
        ("-" + "1" * 5_000, -math.inf),
        ("1e400", math.inf),
        ('"\\ud800x"', "\ufffdx"),
        ('{"\\udfff": 1}', {"\ufffd": 1}),
        ('"\\ud83d\\ude00"', "\U0001f600"),
        ("\ufeff[1]", [1]),
    ],
)
def test_odd_values_read_as_values(text: str, value: Any) -> None:
    assert load_json(text) == (value, None)


def test_constants_and_limits() -> None:
    assert math.isnan(load_json("[NaN]").value[0])
    assert load_json("[NaN, -Infinity]", constants="null").value == [None, None]
    assert load_json("[[1]]", max_depth=1).error == "nests arrays or objects deeper than 1 levels"
    assert load_json(b'\xef\xbb\xbf{"a": "\xff"}').value == {"a": "\ufffd"}
    assert (load_json(b"").error or "").startswith("is not valid JSON")


@fast
@given(payloads(), st.sampled_from(["reward.json", "reward.txt"]))
def test_read_reward_gives_a_reading(data: bytes, name: str) -> None:
    reading = read_reward({name: data})
    if reading.failure_kind is not None:
        assert reading.failure_kind == FailureKind.REWARD_INVALID
        assert reading.reward == 0.0 and not reading.masked
    assert math.isfinite(reading.reward)
    assert all(math.isfinite(value) for value in (reading.rewards or {}).values())


def test_a_reward_json_nested_3000_deep_is_invalid_with_a_reason() -> None:
    data = ('{"reward": ' + deep() + "}").encode()
    assert len(data) < 7_000
    reading = read_reward({"reward.json": data})
    assert reading.failure_kind == FailureKind.REWARD_INVALID
    assert reading.failure_reason == (
        f"reward.json nests arrays or objects deeper than {MAX_DEPTH} levels"
    )


@fast
@given(payloads())
def test_a_trajectory_renders_whatever_it_holds(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trajectory.json"
        path.write_bytes(data)
        assert isinstance(transcript_html(path, "t.json", Budget()), str)


@fast
@given(payloads())
def test_a_harbor_agents_trajectory_is_read_or_none(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "trajectory.json").write_bytes(data)
        _trajectory(Path(folder))


@fast
@given(payloads(), st.sampled_from(sorted(BUILT_IN_CONVERTERS)))
def test_converters_give_a_trajectory_or_a_note(data: bytes, name: str) -> None:
    text = data.decode("utf-8", errors="replace")
    source = ConverterInput(
        files={"log.json": data, "out.jsonl": data},
        stdout=text + "\n" + "\n".join(f"{{{line}" for line in text.splitlines()),
        agent="a",
        version="1",
        model="m",
        session_id="s",
        instruction="do it",
    )
    trajectory, note = convert(name, source)
    assert (trajectory is None) != (note is None)


@fast
@given(json_texts())
def test_shell_agent_tool_arguments_are_read_or_refused(text: str) -> None:
    arguments, problem = _arguments("bash", text)
    assert isinstance(arguments, dict)
    assert problem is None or isinstance(problem, str)


MODEL = ModelConfig(name="m", base_url="http://localhost/v1")


@functools.cache
def _client() -> ChatClient:
    return ChatClient(MODEL, retry=RetryPolicy(), request_timeout_s=5, redactor=Redactor([]))


@fast
@given(payloads(), st.sampled_from([200, 400, 429, 500]))
def test_a_model_endpoint_body_is_a_reply_or_a_classified_error(data: bytes, status: int) -> None:
    response = httpx.Response(status, content=data)
    try:
        _client()._read(response, UsageMeter())
    except ChatError:
        pass
    except Exception as error:  # the retryable kind is private
        assert type(error).__name__ == "_Retryable"
    assert isinstance(endpoint_words(data, MODEL), str)
    assert isinstance(endpoint_words(data, MODEL, error_only=False), str)
    for api in ("chat-completions", "responses", "anthropic-messages"):
        problem = _not_an_answer(api, data)
        assert problem is None or isinstance(problem, str)


@fast
@given(st.lists(payloads(), max_size=4))
def test_resume_rows_are_read_or_counted_as_dropped(lines: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rollouts.jsonl"
        path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines))
        point = ResumePoint("ts", None)
        assert all(isinstance(data, dict) for data in _json_lines(path, point))


@fast
@given(payloads())
def test_the_durations_record_is_read_or_empty(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "durations.json").write_bytes(data)
        assert isinstance(read_history(Path(folder)), dict)


@settings(fast, max_examples=100)
@given(  # a file name holds any byte but NUL (and `/` between folders)
    st.lists(st.binary(min_size=1, max_size=120).filter(lambda raw: b"\0" not in raw), max_size=5)
)
def test_archive_member_names_never_leave_the_folder(names: list[bytes]) -> None:
    """Unpacked, no name leaves the folder; re-packed, every name passes on as it was."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for raw in names:
            info = tarfile.TarInfo(raw.decode("utf-8", "surrogateescape"))
            info.size = 1
            archive.addfile(info, io.BytesIO(b"x"))
    files = unpack_files(buffer.getvalue(), strip_components=0)
    for name in files:
        assert not name.startswith("/") and ".." not in name.split("/")
    data = buffer.getvalue()
    limits = CopyLimits(read_bytes=10**9, seconds=30.0, entries=1000)
    passed = b"".join(RepackedArtifact(bounded(_Chunks(data), limits, "names"), ["*.log"]))
    assert _names(passed) == [
        name for name in _names(data) if not any(part.endswith(".log") for part in name.split("/"))
    ]


class _Chunks:
    """`data` as an archive stream of 700-byte chunks."""

    def __init__(self, data: bytes) -> None:
        self._chunks = iter([data[start : start + 700] for start in range(0, len(data), 700)])

    def __iter__(self) -> _Chunks:
        return self

    def __next__(self) -> bytes:
        return next(self._chunks)

    def close(self) -> None:
        pass


def _names(archive_bytes: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(archive_bytes), mode="r") as archive:
        return [member.name for member in archive]


def test_the_report_is_written_whatever_a_trajectory_holds(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    rows = [row("deep", 0, folder=folder), row("huge", 0, folder=folder)]
    deep_logs = Path(rows[0]["turns"][0]["verifier_logs_dir"])
    (deep_logs / "trajectory.json").write_text(
        '{"steps": [' + deep(opener='{"message":', closer="}", inner='"hi"') + "]}"
    )
    huge_logs = Path(rows[1]["turns"][0]["verifier_logs_dir"])
    (huge_logs / "trajectory.json").write_text(
        '{"steps": [{"step_id": ' + "9" * 5_000 + ', "message": "\\ud800", "source": "agent"}]}'
    )
    summary = write_results(folder, rows)
    html = render_report([summary], folder / "report.html")
    assert (
        "Not a trajectory the report can lay out as steps "
        f"(it nests arrays or objects deeper than {MAX_DEPTH} levels)" in html
    )
    assert "#inf agent" in html and '<pre class="message">\ufffd</pre>' in html
    assert [episode.task_id for episode in load_taskset(summary).episodes] == ["deep", "huge"]


@fast
@given(payloads())
def test_whatever_was_read_can_be_written_to_a_results_file(data: bytes) -> None:
    value = load_json(data).value
    doubled = [value, value]
    for number in (value, *(value.values() if isinstance(value, dict) else ())):
        if isinstance(number, int) and not isinstance(number, bool):
            doubled.append(number * 2)  # a sum of two such numbers
    strict_json.dumps(doubled, ensure_ascii=False).encode("utf-8")


def test_token_counts_an_agent_inflates_do_not_stop_its_trajectory_being_written() -> None:
    """Two codex turns of 4,300-digit token counts: their sum has more digits than
    json.dumps writes; the trajectory is written, the count as null."""
    usage = '{"type": "turn.completed", "usage": {"input_tokens": ' + "9" * 4_300 + "}}"
    message = '{"type": "item.completed", "item": {"type": "agent_message", "text": "hi"}}'
    source = ConverterInput(
        files={},
        stdout="\n".join([usage, usage, message]),
        agent="codex",
        version="1",
        model="m",
        session_id="s",
        instruction="do it",
    )
    trajectory, note = convert("codex", source)
    assert trajectory is not None and note is None
    written = json.loads(trajectory.to_bytes())
    assert written["final_metrics"]["total_prompt_tokens"] is None


def test_token_counts_past_any_real_run_stop_at_a_ceiling() -> None:
    claimed = Usage(prompt_tokens=int("9" * 4_300), completion_tokens=1)
    total = claimed + claimed
    assert (total.prompt_tokens, total.completion_tokens) == (Usage.MOST, 2)
    assert f"{total.prompt_tokens:,}" == "9,223,372,036,854,775,807"


def test_the_report_shows_usage_whatever_the_summary_holds(tmp_path: Path) -> None:
    folder = tmp_path / "ts"
    usage = {
        "prompt_tokens": None,
        "completion_tokens": 10**400,
        "requests": "many",
        "cost_usd": "free",
    }
    summary = write_results(folder, [row("hello", 0, folder=folder)], usage=usage)
    html = render_report([summary], folder / "report.html")
    assert html.count('<span class="value">\u2013</span>') >= 3
