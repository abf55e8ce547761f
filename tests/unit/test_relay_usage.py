"""The relay's reading of a model call's usage and failure cause from the answer: whole and
streamed answers of the three APIs, fed in every split, and hostile bytes of every kind."""

from __future__ import annotations

import itertools
import json
import tracemalloc
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_harbor.relay.usage import (
    MAX_COUNT,
    MAX_HELD,
    Api,
    CallUsage,
    Cause,
    StreamUsage,
    api_of,
    include_usage_in_stream,
    model_of_request,
    usage_of_body,
    verdict,
)
from pytest_harbor.untrusted import load_json
from tests.unit.hostile import DEEP_TEXTS, HUGE_NUMBERS, json_texts, payloads

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")

fast = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

APIS: tuple[Api, ...] = get_args(Api)
CAUSES: tuple[Cause, ...] = get_args(Cause)


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def sse(*events: tuple[str | None, Any], end: str = "\n") -> bytes:
    """A server-sent events stream: each event an optional `event:` line and a `data:`
    line (JSON, or text as it is), then an empty line."""
    lines: list[str] = []
    for name, data in events:
        if name is not None:
            lines.append(f"event: {name}")
        lines.append(f"data: {data if isinstance(data, str) else compact(data)}")
        lines.append("")
    return "".join(line + end for line in lines).encode("utf-8")


def stream_usage(api: Api, chunks: list[bytes]) -> StreamUsage:
    reader = StreamUsage(api)
    for chunk in chunks:
        reader.feed(chunk)
    return reader


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = [0, *sorted(cuts), len(data)]
    return [data[start:stop] for start, stop in itertools.pairwise(points)]


def each_byte(data: bytes) -> list[bytes]:
    return [data[index : index + 1] for index in range(len(data))]


# Chat Completions ----------------------------------------------------------------------

CHAT_USAGE = {
    "prompt_tokens": 1834,
    "completion_tokens": 212,
    "total_tokens": 2046,
    "prompt_tokens_details": {"cached_tokens": 1536, "audio_tokens": 0},
    "completion_tokens_details": {
        "reasoning_tokens": 64,
        "audio_tokens": 0,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    },
}
CHAT_EXPECTED = CallUsage(1834, 212, 1536, 0, "gpt-4o-2024-08-06")

CHAT_BODY = compact(
    {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion",
        "created": 1741570283,
        "model": "gpt-4o-2024-08-06",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Done.", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": CHAT_USAGE,
        "service_tier": "default",
        "system_fingerprint": "fp_fc9f1d7035",
    }
).encode()


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion.chunk",
        "created": 1741570283,
        "model": "gpt-4o-2024-08-06",
        "system_fingerprint": "fp_fc9f1d7035",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": None,
        **extra,
    }


CHAT_STREAM = sse(
    (None, chat_chunk({"role": "assistant", "content": "", "refusal": None})),
    (None, chat_chunk({"content": "Do"})),
    (None, chat_chunk({"content": "ne."})),
    (None, chat_chunk({}, "stop")),
    (None, dict(chat_chunk({}), choices=[], usage=CHAT_USAGE)),
    (None, "[DONE]"),
)

# Responses -----------------------------------------------------------------------------

RESPONSES_USAGE = {
    "input_tokens": 4200,
    "input_tokens_details": {"cached_tokens": 4096},
    "output_tokens": 611,
    "output_tokens_details": {"reasoning_tokens": 448},
    "total_tokens": 4811,
}
RESPONSES_EXPECTED = CallUsage(4200, 611, 4096, 0, "gpt-5-2025-08-07")

MESSAGE_ITEM = {
    "id": "msg_68af4a",
    "type": "message",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
}


def response(status: str, usage: Any = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_68af4a1c",
        "object": "response",
        "created_at": 1756318236,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "model": "gpt-5-2025-08-07",
        "output": [MESSAGE_ITEM] if status == "completed" else [],
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium", "summary": None},
        "usage": usage,
        **extra,
    }


RESPONSES_BODY = compact(response("completed", RESPONSES_USAGE)).encode()


def responses_stream(last: tuple[str, Any]) -> bytes:
    """A Responses stream: created, in progress, one message written, then `last`."""
    part = {"type": "output_text", "text": "", "annotations": []}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response("in_progress")},
        {"type": "response.in_progress", "response": response("in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": MESSAGE_ITEM},
        {"type": "response.content_part.added", "item_id": "msg_68af4a", "part": part},
        {"type": "response.output_text.delta", "item_id": "msg_68af4a", "delta": "Done."},
        {"type": "response.output_text.done", "item_id": "msg_68af4a", "text": "Done."},
        {"type": "response.output_item.done", "output_index": 0, "item": MESSAGE_ITEM},
        {"type": last[0], **last[1]},
    ]
    numbered = [dict(event, sequence_number=number) for number, event in enumerate(events)]
    return sse(*((event["type"], event) for event in numbered))


RESPONSES_STREAM = responses_stream(
    ("response.completed", {"response": response("completed", RESPONSES_USAGE)})
)

# Anthropic Messages --------------------------------------------------------------------

ANTHROPIC_USAGE = {
    "input_tokens": 12,
    "cache_creation_input_tokens": 310,
    "cache_read_input_tokens": 5021,
    "cache_creation": {"ephemeral_5m_input_tokens": 310, "ephemeral_1h_input_tokens": 0},
    "output_tokens": 187,
    "service_tier": "standard",
}
ANTHROPIC_EXPECTED = CallUsage(12 + 5021 + 310, 187, 5021, 310, "claude-sonnet-4-5-20250929")

ANTHROPIC_BODY = compact(
    {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [{"type": "text", "text": "Done."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": ANTHROPIC_USAGE,
    }
).encode()


def anthropic_stream(delta_usage: dict[str, Any], *more: tuple[str, Any]) -> bytes:
    """An Anthropic stream: a message with one text block, then `more` events."""
    start_usage = dict(ANTHROPIC_USAGE, output_tokens=1)
    message: dict[str, Any] = {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    block = {"type": "text", "text": ""}
    events: list[tuple[str, Any]] = [
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        ("ping", {"type": "ping"}),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Do"},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "ne."},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": delta_usage,
            },
        ),
        ("message_stop", {"type": "message_stop"}),
        *more,
    ]
    return sse(*events)


ANTHROPIC_STREAM = anthropic_stream({"output_tokens": 187})

STREAMS: list[tuple[Api, bytes, CallUsage]] = [
    ("chat-completions", CHAT_STREAM, CHAT_EXPECTED),
    ("responses", RESPONSES_STREAM, RESPONSES_EXPECTED),
    ("anthropic-messages", ANTHROPIC_STREAM, ANTHROPIC_EXPECTED),
]
STREAM_IDS = [api for api, _, _ in STREAMS]


# api_of --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", "chat-completions"),
        ("/chat/completions", "chat-completions"),
        ("/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21", "chat-completions"),
        ("/v1/responses", "responses"),
        ("/responses?stream=true", "responses"),
        ("/v1/messages", "anthropic-messages"),
        ("/v1/messages?beta=true", "anthropic-messages"),
        ("/v1/messages/count_tokens", None),
        ("/v1/messages/batches", None),
        ("/v1/models", None),
        ("/v1/responses/resp_68af4a1c", None),
        ("/v1/responses/resp_68af4a1c/input_items", None),
        ("/v1/completions", None),
        ("/v1/embeddings", None),
        ("/v1/chat/completions/", None),
        ("/v1/messagesx", None),
        ("", None),
        ("?/v1/messages", None),
    ],
)
def test_api_of_a_path_is_the_exact_ending_it_has(path: str, api: Api | None) -> None:
    assert api_of(path) == api


# Whole answers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api", "body", "expected"),
    [
        ("chat-completions", CHAT_BODY, CHAT_EXPECTED),
        ("responses", RESPONSES_BODY, RESPONSES_EXPECTED),
        ("anthropic-messages", ANTHROPIC_BODY, ANTHROPIC_EXPECTED),
    ],
    ids=["chat-completions", "responses", "anthropic-messages"],
)
def test_a_whole_answer_gives_its_usage(api: Api, body: bytes, expected: CallUsage) -> None:
    assert usage_of_body(api, body) == expected


def test_anthropic_prompt_tokens_add_the_cache_reads_and_writes_to_input_tokens() -> None:
    usage = usage_of_body("anthropic-messages", ANTHROPIC_BODY)
    assert usage is not None
    assert usage.prompt_tokens == 5343
    assert (usage.cached_tokens, usage.cache_write_tokens) == (5021, 310)


def test_an_answer_without_cache_details_has_no_cached_tokens() -> None:
    body = compact({"model": "gpt-4o", "usage": {"prompt_tokens": 9, "completion_tokens": 2}})
    assert usage_of_body("chat-completions", body.encode()) == CallUsage(9, 2, 0, 0, "gpt-4o")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1, 2]",
        b'{"model": "gpt-4o"}',
        b'{"model": "gpt-4o", "usage": null}',
        b'{"model": "gpt-4o", "usage": [1, 2]}',
        b'{"model": "gpt-4o", "usage": "12"}',
    ],
)
@pytest.mark.parametrize("api", APIS)
def test_an_answer_without_a_usage_object_has_no_usage(api: Api, body: bytes) -> None:
    assert usage_of_body(api, body) is None


def test_a_model_that_is_not_text_is_not_named() -> None:
    body = compact({"model": ["gpt-4o"], "usage": {"prompt_tokens": 1}}).encode()
    assert usage_of_body("chat-completions", body) == CallUsage(1, 0, 0, 0, None)


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ("12", 12),
        ("0", 0),
        ("-5", 0),
        ("true", 0),
        ("false", 0),
        ("1.5", 0),
        ("12.0", 0),
        ('"12"', 0),
        ("null", 0),
        ("[12]", 0),
        ('{"n": 12}', 0),
        ("NaN", 0),
        ("Infinity", 0),
        ("1e400", 0),
        (str(2**63 - 1), MAX_COUNT),
        (str(2**63), MAX_COUNT),
        ("1" * 400, MAX_COUNT),
        ("9" * 5_000, 0),  # past Python's integer-string limit: read as an infinite float
    ],
)
def test_a_count_is_an_integer_clamped_to_64_bits_and_anything_else_is_zero(
    given: str, read: int
) -> None:
    body = f'{{"usage": {{"prompt_tokens": {given}, "completion_tokens": {given}}}}}'
    assert usage_of_body("chat-completions", body.encode()) == CallUsage(read, read, 0, 0, None)


def test_cached_tokens_are_never_more_than_the_prompt() -> None:
    usage = {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 5_000}}
    body = compact({"usage": usage}).encode()
    assert usage_of_body("chat-completions", body) == CallUsage(100, 0, 100, 0, None)


def test_anthropic_counts_that_add_past_64_bits_are_clamped_and_stay_parts() -> None:
    huge = 2**62
    usage = {
        "input_tokens": huge,
        "cache_read_input_tokens": huge,
        "cache_creation_input_tokens": huge,
    }
    read = usage_of_body("anthropic-messages", compact({"usage": usage}).encode())
    assert read is not None
    assert read.prompt_tokens == MAX_COUNT
    assert read.cached_tokens == huge
    assert read.cache_write_tokens == MAX_COUNT - huge


# Streams -------------------------------------------------------------------------------


@pytest.mark.parametrize(("api", "stream", "expected"), STREAMS, ids=STREAM_IDS)
def test_a_stream_in_one_chunk_gives_its_usage(
    api: Api, stream: bytes, expected: CallUsage
) -> None:
    reader = stream_usage(api, [stream])
    assert reader.result() == expected
    assert reader.error_cause is None


@pytest.mark.parametrize(("api", "stream", "expected"), STREAMS, ids=STREAM_IDS)
def test_a_stream_fed_one_byte_at_a_time_gives_the_same_usage(
    api: Api, stream: bytes, expected: CallUsage
) -> None:
    assert stream_usage(api, each_byte(stream)).result() == expected


@pytest.mark.parametrize("end", ["\r\n", "\r"])
@pytest.mark.parametrize(("api", "stream", "expected"), STREAMS, ids=STREAM_IDS)
def test_lines_may_end_in_crlf_or_cr_even_when_a_chunk_splits_them(
    api: Api, stream: bytes, expected: CallUsage, end: str
) -> None:
    ended = stream.replace(b"\n", end.encode())
    assert stream_usage(api, [ended]).result() == expected
    assert stream_usage(api, each_byte(ended)).result() == expected


@fast
@given(data=st.data())
@pytest.mark.parametrize(("api", "stream", "expected"), STREAMS, ids=STREAM_IDS)
def test_a_stream_split_anywhere_gives_the_same_usage(
    api: Api, stream: bytes, expected: CallUsage, data: st.DataObject
) -> None:
    end = data.draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    ended = stream.replace(b"\n", end)
    cuts = data.draw(st.lists(st.integers(0, len(ended)), max_size=40))
    assert stream_usage(api, split_at(ended, cuts)).result() == expected


def test_a_chunk_split_inside_a_utf8_character_reads_it_whole() -> None:
    chunk = chat_chunk({}, model="modèle-é", choices=[], usage=CHAT_USAGE)
    stream = sse((None, json.dumps(chunk, ensure_ascii=False)))
    cut = stream.index("è".encode()) + 1
    result = stream_usage("chat-completions", [stream[:cut], stream[cut:]]).result()
    assert result is not None
    assert result.model == "modèle-é"


def test_a_stream_with_nothing_yet_has_no_usage() -> None:
    assert StreamUsage("chat-completions").result() is None
    half = CHAT_STREAM[: CHAT_STREAM.index(b'"usage":{')]
    assert stream_usage("chat-completions", [half]).result() is None


def test_an_event_not_ended_by_an_empty_line_is_not_read() -> None:
    usage_chunk = dict(chat_chunk({}), choices=[], usage=CHAT_USAGE)
    unfinished = f"data: {compact(usage_chunk)}\n".encode()
    reader = stream_usage("chat-completions", [unfinished])
    assert reader.result() is None
    reader.feed(b"\n")
    assert reader.result() == CHAT_EXPECTED


def test_data_lines_of_one_event_are_joined_with_newlines() -> None:
    text = compact(dict(chat_chunk({}), choices=[], usage=CHAT_USAGE))
    middle = text.index(',"usage"')
    stream = f"data: {text[:middle]}\ndata:{text[middle:]}\n\n".encode()
    assert stream_usage("chat-completions", [stream]).result() == CHAT_EXPECTED
    glued = b'data: {"usage": {"prompt_tokens": 18\ndata: 34}}\n\n'  # 18, a newline, 34
    assert stream_usage("chat-completions", [glued]).result() is None


@pytest.mark.parametrize("end", ["\r\n", "\r", "\n"])
def test_a_line_end_split_between_chunks_ends_one_line(end: str) -> None:
    text = compact(dict(chat_chunk({}), choices=[], usage=CHAT_USAGE))
    middle = text.index(',"usage"')
    stream = f"data: {text[:middle]}{end}data: {text[middle:]}{end}{end}".encode()
    assert stream_usage("chat-completions", each_byte(stream)).result() == CHAT_EXPECTED
    cut = stream.index(end.encode()) + 1  # inside the first \r\n, or just after \r or \n
    assert stream_usage("chat-completions", [stream[:cut], stream[cut:]]).result() == (
        CHAT_EXPECTED
    )


def test_an_event_is_known_by_its_type_or_else_by_its_name() -> None:
    start = {"message": {"model": "claude-haiku-4-5", "usage": {"input_tokens": 7}}}
    named = sse(("message_start", start))
    typed = sse((None, {"type": "message_start", **start}))
    expected = CallUsage(7, 0, 0, 0, "claude-haiku-4-5")
    assert stream_usage("anthropic-messages", [named]).result() == expected
    assert stream_usage("anthropic-messages", [typed]).result() == expected


def test_comments_and_unknown_fields_are_ignored() -> None:
    text = compact(dict(chat_chunk({}), choices=[], usage=CHAT_USAGE))
    stream = f": keep-alive\nid: 7\nretry: 100\ndata: {text}\n\n: bye\n\n".encode()
    assert stream_usage("chat-completions", [stream]).result() == CHAT_EXPECTED


def test_a_chat_stream_keeps_the_last_usage_it_carried() -> None:
    later = dict(CHAT_USAGE, prompt_tokens=2000, completion_tokens=300)
    stream = CHAT_STREAM.replace(b"data: [DONE]", b"") + sse(
        (None, dict(chat_chunk({}), choices=[], usage=later)),
        (None, chat_chunk({})),  # usage null: not a usage
        (None, "[DONE]"),
    )
    assert stream_usage("chat-completions", [stream]).result() == CallUsage(
        2000, 300, 1536, 0, "gpt-4o-2024-08-06"
    )


def test_a_chat_stream_without_a_usage_chunk_has_no_usage() -> None:
    stream = sse(
        (None, chat_chunk({"role": "assistant", "content": "Done."})),
        (None, chat_chunk({}, "stop")),
        (None, "[DONE]"),
    )
    assert stream_usage("chat-completions", [stream]).result() is None


def test_an_incomplete_response_gives_its_usage() -> None:
    usage = dict(RESPONSES_USAGE, output_tokens=128)
    ended = {"response": response("incomplete", usage)}
    stream = responses_stream(("response.incomplete", ended))
    reader = stream_usage("responses", [stream])
    assert reader.result() == CallUsage(4200, 128, 4096, 0, "gpt-5-2025-08-07")
    assert reader.error_cause is None


def test_a_responses_stream_cut_before_it_completed_has_no_usage() -> None:
    cut = RESPONSES_STREAM[: RESPONSES_STREAM.index(b"event: response.completed")]
    assert stream_usage("responses", [cut]).result() is None


def test_anthropic_output_tokens_are_the_last_total_a_delta_gave() -> None:
    more = (
        "message_delta",
        {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 250}},
    )
    stream = anthropic_stream({"output_tokens": 187}, more)
    result = stream_usage("anthropic-messages", [stream]).result()
    assert result == CallUsage(5343, 250, 5021, 310, "claude-sonnet-4-5-20250929")


def test_anthropic_start_alone_gives_its_counts_and_first_output() -> None:
    start = ANTHROPIC_STREAM[: ANTHROPIC_STREAM.index(b"event: content_block_start")]
    result = stream_usage("anthropic-messages", [start]).result()
    assert result == CallUsage(5343, 1, 5021, 310, "claude-sonnet-4-5-20250929")


def test_anthropic_input_counts_a_delta_gives_replace_the_starts() -> None:
    stream = anthropic_stream(
        {
            "input_tokens": 20,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 6000,
            "output_tokens": 187,
        }
    )
    result = stream_usage("anthropic-messages", [stream]).result()
    assert result == CallUsage(6020, 187, 6000, 0, "claude-sonnet-4-5-20250929")


def test_anthropic_input_counts_a_delta_gives_as_null_keep_the_starts() -> None:
    stream = anthropic_stream(
        {"input_tokens": None, "cache_read_input_tokens": None, "output_tokens": 187}
    )
    assert stream_usage("anthropic-messages", [stream]).result() == ANTHROPIC_EXPECTED


# Errors inside streams -----------------------------------------------------------------


def anthropic_error(kind: str, message: str) -> tuple[str, Any]:
    return ("error", {"type": "error", "error": {"type": kind, "message": message}})


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (anthropic_error("overloaded_error", "Overloaded"), "api_error"),
        (anthropic_error("rate_limit_error", "Too many request tokens"), "rate_limited"),
        (anthropic_error("api_error", "Internal server error"), "api_error"),
        (
            anthropic_error("invalid_request_error", "prompt is too long: 208310 tokens > 200000"),
            "context_length_exceeded",
        ),
        (anthropic_error("some_new_error", "?"), "api_error"),
    ],
)
def test_an_anthropic_error_event_names_its_cause(error: tuple[str, Any], cause: Cause) -> None:
    stream = ANTHROPIC_STREAM[: ANTHROPIC_STREAM.index(b"event: message_delta")] + sse(error)
    reader = stream_usage("anthropic-messages", each_byte(stream))
    assert reader.error_cause == cause
    assert reader.result() == CallUsage(5343, 1, 5021, 310, "claude-sonnet-4-5-20250929")


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        ({"code": "server_error", "message": "The server had an error."}, "api_error"),
        ({"code": "rate_limit_exceeded", "message": "Rate limit reached"}, "rate_limited"),
        ({"code": "context_length_exceeded", "message": "Too long."}, "context_length_exceeded"),
        (
            {"code": "invalid_prompt", "message": "Your input exceeds the context window."},
            "context_length_exceeded",
        ),
        ({"code": "vector_store_timeout", "message": "?"}, "api_error"),
    ],
)
def test_a_failed_response_names_its_cause(error: dict[str, Any], cause: Cause) -> None:
    failed = {"response": response("failed", None, error=error)}
    reader = stream_usage("responses", [responses_stream(("response.failed", failed))])
    assert reader.error_cause == cause
    assert reader.result() is None


def test_a_failed_response_that_counted_tokens_gives_them() -> None:
    error = {"code": "server_error", "message": "The server had an error."}
    failed = {"response": response("failed", RESPONSES_USAGE, error=error)}
    reader = stream_usage("responses", [responses_stream(("response.failed", failed))])
    assert (reader.error_cause, reader.result()) == ("api_error", RESPONSES_EXPECTED)


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        ({"code": "rate_limit_exceeded", "message": "Slow down", "param": None}, "rate_limited"),
        ({"code": "server_error", "message": "Oops", "param": None}, "api_error"),
        ({"code": None, "message": "Something broke", "param": None}, "api_error"),
    ],
)
def test_a_responses_error_event_names_its_cause(error: dict[str, Any], cause: Cause) -> None:
    stream = RESPONSES_STREAM[: RESPONSES_STREAM.index(b"event: response.output_item")]
    stream += sse(("error", {"type": "error", **error}))
    assert stream_usage("responses", [stream]).error_cause == cause


def test_a_chat_stream_error_chunk_names_its_cause() -> None:
    error = {
        "message": "Rate limit reached for gpt-4o",
        "type": "requests",
        "code": "rate_limit_exceeded",
    }
    stream = sse((None, chat_chunk({"content": "Do"})), (None, {"error": error}))
    assert stream_usage("chat-completions", [stream]).error_cause == "rate_limited"


def test_the_first_error_of_a_stream_is_its_cause() -> None:
    stream = sse(anthropic_error("rate_limit_error", "slow"), anthropic_error("api_error", "x"))
    assert stream_usage("anthropic-messages", [stream]).error_cause == "rate_limited"


# Memory --------------------------------------------------------------------------------


def usage_event(padding: int) -> bytes:
    """A chat usage event whose data line is `padding` spaces longer than without."""
    text = compact(dict(chat_chunk({}), choices=[], usage=CHAT_USAGE))
    return f"data: {text[:-1]}{' ' * padding}}}\n\n".encode()


def test_a_line_as_long_as_the_limit_is_read_and_one_byte_more_is_dropped() -> None:
    bare = len(usage_event(0)) - 2  # the line, without its end
    longest = usage_event(MAX_HELD - bare)
    assert len(longest.rstrip(b"\n")) == MAX_HELD
    assert stream_usage("chat-completions", [longest]).result() == CHAT_EXPECTED
    assert stream_usage("chat-completions", split_at(longest, [10, 70_000])).result() == (
        CHAT_EXPECTED
    )
    too_long = usage_event(MAX_HELD - bare + 1)
    assert stream_usage("chat-completions", [too_long]).result() is None
    assert stream_usage("chat-completions", split_at(too_long, [10, 70_000])).result() is None


def test_reading_resumes_at_the_line_after_a_line_too_long() -> None:
    later = dict(chat_chunk({}), choices=[], usage=CHAT_USAGE)
    stream = b"data: " + b"x" * (2 * MAX_HELD) + b"\r\n\r\n" + sse((None, later))
    for chunks in ([stream], split_at(stream, [MAX_HELD - 3, MAX_HELD + 1, 2 * MAX_HELD + 7])):
        assert stream_usage("chat-completions", chunks).result() == CHAT_EXPECTED


def test_an_event_that_lost_a_line_is_dropped_whole() -> None:
    text = compact(dict(chat_chunk({}), choices=[], usage=CHAT_USAGE))
    stream = f"data: {text}\ndata: {'x' * MAX_HELD}\n\n".encode()
    assert stream_usage("chat-completions", [stream]).result() is None


def test_an_event_of_many_lines_past_the_limit_is_dropped() -> None:
    text = compact(dict(chat_chunk({}), choices=[], usage=CHAT_USAGE))
    lines = f"data: {' ' * 1000}\n".encode() * (MAX_HELD // 1000 + 1)
    stream = lines + f"data: {text}\n\n".encode()
    assert stream_usage("chat-completions", [stream]).result() is None
    assert stream_usage("chat-completions", [stream, usage_event(0)]).result() == CHAT_EXPECTED


@pytest.mark.parametrize(
    "block", [b"x" * 65_536, b"data: " + b" " * 1_000 + b"\n"], ids=["one-line", "one-event"]
)
def test_an_endless_line_or_event_holds_at_most_the_limit(block: bytes) -> None:
    reader = StreamUsage("chat-completions")
    reader.feed(b"data: ")
    tracemalloc.start()
    try:
        for _ in range(16 * MAX_HELD // len(block)):
            reader.feed(block)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_HELD
    reader.feed(b"\n\n" + usage_event(0))
    assert reader.result() == CHAT_EXPECTED


# Hostile bytes -------------------------------------------------------------------------


def assert_well_formed(usage: CallUsage | None) -> None:
    if usage is None:
        return
    counts = (
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.cached_tokens,
        usage.cache_write_tokens,
    )
    assert all(type(count) is int and 0 <= count <= MAX_COUNT for count in counts)
    assert usage.cached_tokens + usage.cache_write_tokens <= usage.prompt_tokens
    assert usage.model is None or isinstance(usage.model, str)


@fast
@given(payloads(), st.sampled_from(APIS))
def test_usage_of_body_is_total(body: bytes, api: Api) -> None:
    assert_well_formed(usage_of_body(api, body))


def hostile_values() -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.integers(min_value=-(2**80), max_value=2**80),
        st.floats(),
        st.booleans(),
        st.none(),
        st.text(max_size=10),
    )
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.dictionaries(st.text(max_size=5), children, max_size=3),
        ),
        max_leaves=6,
    )


USAGE_KEYS = (
    "prompt_tokens",
    "completion_tokens",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


@fast
@given(
    st.dictionaries(st.sampled_from(USAGE_KEYS), hostile_values()),
    st.dictionaries(st.just("cached_tokens"), hostile_values()),
    hostile_values(),
    st.sampled_from(APIS),
)
def test_usage_objects_of_any_shape_read_as_well_formed_counts(
    usage: dict[str, Any], details: dict[str, Any], model: Any, api: Api
) -> None:
    usage = dict(usage, prompt_tokens_details=details, input_tokens_details=details)
    body = json.dumps({"model": model, "usage": usage}).encode()
    assert_well_formed(usage_of_body(api, body))


def sse_lines() -> st.SearchStrategy[bytes]:
    """Stream text: field lines with hostile values, cut anywhere, with any line ends."""
    field = st.sampled_from(["data", "data: ", "event: ", ":", "id: ", "", "event: error\ndata"])
    event_names = st.sampled_from(
        ["message_start", "message_delta", "error", "response.completed", "response.failed"]
    )
    value = st.one_of(json_texts(), event_names, st.sampled_from(HUGE_NUMBERS))
    end = st.sampled_from(["\n", "\r\n", "\r", "\n\n", ""])
    line = st.tuples(field, value, end).map(lambda parts: "".join(parts))
    text = st.lists(line, max_size=12).map(lambda lines: "".join(lines))
    return text.map(lambda text: text.encode("utf-8", "surrogatepass"))


def usage_shaped_events() -> st.SearchStrategy[bytes]:
    """Real event shapes with hostile values where the counts and causes go."""
    value = hostile_values()
    events = st.one_of(
        st.builds(lambda u: {"type": "message_start", "message": {"usage": u, "model": u}}, value),
        st.builds(lambda u: {"type": "message_delta", "usage": u}, value),
        st.builds(lambda u: {"type": "response.completed", "response": {"usage": u}}, value),
        st.builds(lambda e: {"type": "response.failed", "response": {"error": e}}, value),
        st.builds(lambda e: {"type": "error", "error": e, "code": e, "message": e}, value),
        st.builds(lambda u: {"usage": u, "model": u, "error": u}, value),
    )
    return st.lists(events, max_size=6).map(lambda items: sse(*((None, i) for i in items)))


@fast
@given(
    st.lists(st.one_of(st.binary(max_size=200), sse_lines(), usage_shaped_events()), max_size=8),
    st.sampled_from(APIS),
)
def test_stream_usage_is_total(chunks: list[bytes], api: Api) -> None:
    reader = stream_usage(api, chunks)
    assert_well_formed(reader.result())
    assert reader.error_cause in (None, *CAUSES)


@pytest.mark.parametrize("text", DEEP_TEXTS)
@pytest.mark.parametrize("api", APIS)
def test_deep_json_in_a_stream_or_a_body_is_no_usage(api: Api, text: str) -> None:
    assert usage_of_body(api, text.encode()) is None
    reader = stream_usage(api, [sse((None, text), ("error", text))])
    assert (reader.result(), reader.error_cause) == (None, None)


# verdict -------------------------------------------------------------------------------

OPENAI_TOO_LONG = compact(
    {
        "error": {
            "message": "This model's maximum context length is 128000 tokens. However, your "
            "messages resulted in 131290 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
).encode()
ANTHROPIC_TOO_LONG = compact(
    {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 208310 tokens > 200000 maximum",
        },
        "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy",
    }
).encode()
RESPONSES_TOO_LONG = compact(
    {
        "error": {
            "message": "Your input exceeds the context window of this model. Please adjust "
            "your input and try again.",
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }
).encode()
VLLM_TOO_LONG = compact(
    {
        "object": "error",
        "message": "This model's maximum context length is 32768 tokens. However, you "
        "requested 40000 tokens.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
).encode()
ANTHROPIC_OVERLOADED = compact(
    {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
).encode()
ANTHROPIC_TOO_LARGE = compact(
    {
        "type": "error",
        "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"},
    }
).encode()
OPENAI_BAD_REQUEST = compact(
    {
        "error": {
            "message": "Invalid value for 'temperature': must be between 0 and 2.",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }
).encode()


@pytest.mark.parametrize(
    ("status", "body", "cause"),
    [
        (429, b"", "rate_limited"),
        (429, OPENAI_TOO_LONG, "rate_limited"),
        (529, ANTHROPIC_OVERLOADED, "api_error"),
        (500, b"<html>Internal Server Error</html>", "api_error"),
        (502, b"", "api_error"),
        (503, b"upstream connect error", "api_error"),
        (504, b"", "api_error"),
        (599, b"", "api_error"),
        (408, b"", "api_error"),
        (400, OPENAI_TOO_LONG, "context_length_exceeded"),
        (400, ANTHROPIC_TOO_LONG, "context_length_exceeded"),
        (400, RESPONSES_TOO_LONG, "context_length_exceeded"),
        (400, VLLM_TOO_LONG, "context_length_exceeded"),
        (413, b'{"error": {"message": "Request has too many tokens"}}', "context_length_exceeded"),
        (400, b'{"error": "prompt is too long"}', "context_length_exceeded"),
        (400, b'{"error": {"code": "context_length_exceeded"}}', "context_length_exceeded"),
        (400, OPENAI_BAD_REQUEST, None),
        (400, b"prompt is too long", None),  # not JSON
        (400, OPENAI_TOO_LONG[:60], None),  # cut short: not JSON
        (413, ANTHROPIC_TOO_LARGE, None),
        (422, OPENAI_TOO_LONG, None),
        (200, OPENAI_TOO_LONG, None),
        (200, b"", None),
        (401, b'{"error": {"type": "authentication_error"}}', None),
        (404, b"", None),
        (600, b"", None),
        (399, b"", None),
    ],
)
def test_verdict_of_an_answer(status: int, body: bytes, cause: Cause | None) -> None:
    assert verdict(status, body) == cause


@fast
@given(st.integers(min_value=-(2**70), max_value=2**70), payloads())
def test_verdict_is_total(status: int, body: bytes) -> None:
    assert verdict(status, body) in (None, *CAUSES)


# Requests ------------------------------------------------------------------------------


CHAT_REQUEST = {
    "model": "gpt-4o",
    "messages": [{"role": "user", "content": "Say 'Done.'"}],
    "stream": True,
    "temperature": 0.2,
    "tools": [],
}


def test_a_streamed_chat_request_is_made_to_ask_for_its_usage() -> None:
    changed = include_usage_in_stream("chat-completions", json.dumps(CHAT_REQUEST).encode())
    assert changed is not None
    value = json.loads(changed)
    assert value == dict(CHAT_REQUEST, stream_options={"include_usage": True})
    assert list(value) == [*CHAT_REQUEST, "stream_options"]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"include_obfuscation": False}, {"include_obfuscation": False, "include_usage": True}),
        ({"include_usage": False, "x": 1}, {"include_usage": True, "x": 1}),
        (None, {"include_usage": True}),
        ("yes", {"include_usage": True}),
    ],
)
def test_stream_options_keep_what_they_had_and_gain_include_usage(
    options: Any, expected: dict[str, Any]
) -> None:
    request = {"model": "gpt-4o", "stream": True, "stream_options": options, "n": 1}
    changed = include_usage_in_stream("chat-completions", json.dumps(request).encode())
    assert changed is not None
    value = json.loads(changed)
    assert value["stream_options"] == expected
    assert list(value["stream_options"]) == list(expected)
    assert list(value) == ["model", "stream", "stream_options", "n"]


def test_text_beyond_ascii_stays_as_it_was_written() -> None:
    request = {"model": "gpt-4o", "stream": True, "messages": [{"content": "héllo ✓"}]}
    changed = include_usage_in_stream("chat-completions", json.dumps(request).encode())
    assert changed is not None
    assert "héllo ✓".encode() in changed


@pytest.mark.parametrize(
    ("api", "body"),
    [
        ("chat-completions", b'{"stream": true, "stream_options": {"include_usage": true}}'),
        ("chat-completions", b'{"model": "gpt-4o", "stream": false}'),
        ("chat-completions", b'{"model": "gpt-4o"}'),
        ("chat-completions", b'{"model": "gpt-4o", "stream": "true"}'),
        ("chat-completions", b'{"model": "gpt-4o", "stream": 1}'),
        ("chat-completions", b'[{"stream": true}]'),
        ("chat-completions", b'{"stream": true'),
        ("chat-completions", b""),
        ("responses", b'{"model": "gpt-5", "stream": true}'),
        ("anthropic-messages", b'{"model": "claude-sonnet-4-5", "stream": true}'),
    ],
)
def test_a_request_that_needs_no_change_gives_none(api: Api, body: bytes) -> None:
    assert include_usage_in_stream(api, body) is None


@fast
@given(payloads())
def test_include_usage_in_stream_is_total(body: bytes) -> None:
    changed = include_usage_in_stream("chat-completions", body)
    if changed is not None:
        value = load_json(changed).value
        assert value["stream"] is True
        assert value["stream_options"]["include_usage"] is True


@fast
@given(st.dictionaries(st.text(max_size=5), hostile_values(), max_size=4))
def test_a_streamed_request_of_any_fields_keeps_them_and_asks_for_usage(
    fields: dict[str, Any],
) -> None:
    request = dict(fields, stream=True)  # the keys drawn are too short to be stream_options
    changed = include_usage_in_stream("chat-completions", json.dumps(request).encode())
    assert changed is not None
    value = json.loads(changed)
    assert value.pop("stream_options") == {"include_usage": True}
    assert json.dumps(value) == json.dumps(request)


@pytest.mark.parametrize(
    ("body", "model"),
    [
        (b'{"model": "gpt-4o", "stream": true}', "gpt-4o"),
        (b'{"model": "anthropic/claude-sonnet-4-5"}', "anthropic/claude-sonnet-4-5"),
        (b'{"model": 4}', None),
        (b'{"model": null}', None),
        (b'{"messages": []}', None),
        (b'["gpt-4o"]', None),
        (b'{"model": "gpt-4o"', None),
        (b"", None),
    ],
)
def test_model_of_request(body: bytes, model: str | None) -> None:
    assert model_of_request(body) == model


@fast
@given(payloads())
def test_model_of_request_is_total(body: bytes) -> None:
    model = model_of_request(body)
    assert model is None or isinstance(model, str)
