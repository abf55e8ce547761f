"""The model a harness talks to: an OpenAI-compatible endpoint, and the check that it
answers before any episode starts."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from pytest_harbor.redaction import Redactor, clip_head
from pytest_harbor.untrusted import load_json

__all__ = [
    "DEFAULT_API_KEY_ENV",
    "ModelConfig",
    "ModelEndpointError",
    "check_endpoint",
    "endpoint_words",
]

#: The environment variable the API key is read from unless another is named.
DEFAULT_API_KEY_ENV = "HARBOR_MODEL_API_KEY"
_BODY_EXCERPT = 300
#: The Anthropic Messages API's version the checks before a run ask with.
ANTHROPIC_VERSION = "2023-06-01"


class ModelConfig(BaseModel):
    """A Chat Completions model: its name, base URL (ending in `/v1`), request parameters
    and key. The key never leaves this object except in the `Authorization` header."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    base_url: str
    #: Sent with every request (temperature, max_tokens, seed, top_p, reasoning_effort...).
    params: dict[str, Any] = {}
    api_key: SecretStr | None = Field(default=None, repr=False, exclude=True)
    #: At most this many requests at once, across every process of the run on this host.
    max_concurrent_requests: int = Field(default=16, ge=1)
    #: The base URL an agent inside the sandbox reaches the same model at (the relay's
    #: route into the sandbox); None: `base_url`.
    sandbox_base_url: str | None = Field(default=None, exclude=True)

    @property
    def url_in_sandbox(self) -> str:
        """The base URL an agent inside the sandbox is given."""
        return self.sandbox_base_url or self.base_url

    @field_validator("base_url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value.rstrip("/")

    def identity(self) -> dict[str, Any]:
        """What makes two runs use the same model (the key is not part of it)."""
        return {"name": self.name, "base_url": self.base_url, "params": dict(self.params)}

    @property
    def chat_url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def models_url(self) -> str:
        return f"{self.base_url}/models"

    def headers(self, api: str = "chat-completions") -> dict[str, str]:
        """The headers of a request with the key; of the Anthropic Messages API (`api`),
        with its version and the key as it takes it too."""
        headers = {"Content-Type": "application/json"}
        if self.api_key is not None:
            headers["Authorization"] = f"Bearer {self.api_key.get_secret_value()}"
        if api == "anthropic-messages":
            headers["anthropic-version"] = ANTHROPIC_VERSION
            if self.api_key is not None:
                headers["x-api-key"] = self.api_key.get_secret_value()
        return headers

    def secret_values(self) -> list[str]:
        return [] if self.api_key is None else [self.api_key.get_secret_value()]


class ModelEndpointError(Exception):
    """The endpoint cannot serve the model: unreachable, refused, or does not list it."""


def check_endpoint(
    model: ModelConfig, *, timeout_s: float = 30.0, api: str = "chat-completions"
) -> None:
    """GET `{base_url}/models` with the key; the model must be among those listed. An
    `anthropic-messages` endpoint gets the key as Anthropic's API takes it, too."""
    import urllib.error  # only a run whose harness talks to a model asks
    import urllib.request

    headers = model.headers(api)
    request = urllib.request.Request(model.models_url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        excerpt = endpoint_words(error.read(), model)
        raise ModelEndpointError(
            f"GET {model.models_url} answered {error.code} "
            f"{endpoint_words(str(error.reason), model, error_only=False)}"
            + (f": {excerpt}" if excerpt else "")
            + _hint(error.code)
        ) from None
    except (urllib.error.URLError, OSError) as error:
        reason = endpoint_words(str(getattr(error, "reason", error)), model, error_only=False)
        raise ModelEndpointError(f"cannot reach {model.models_url}: {reason}") from None
    try:
        listed = [str(entry["id"]) for entry in load_json(body).value["data"]]
    except (ValueError, KeyError, TypeError):
        raise ModelEndpointError(
            f"GET {model.models_url} did not answer with a model list "
            f'(expected {{"data": [{{"id": ...}}]}}): '
            f"{endpoint_words(body, model, error_only=False)}"
        ) from None
    if model.name not in listed:
        shown = ", ".join(listed[:20]) + (" ..." if len(listed) > 20 else "")
        raise ModelEndpointError(
            f"{model.models_url} does not list the model {model.name!r}; it lists: "
            f"{shown or '(nothing)'}"
        )


def endpoint_words(body: bytes | str, model: ModelConfig, *, error_only: bool = True) -> str:
    """The endpoint's own words, fit for one line of a message: an error body's message
    (OpenAI's and Anthropic's `error.message`, vLLM's `message`), else the body's start
    (`error_only=False`: the body's start whatever it holds); the key masked, control
    characters and line breaks escaped, at most _BODY_EXCERPT characters."""
    text = (body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body).strip()
    found = load_json(text).value if error_only else None
    if isinstance(found, dict):
        error = found.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if not isinstance(message, str) or not message:
            message = found.get("message")
        if isinstance(message, str) and message:
            text = message
    redactor = Redactor(model.secret_values())
    shown = redactor.shown(text).replace("\n", "\\n").replace("\t", "\\t")
    return redactor.text(clip_head(shown, _BODY_EXCERPT))


def _hint(status: int) -> str:
    if status in (401, 403):
        return " (check the API key: --harbor-model-api-key-env names the variable it is in)"
    if status == 404:
        return " (the base URL should end in /v1, as http://host:8000/v1)"
    return ""
