"""A Chat Completions client for host-side agents, on httpx: requests under the run's cap,
retries of rate limits, server and connection errors with backoff (honouring
`Retry-After`), and every failure classified as a cause of the harness contract."""

from __future__ import annotations

import email.utils
import json
import random
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from pytest_harbor.agent_outcomes import ENDPOINT_ERROR, AgentCause, EndpointError
from pytest_harbor.display import harbor_logger
from pytest_harbor.harnesses.base import Deadline, ModelGate, Usage
from pytest_harbor.harnesses.model import ModelConfig
from pytest_harbor.redaction import Redactor
from pytest_harbor.strict_json import as_float
from pytest_harbor.untrusted import load_json

__all__ = ["ChatClient", "ChatError", "ChatReply", "OutOfTime", "RetryPolicy", "UsageMeter"]

#: What endpoints say when the prompt does not fit (OpenAI's code, vLLM, SGLang, LiteLLM,
#: Anthropic-style proxies).
_CONTEXT_LENGTH = re.compile(
    r"context[_ ]length|context window|maximum context|too many tokens|prompt is too long"
    r"|longer than the model|exceeds? the (model'?s? )?(maximum|context)",
    re.IGNORECASE,
)
_BODY_EXCERPT = 500

log = harbor_logger()


class ChatError(Exception):
    """A request that failed for good (after any retries), with its cause."""

    def __init__(self, cause: AgentCause, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.cause: AgentCause = cause
        self.message = message
        self.status_code = status_code


class OutOfTime(Exception):
    """The turn's deadline passed, or it was cancelled, before an answer came."""


@dataclass(frozen=True)
class RetryPolicy:
    """At most `attempts` tries of one request; waits `base_s`, doubling up to `max_s`,
    with up to a quarter more at random, unless the endpoint says `Retry-After`."""

    attempts: int = 6
    base_s: float = 1.0
    max_s: float = 60.0

    def wait_s(self, retry: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return retry_after
        wait: float = min(self.max_s, self.base_s * 2**retry)
        return wait * (1 + random.random() / 4)


@dataclass(frozen=True)
class ChatReply:
    """The first choice's message of one completion."""

    message: dict[str, Any]
    finish_reason: str | None
    usage: Usage


class UsageMeter:
    """Adds up a turn's usage: every request sent, the tokens of every answer."""

    def __init__(self) -> None:
        self.usage = Usage()

    def add(self, usage: Usage) -> None:
        self.usage = self.usage + usage


class ChatClient:
    """One connection pool to the endpoint, shared by the sessions of a process."""

    def __init__(
        self,
        model: ModelConfig,
        *,
        retry: RetryPolicy,
        request_timeout_s: float,
        redactor: Redactor,
    ) -> None:
        self.model = model
        self.retry = retry
        self.request_timeout_s = request_timeout_s
        self.redactor = redactor
        self._http = httpx.Client(headers=model.headers())

    def close(self) -> None:
        self._http.close()

    def complete(
        self,
        body: dict[str, Any],
        *,
        deadline: Deadline,
        cancel: threading.Event,
        gate: ModelGate,
        meter: UsageMeter,
        headers: Mapping[str, str] | None = None,
    ) -> ChatReply:
        """POST the body to `/chat/completions` (with `headers` over the client's own: a
        session's key, the token of its episode in a run); retry what may pass; raise
        ChatError for a failure, OutOfTime when the deadline or `cancel` comes first."""
        payload = json.dumps(body).encode()
        for attempt in range(self.retry.attempts):
            try:
                return self._once(
                    payload,
                    deadline=deadline,
                    cancel=cancel,
                    gate=gate,
                    meter=meter,
                    headers=headers,
                )
            except _Retryable as error:
                last = error
            except ChatError as error:
                _tell(error, attempt + 1, self.retry.attempts, None)
                raise
            if attempt == self.retry.attempts - 1:
                break
            wait = self.retry.wait_s(attempt, last.retry_after)
            if wait >= deadline.remaining():
                raise ChatError(
                    last.cause,
                    f"{last.message}; waiting {wait:g} s to try again would pass the deadline",
                    last.status_code,
                )
            _tell(last, attempt + 1, self.retry.attempts, wait)
            if cancel.wait(wait):
                raise OutOfTime()
        raise ChatError(
            last.cause,
            f"{last.message} (after {self.retry.attempts} attempts)",
            last.status_code,
        )

    def _once(
        self,
        payload: bytes,
        *,
        deadline: Deadline,
        cancel: threading.Event,
        gate: ModelGate,
        meter: UsageMeter,
        headers: Mapping[str, str] | None,
    ) -> ChatReply:
        if cancel.is_set() or deadline.expired:
            raise OutOfTime()
        remaining = deadline.remaining()
        slot = gate.acquire(remaining)
        if slot is None:
            raise OutOfTime()
        try:
            if cancel.is_set() or deadline.expired:
                raise OutOfTime()
            meter.add(Usage(requests=1))
            remaining = deadline.remaining()
            response = self._http.post(
                self.model.chat_url,
                content=payload,
                headers=headers,
                timeout=min(self.request_timeout_s, remaining),
            )
        except httpx.TimeoutException as error:
            # Cut short by the turn's deadline, not by the endpoint's slowness alone.
            if remaining <= self.request_timeout_s or cancel.is_set():
                raise OutOfTime() from None
            raise _Retryable(
                "api_error", f"the request to {self.model.chat_url} timed out ({error})"
            ) from None
        except httpx.TransportError as error:
            raise _Retryable(
                "api_error", f"cannot reach {self.model.chat_url}: {self._mask(str(error))}"
            ) from None
        finally:
            slot.release()
        return self._read(response, meter)

    def _read(self, response: httpx.Response, meter: UsageMeter) -> ChatReply:
        status = response.status_code
        if status == 429:
            raise _Retryable(
                "rate_limited",
                f"rate limited (HTTP 429): {self._error_text(response)}",
                status,
                _retry_after(response),
            )
        if status >= 500:
            raise _Retryable(
                "api_error",
                f"the endpoint failed (HTTP {status}): {self._error_text(response)}",
                status,
                _retry_after(response),
            )
        if status >= 400:
            text = self._error_text(response)
            if _CONTEXT_LENGTH.search(text) or _error_code(response) == "context_length_exceeded":
                raise ChatError(
                    "context_length_exceeded",
                    f"the context overflowed (HTTP {status}): {text}",
                    status,
                )
            raise ChatError(
                "api_error", f"the endpoint refused the request (HTTP {status}): {text}", status
            )
        try:
            data, problem = load_json(response.content)
            if problem is not None:
                raise ValueError(f"the body {problem}")
            choice = data["choices"][0]
            message = choice["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise _Retryable(
                "api_error",
                f"the endpoint's answer is not a chat completion ({error}): "
                f"{self._mask(response.text[:_BODY_EXCERPT])}",
                status,
            ) from None
        usage = _usage(data.get("usage"), response)
        meter.add(usage)
        return ChatReply(message=message, finish_reason=choice.get("finish_reason"), usage=usage)

    def _error_text(self, response: httpx.Response) -> str:
        error = _error(response)
        text = error.get("message") if isinstance(error, dict) else error
        if not text:
            # vLLM's error body holds its message at the top.
            data = load_json(response.content).value
            text = data.get("message") if isinstance(data, dict) else None
        if not text:
            text = response.text
        return self._mask(str(text).strip()[:_BODY_EXCERPT] or response.reason_phrase)

    def _mask(self, text: str) -> str:
        return self.redactor.text(text)


class _Retryable(Exception):
    def __init__(
        self,
        cause: AgentCause,
        message: str,
        status_code: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.cause: AgentCause = cause
        self.message = message
        self.status_code = status_code
        self.retry_after = retry_after


def _tell(error: _Retryable | ChatError, attempt: int, attempts: int, wait: float | None) -> None:
    """A request the endpoint failed (tried again after `wait`, or not at all), logged as
    an EndpointError: the run shows it on the terminal at once."""
    if isinstance(error, ChatError) and (
        error.status_code is None or error.cause == "context_length_exceeded"
    ):
        return  # a failure of its own, or a prompt the model cannot take
    told = EndpointError(
        scope="request",
        status=error.status_code,
        message=error.message,
        attempt=attempt,
        attempts=attempts,
        retry_in_s=wait,
    )
    log.warning("%s", told.line("shell-agent"), extra={ENDPOINT_ERROR: told})


def _retry_after(response: httpx.Response) -> float | None:
    """`Retry-After` as seconds or as an HTTP date; None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _error(response: httpx.Response) -> Any:
    """The `error` member of an error body (None when the body is not such an object)."""
    data = load_json(response.content).value
    return data.get("error") if isinstance(data, dict) else None


def _error_code(response: httpx.Response) -> str | None:
    error = _error(response)
    return str(error.get("code")) if isinstance(error, dict) else None


def _usage(data: Any, response: httpx.Response) -> Usage:
    cost: float | None = None
    prompt = completion = 0
    if isinstance(data, dict):
        prompt = _count(data.get("prompt_tokens"))
        completion = _count(data.get("completion_tokens"))
        cost = as_float(data.get("cost"))
    header = response.headers.get("x-litellm-response-cost")
    if cost is None and header is not None:
        try:
            cost = as_float(float(header))
        except ValueError:
            cost = None
    return Usage(prompt_tokens=prompt, completion_tokens=completion, cost_usd=cost)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0
