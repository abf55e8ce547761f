"""What the relay passes on: a list of the requests it serves, each read strictly before
anything goes to the endpoint, and the budget's admission of a model call.

The relay serves the model API and nothing else of the endpoint's host: the three calls
(`POST /v1/chat/completions`, `/v1/responses`, `/v1/messages`), Anthropic's token count,
and the model list. A path is compared as written (no percent escapes, no fragment, no
trailing slash), so that what the relay judges is what the endpoint routes. A call's body
must be one JSON object (UTF-8) whose top-level names are ASCII and distinct even
ignoring case (Go's and .NET's readers match names so), naming the token's model as a
string, with `stream` a boolean when given: an endpoint more lenient than that would read
a model or a stream the relay did not check. A Responses call in the background (billed
after its answer) is refused, as is a body of more than `MOST_CONTAINERS` objects and
arrays (each costs the relay memory to read). The body goes on as it came, but for a
streamed Chat Completions call's `stream_options.include_usage`, which the relay sets.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pytest_harbor.relay.usage import Api

__all__ = [
    "CALLS",
    "MOST_CONTAINERS",
    "Call",
    "Refusal",
    "expected_tokens",
    "read_call",
    "route_of",
]

#: The model calls, counted and held to the budget.
CALLS: dict[str, Api] = {
    "/v1/chat/completions": "chat-completions",
    "/v1/responses": "responses",
    "/v1/messages": "anthropic-messages",
}
#: Anthropic's token count: the body is checked as a call's, nothing is generated.
_COUNTS_TOKENS = "/v1/messages/count_tokens"
_MODELS = "/v1/models"
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}")
_QUERY = re.compile(r"[A-Za-z0-9_.=&-]{0,200}")
_NAME = re.compile(r"[\x20-\x7e]{1,200}")
#: The most objects and arrays a body may hold (its `{` and `[`, strings' included): a
#: conversation of a million-token context holds far fewer; each costs memory to read.
MOST_CONTAINERS = 1_000_000
#: The parameters that bound a call's completion, by API.
_COMPLETION_BOUNDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
#: The completion a call is expected to take when it names no bound and the run has
#: counted no longer one: a long answer's worth.
_COMPLETION_FLOOR = 4096
_BYTES_PER_TOKEN = 4

Kind = Literal["call", "count", "models"]


@dataclass(frozen=True)
class Refusal:
    """A request the relay does not pass on: its status and why."""

    status: int
    kind: str
    message: str


@dataclass(frozen=True)
class Call:
    """A request the relay passes on: what it is, and for a model call its API, model and
    whether its answer streams."""

    kind: Kind
    api: Api | None = None
    model: str | None = None
    stream: bool = False
    #: The body as it goes on (a streamed Chat Completions call asks for its usage).
    body: bytes = b""
    #: The most completion tokens the call asks for, when it names a bound.
    completion_bound: int | None = None


def route_of(method: str, target: str) -> tuple[Kind, Api | None] | Refusal:
    """Which of the relay's requests `method target` is, or why it is none."""
    path, _, query = target.partition("?")
    if "#" in target or "%" in path or not _QUERY.fullmatch(query):
        return Refusal(403, "permission_error", f"the relay does not pass on {target[:80]!r}")
    if method == "POST" and path in CALLS:
        return "call", CALLS[path]
    if method == "POST" and path == _COUNTS_TOKENS:
        return "count", "anthropic-messages"
    if method == "GET" and (
        path == _MODELS
        or (path.startswith(_MODELS + "/") and _MODEL_ID.fullmatch(path[len(_MODELS) + 1 :]))
    ):
        return "models", None
    return Refusal(
        403,
        "permission_error",
        f"the relay passes on model calls and the model list alone, not {method} {path[:80]}",
    )


def read_call(kind: Kind, api: Api | None, body: bytes, models: tuple[str, ...]) -> Call | Refusal:
    """The request's body checked as the relay's rules say (the module's docstring)."""
    if kind == "models":
        if body:
            return Refusal(400, "invalid_request_error", "a model list request has no body")
        return Call(kind)
    fields = _fields(body)
    if isinstance(fields, Refusal):
        return fields
    if api == "responses" and fields.get("background") not in (None, False):
        return Refusal(
            400, "invalid_request_error", "a background response is billed after its answer"
        )
    model, stream = fields.get("model"), fields.get("stream", False)
    if not isinstance(model, str):
        return Refusal(400, "invalid_request_error", "the body names no model (a string)")
    if model not in models:
        return Refusal(
            403, "permission_error", f"this token calls {models[0]!r} only, not {model[:100]!r}"
        )
    if not isinstance(stream, bool):
        return Refusal(400, "invalid_request_error", "`stream` is true or false, nothing else")
    sent = body
    if kind == "call" and api == "chat-completions" and stream:
        sent = _with_stream_usage(body, fields)
    return Call(kind, api, model, stream, sent, _completion_bound(fields))


def _fields(body: bytes) -> dict[str, Any] | Refusal:
    """The top-level members of a call's body, when it is one JSON object of plain,
    distinct names (ignoring case) and not too many objects and arrays to read."""
    if body.count(b"{") + body.count(b"[") > MOST_CONTAINERS:
        return Refusal(
            413, "invalid_request_error", f"more than {MOST_CONTAINERS} objects and arrays"
        )
    members = _members(body)
    if members is None:
        return Refusal(400, "invalid_request_error", "the body is not one JSON object")
    names = [name for name, _ in members]
    if not all(_NAME.fullmatch(name) for name in names):
        return Refusal(400, "invalid_request_error", "a member's name is not plain ASCII")
    if len({name.lower() for name in names}) != len(names):
        return Refusal(400, "invalid_request_error", "the body gives a member twice")
    return dict(members)


def _completion_bound(fields: dict[str, Any]) -> int | None:
    """The fewest completion tokens a call's bounds allow, when it names any."""
    bounds = [
        value
        for name in _COMPLETION_BOUNDS
        if isinstance(value := fields.get(name), int) and not isinstance(value, bool) and value > 0
    ]
    return min(bounds) if bounds else None


def expected_tokens(call: Call, longest_completion: int) -> tuple[int, int]:
    """(prompt, completion) tokens a call is expected to take before its answer says: its
    body's size for the prompt, its own bound for the completion, else the longest the run
    counted (at least a long answer's worth). An agent cannot lower what its next call is
    expected to take by the calls it made before."""
    prompt = len(call.body) // _BYTES_PER_TOKEN
    if call.completion_bound is not None:
        return prompt, call.completion_bound
    return prompt, max(_COMPLETION_FLOOR, longest_completion)


_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _members(body: bytes) -> list[tuple[str, Any]] | None:
    """The members of the one JSON object `body` is, in order (a name given twice
    twice), or None when it is not one. Each value is read by the C decoder (a value
    nested past Python's recursion limit fails so); only the top level is walked here."""
    try:
        text = body.decode("utf-8")
        at = _SPACE.match(text).end()  # type: ignore[union-attr]
        if text[at : at + 1] != "{":
            return None
        at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
        members: list[tuple[str, Any]] = []
        closed = text[at : at + 1] == "}"
        at += closed
        while not closed:
            if text[at : at + 1] != '"':
                return None
            name, at = json.decoder.scanstring(text, at + 1)  # type: ignore[attr-defined]
            at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
            if text[at : at + 1] != ":":
                return None
            at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
            value, at = _DECODER.raw_decode(text, at)
            members.append((name, value))
            at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
            closed = text[at : at + 1] == "}"
            if not closed and text[at : at + 1] != ",":
                return None
            at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
        if at != len(text):
            return None
    except (ValueError, RecursionError):
        return None
    return members


def _with_stream_usage(body: bytes, fields: dict[str, Any]) -> bytes:
    """A streamed Chat Completions call asking for its usage in its last chunk: the
    member put first when the body has no `stream_options`, else the body written again."""
    options = fields.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body
    if options is None and "stream_options" not in fields:
        start = body.index(b"{") + 1
        return body[:start] + b'"stream_options":{"include_usage":true},' + body[start:]
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    return json.dumps({**fields, "stream_options": options}).encode()
