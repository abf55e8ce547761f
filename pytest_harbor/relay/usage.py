"""The tokens one model call used, read from the answer the endpoint sent, and the cause of
a failed call, for the three APIs the relay carries.

Everything here reads bytes that an endpoint or an agent wrote, so every reader is total:
it returns a value or None, never raises, whatever it is given. A count that is not an
integer, is negative or is a boolean reads as 0; one past 2**63-1 reads as 2**63-1.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pytest_harbor.untrusted import load_json

__all__ = [
    "MAX_COUNT",
    "MAX_HELD",
    "Api",
    "CallUsage",
    "Cause",
    "StreamUsage",
    "api_of",
    "error_words",
    "include_usage_in_stream",
    "model_of_request",
    "usage_of_body",
    "verdict",
]

Api = Literal["chat-completions", "responses", "anthropic-messages"]

#: Why a call failed, as far as the relay can tell from the answer.
Cause = Literal["rate_limited", "api_error", "context_length_exceeded"]

#: The largest count read (a signed 64-bit integer, what a results file or a database
#: column holds); larger ones are cut to it.
MAX_COUNT = 2**63 - 1

#: The most bytes of one unfinished line of a stream, and of one event's data, held at a
#: time. The largest event that carries usage is a Responses stream's `response.completed`,
#: which repeats the whole output (a long answer with its reasoning: a few MiB at most); an
#: endpoint that sends a longer line loses that line (and its event), not the relay its
#: memory.
MAX_HELD = 16 << 20

#: The ends of request paths that are model calls. Only the exact end counts:
#: `/v1/messages/count_tokens`, `/v1/models` and `/v1/responses/{id}` are not calls.
_API_OF_ENDING: dict[str, Api] = {
    "/chat/completions": "chat-completions",
    "/responses": "responses",
    "/messages": "anthropic-messages",
}

#: Where the two OpenAI APIs put their counts: (all input, output, input details).
_OPENAI_KEYS: dict[Api, tuple[str, str, str]] = {
    "chat-completions": ("prompt_tokens", "completion_tokens", "prompt_tokens_details"),
    "responses": ("input_tokens", "output_tokens", "input_tokens_details"),
}

#: Anthropic's four counts. `input_tokens` leaves out what was read from or written to
#: the cache.
_ANTHROPIC_KEYS = (
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens",
)

#: The error types and codes that name a cause: Anthropic's `error.type`, OpenAI's
#: `error.code` and `error.type`.
_CAUSE_OF_CODE: dict[str, Cause] = {
    "rate_limit_error": "rate_limited",
    "rate_limit_exceeded": "rate_limited",
    "overloaded_error": "api_error",
    "api_error": "api_error",
    "server_error": "api_error",
    "context_length_exceeded": "context_length_exceeded",
}

#: What the endpoints write, in their messages, when a prompt does not fit the model.
_TOO_LONG_PHRASES = (
    "maximum context length",
    "prompt is too long",
    "context window",
    "too many tokens",
)

#: The Responses stream events that end the answer and carry its `response` object.
#: The most of a failed answer's body its words are taken from, when it holds no message.
_WORDS_SHOWN = 300
_RESPONSE_ENDS = ("response.completed", "response.incomplete", "response.failed")


@dataclass(frozen=True)
class CallUsage:
    """The tokens of one model call.

    `prompt_tokens` counts every input token, the cached ones included; `cached_tokens`
    and `cache_write_tokens` are the parts of it read from and written to the provider's
    prompt cache (the readers keep their sum within `prompt_tokens`). `completion_tokens`
    counts every output token, reasoning included. `model` is the model the answer names.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    model: str | None = None


def api_of(path: str) -> Api | None:
    """The API a request path (the part after the base URL) calls, or None when it is not
    a model call. The query string is ignored."""
    bare = path.partition("?")[0]
    for ending, api in _API_OF_ENDING.items():
        if bare.endswith(ending):
            return api
    return None


def usage_of_body(api: Api, body: bytes) -> CallUsage | None:
    """The usage of a whole (not streamed) answer, or None when it carries none."""
    value = load_json(body).value
    if not isinstance(value, dict):
        return None
    return _usage_of(api, value.get("usage"), value.get("model"))


def model_of_request(body: bytes) -> str | None:
    """The model a request's JSON names at its top level, or None."""
    value = load_json(body).value
    model = value.get("model") if isinstance(value, dict) else None
    return model if isinstance(model, str) else None


def include_usage_in_stream(api: Api, body: bytes) -> bytes | None:
    """A streamed Chat Completions request asking for its usage too, or None when the
    request needs no change (another API, not streamed, already asking, not a JSON object).

    Chat Completions streams carry no counts unless the request sets
    `stream_options.include_usage`; the relay adds it so that it can count every call.
    The other fields keep their values and order.
    """
    if api != "chat-completions":
        return None
    value = load_json(body).value
    if not isinstance(value, dict) or value.get("stream") is not True:
        return None
    options = value.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return None
    kept = options if isinstance(options, dict) else {}
    value["stream_options"] = {**kept, "include_usage": True}
    # What load_json reads, json writes back: its integers are within Python's digit limit
    # and its lone surrogates are replaced.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def verdict(status: int, body_head: bytes) -> Cause | None:
    """The cause a failed answer shows, from its status and the first bytes of its body;
    None for an answer that is not one of the three failures."""
    if status == 429:
        return "rate_limited"
    if status == 408 or 500 <= status <= 599:  # 529 is Anthropic's "overloaded"
        return "api_error"
    if status in (400, 413) and _says_too_long(load_json(body_head).value):
        return "context_length_exceeded"
    return None


class StreamUsage:
    """Reads the usage of a streamed answer (server-sent events) as its chunks pass.

    Chunks may split the stream anywhere. Only the current line and event are held, each
    at most MAX_HELD bytes; `result()` and `error_cause` may be read at any time.
    """

    def __init__(self, api: Api) -> None:
        self.api = api
        #: Why the answer failed, when the stream carried an error event (the first one).
        self.error_cause: Cause | None = None
        self._events = _EventReader()
        self._usage: dict[str, Any] | None = None
        self._model: str | None = None

    def feed(self, chunk: bytes) -> None:
        """Read the next piece of the stream."""
        for name, data in self._events.feed(chunk):
            if data == "[DONE]":
                continue
            value = load_json(data).value
            if isinstance(value, dict):
                self._read_event(str(value.get("type") or name), value)

    def result(self) -> CallUsage | None:
        """The usage the stream has carried so far, or None when it carried none."""
        return _usage_of(self.api, self._usage, self._model)

    def _read_event(self, kind: str, value: dict[str, Any]) -> None:
        """Take what one event of the stream says, `kind` being its type."""
        if self.api == "chat-completions":
            self._read_chat_chunk(value)
        elif self.api == "responses":
            self._read_responses_event(kind, value)
        else:
            self._read_anthropic_event(kind, value)

    def _read_chat_chunk(self, chunk: dict[str, Any]) -> None:
        """A chunk's model, its usage (in the last chunk, when the request asked for it),
        or the error an endpoint sends in place of a chunk."""
        self._note_model(chunk.get("model"))
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        if chunk.get("error") is not None:
            self._note_error(chunk)

    def _read_responses_event(self, kind: str, event: dict[str, Any]) -> None:
        """The usage of the response an ending event carries, or an error."""
        response = event.get("response")
        if isinstance(response, dict):
            self._note_model(response.get("model"))
        if kind in _RESPONSE_ENDS and isinstance(response, dict):
            if isinstance(response.get("usage"), dict):
                self._usage = response["usage"]
            if kind == "response.failed":
                self._note_error(response)
        elif kind == "error":
            self._note_error(event)

    def _read_anthropic_event(self, kind: str, event: dict[str, Any]) -> None:
        """The counts of the message's start and of each delta, or an error."""
        if kind == "message_start" and isinstance(event.get("message"), dict):
            message = event["message"]
            self._note_model(message.get("model"))
            if isinstance(message.get("usage"), dict):
                self._usage = {key: message["usage"].get(key) for key in _ANTHROPIC_KEYS}
        elif kind == "message_delta" and isinstance(event.get("usage"), dict):
            self._usage = _anthropic_counts(self._usage or {}, event["usage"])
        elif kind == "error":
            self._note_error(event)

    def _note_model(self, model: Any) -> None:
        if isinstance(model, str):
            self._model = model

    def _note_error(self, value: dict[str, Any]) -> None:
        # An error inside a stream the endpoint had accepted is its own failure, whatever
        # it calls it, unless it names a cause.
        if self.error_cause is None:
            self.error_cause = _cause_of_error(value) or "api_error"


class _EventReader:
    """Server-sent events from the bytes of a stream, as the HTML standard reads them:
    lines end in \\n, \\r\\n or \\r; an empty line ends an event; `data:` lines join with
    \\n; `event:` names it; lines starting with `:` are comments. A line longer than
    MAX_HELD is dropped with the event it belongs to."""

    def __init__(self) -> None:
        self._line = bytearray()  # the unfinished line (appended to in place)
        self._skipping = False  # inside a line too long to keep
        self._after_cr = False  # the last chunk ended in \r: a \n next ends no line
        self._name = ""
        self._data: list[str] = []
        self._size = 0
        self._spoilt = False  # the event lost a line

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """The events (name, data) that `chunk` completes."""
        events: list[tuple[str, str]] = []
        start = 1 if self._after_cr and chunk.startswith(b"\n") else 0
        if chunk:
            self._after_cr = chunk.endswith(b"\r")
        for end in _LINE_END.finditer(chunk, start):
            events += self._end_line(chunk[start : end.start()])
            start = end.end()
        self._hold(chunk[start:])
        return events

    def _end_line(self, piece: bytes) -> list[tuple[str, str]]:
        """The events the line ending with `piece` completes."""
        skipped, self._skipping = self._skipping, False
        if skipped or len(self._line) + len(piece) > MAX_HELD:
            self._line.clear()
            self._spoilt = True
            return []
        line = (self._line + piece).decode("utf-8", "replace")
        self._line.clear()
        return self._read_line(line)

    def _hold(self, rest: bytes) -> None:
        """Keep the start of an unfinished line, or drop it once it is too long."""
        if self._skipping:
            return
        if len(self._line) + len(rest) > MAX_HELD:
            self._line.clear()
            self._skipping, self._spoilt = True, True
        else:
            self._line += rest

    def _read_line(self, line: str) -> list[tuple[str, str]]:
        """Take one line's field; an empty line ends the event."""
        if not line:
            return self._dispatch()
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            self._size += len(value) + 1
            self._spoilt = self._spoilt or self._size > MAX_HELD
            if not self._spoilt:
                self._data.append(value)
        elif field == "event":
            self._name = value
        return []

    def _dispatch(self) -> list[tuple[str, str]]:
        """The event read so far, unless it has no data or lost a line; start the next."""
        event = (self._name or "message", "\n".join(self._data))
        complete = bool(self._data) and not self._spoilt
        self._name, self._data, self._size, self._spoilt = "", [], 0, False
        return [event] if complete else []


_LINE_END = re.compile(rb"\r\n|\r|\n")


def _anthropic_counts(before: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's counts after a message_delta: each count the delta gives (not null)
    replaces the one before. Its output_tokens is the total so far, not an increment,
    and newer versions of the API restate the input and cache counts there too."""
    given = {key: value for key, value in delta.items() if value is not None}
    return {key: given.get(key, before.get(key)) for key in _ANTHROPIC_KEYS}


def _usage_of(api: Api, usage: Any, model: Any) -> CallUsage | None:
    """CallUsage from an answer's usage object (None when it is not an object)."""
    if not isinstance(usage, dict):
        return None
    name = model if isinstance(model, str) else None
    if api == "anthropic-messages":
        read = _count(usage.get("cache_read_input_tokens"))
        written = _count(usage.get("cache_creation_input_tokens"))
        prompt = _count(usage.get("input_tokens")) + read + written
        return _call_usage(prompt, _count(usage.get("output_tokens")), read, written, name)
    prompt_key, completion_key, details_key = _OPENAI_KEYS[api]
    details = usage.get(details_key)
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    prompt = _count(usage.get(prompt_key))
    return _call_usage(prompt, _count(usage.get(completion_key)), cached, 0, name)


def _call_usage(
    prompt: int, completion: int, cached: int, written: int, model: str | None
) -> CallUsage:
    """CallUsage with the prompt clamped to MAX_COUNT and the cache parts within it."""
    prompt = min(prompt, MAX_COUNT)
    cached = min(cached, prompt)
    written = min(written, prompt - cached)
    return CallUsage(prompt, completion, cached, written, model)


def _count(value: Any) -> int:
    """A token count as read: an integer within 0..MAX_COUNT, else 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return min(max(value, 0), MAX_COUNT)


def _cause_of_error(value: Any) -> Cause | None:
    """The cause an error object names by its type or code, else context_length_exceeded
    when its message says the prompt is too long, else None."""
    codes, _ = _error_words(value)
    named = [_CAUSE_OF_CODE[code] for code in codes if code in _CAUSE_OF_CODE]
    if named:
        return named[0]
    return "context_length_exceeded" if _says_too_long(value) else None


def error_words(body_head: bytes) -> str:
    """What a failed answer says: its error's message, else the start of its body."""
    _, messages = _error_words(load_json(body_head).value)
    if messages:
        return messages[0]
    return body_head[:_WORDS_SHOWN].decode("utf-8", errors="replace").strip()


def _says_too_long(value: Any) -> bool:
    """Whether an error object says the prompt did not fit the model."""
    codes, messages = _error_words(value)
    return "context_length_exceeded" in codes or any(
        phrase in message.lower() for message in messages for phrase in _TOO_LONG_PHRASES
    )


def _error_words(value: Any) -> tuple[list[str], list[str]]:
    """The codes (its `type` and `code`) and the messages of an error object, those of the
    `error` object inside it first. OpenAI and Anthropic nest the error in `error`; some
    servers put it at the top, or give `error` as a bare message."""
    codes: list[str] = []
    messages: list[str] = []
    inner = value.get("error") if isinstance(value, dict) else None
    if isinstance(inner, str):
        messages.append(inner)
    for place in (inner, value):
        if not isinstance(place, dict):
            continue
        codes += [word for word in (place.get("type"), place.get("code")) if isinstance(word, str)]
        if isinstance(place.get("message"), str):
            messages.append(place["message"])
    return codes, messages
