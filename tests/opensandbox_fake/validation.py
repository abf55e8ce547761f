"""Request validation of the lifecycle API (pydantic's 422 and the service's 400), and
the reading of resource limits and image references."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tests.opensandbox_fake.egress import egress_refusal, parse_policy
from tests.opensandbox_fake.labels import RESERVED_PREFIX
from tests.opensandbox_fake.wire import _error, _HttpError


def _detail(kind: str, loc: list[str | int], msg: str, given: object) -> dict[str, object]:
    return {"type": kind, "loc": loc, "msg": msg, "input": given}


def _unprocessable(details: list[dict[str, object]]) -> _HttpError:
    return _HttpError(422, {"detail": details})


@dataclass(frozen=True)
class _CreateRequest:
    image_uri: str
    image_auth: dict[str, str] | None
    entrypoint: list[str]
    timeout: int | None
    resource_limits: dict[str, str]
    env: dict[str, str | None]
    metadata: dict[str, str] | None
    #: The sandbox's egress policy, checked (None: no sidecar).
    network_policy: dict[str, Any] | None = None


def _string_map(
    body: dict[str, Any], name: str, errors: list[dict[str, object]], *, nullable: bool = False
) -> dict[str, Any] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        errors.append(
            _detail("dict_type", ["body", name], "Input should be a valid dictionary", value)
        )
        return None
    for key, item in value.items():
        if item is None and nullable:
            continue
        if not isinstance(item, str):
            msg = "Input should be a valid string"
            errors.append(_detail("string_type", ["body", name, key], msg, item))
    return value


def _timeout(value: object, minimum: int, errors: list[dict[str, object]]) -> int | None:
    """pydantic's lax int: an int, an integral float or a string of digits; at least minimum."""
    if value is None:
        return None
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif (isinstance(value, float) and value.is_integer()) or (
        isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value)
    ):
        number = int(value)
    if number is None:
        msg = "Input should be a valid integer"
        errors.append(_detail("int_type", ["body", "timeout"], msg, value))
        return None
    if number < minimum:
        msg = f"Input should be greater than or equal to {minimum}"
        detail = _detail("greater_than_equal", ["body", "timeout"], msg, value)
        detail["ctx"] = {"ge": minimum}
        errors.append(detail)
        return None
    return number


def _parse_create(body: object, min_timeout_s: int, egress: bool = False) -> _CreateRequest:
    """The checks of CreateSandboxRequest (schema.py) and of create_sandbox, in their order."""
    if not isinstance(body, dict):
        msg = "Input should be a valid dictionary or object to extract fields from"
        raise _unprocessable([_detail("model_attributes_type", ["body"], msg, body)])
    errors: list[dict[str, object]] = []
    uri = ""
    auth: dict[str, str] | None = None
    image = body.get("image")
    if image is not None:
        if not isinstance(image, dict):
            msg = "Input should be a valid dictionary or object to extract fields from"
            errors.append(_detail("model_attributes_type", ["body", "image"], msg, image))
        elif "uri" not in image:
            errors.append(_detail("missing", ["body", "image", "uri"], "Field required", image))
        elif not isinstance(image["uri"], str):
            msg = "Input should be a valid string"
            errors.append(_detail("string_type", ["body", "image", "uri"], msg, image["uri"]))
        else:
            uri = image["uri"]
            if isinstance(image.get("auth"), dict):
                auth = {
                    k: str(v) for k, v in image["auth"].items() if k in ("username", "password")
                }
    snapshot = body.get("snapshotId")
    if snapshot is not None and not isinstance(snapshot, str):
        msg = "Input should be a valid string"
        errors.append(_detail("string_type", ["body", "snapshotId"], msg, snapshot))
    timeout = _timeout(body.get("timeout"), min_timeout_s, errors)
    limits = _string_map(body, "resourceLimits", errors)
    env = _string_map(body, "env", errors, nullable=True)
    metadata = _string_map(body, "metadata", errors)
    extensions = _string_map(body, "extensions", errors)
    entrypoint = body.get("entrypoint")
    if entrypoint is not None:
        if not isinstance(entrypoint, list):
            msg = "Input should be a valid list"
            errors.append(_detail("list_type", ["body", "entrypoint"], msg, entrypoint))
        elif not entrypoint:
            msg = "List should have at least 1 item after validation, not 0"
            errors.append(_detail("too_short", ["body", "entrypoint"], msg, entrypoint))
        else:
            for index, item in enumerate(entrypoint):
                if not isinstance(item, str):
                    msg = "Input should be a valid string"
                    errors.append(_detail("string_type", ["body", "entrypoint", index], msg, item))
    if errors:
        raise _unprocessable(errors)

    pool_ref = str((extensions or {}).get("poolRef") or "").strip()
    if pool_ref:
        raise _error(
            400,
            "SANDBOX::UNSUPPORTED_POOL_REF",
            "poolRef is not supported by the Docker provider. "
            "Use Kubernetes BatchSandbox provider instead.",
        )
    has_image = bool(uri.strip())
    has_snapshot = bool((snapshot or "").strip())
    for broken, message in (
        (has_image == has_snapshot, "Exactly one of image or snapshotId must be provided."),
        (has_image and not entrypoint, "Entrypoint is required when image is provided."),
        (limits is None, "resourceLimits is required when poolRef is not provided."),
    ):
        if broken:
            detail = _detail("value_error", ["body"], f"Value error, {message}", body)
            detail["ctx"] = {"error": {}}
            raise _unprocessable([detail])
    if has_snapshot:
        raise _error(
            400, "SANDBOX::API_NOT_SUPPORTED", "snapshotId is not supported by this server."
        )
    _check_metadata(metadata)
    if body.get("platform") is not None:
        raise _error(400, "SANDBOX::INVALID_PARAMETER", "platform is not supported by this server.")
    if body.get("secureAccess"):
        raise _error(
            400,
            "SANDBOX::INVALID_PARAMETER",
            "secureAccess is only supported by the Kubernetes runtime with gateway ingress.",
        )
    policy = None
    if body.get("networkPolicy"):
        if not egress:
            raise egress_refusal()
        try:
            policy = parse_policy(body["networkPolicy"])
        except ValueError as error:
            raise _error(400, "SANDBOX::INVALID_PARAMETER", str(error)) from None
    if body.get("volumes"):
        raise _error(
            400, "VOLUME::UNSUPPORTED_BACKEND", "volumes are not supported by this server."
        )
    assert isinstance(entrypoint, list)
    return _CreateRequest(
        image_uri=uri,
        image_auth=auth,
        entrypoint=[str(item) for item in entrypoint],
        timeout=timeout,
        resource_limits=dict(limits or {}),
        env=dict(env or {}),
        metadata=None if metadata is None else dict(metadata),
        network_policy=policy,
    )


_DNS_SUBDOMAIN = re.compile(r"^(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def _valid_label_key(key: str) -> bool:
    name = key
    if "/" in key:
        prefix, name = key.split("/", 1)
        if not prefix or not name or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
            return False
    return len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _check_metadata(metadata: dict[str, str] | None) -> None:
    """Kubernetes label syntax for keys and values; the opensandbox.io/ prefix is reserved."""
    code = "SANDBOX::INVALID_METADATA_LABEL"
    for key, value in (metadata or {}).items():
        if key.startswith(RESERVED_PREFIX):
            raise _error(
                400,
                code,
                f"Metadata key '{key}' uses the reserved prefix '{RESERVED_PREFIX}'. Keys under "
                "this prefix are managed by the system and cannot be set via metadata.",
            )
        if not _valid_label_key(key):
            raise _error(400, code, f"Metadata key '{key}' is invalid.")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise _error(400, code, f"Metadata value '{value}' is invalid.")


_MEMORY = re.compile(r"^\s*(\d+)([kmgti]i?|[kmgti]?b)?\s*$", re.IGNORECASE)
_MEMORY_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "ki": 2**10, "m": 10**6, "mb": 10**6}
_MEMORY_UNITS |= {"mi": 2**20, "g": 10**9, "gb": 10**9, "gi": 2**30, "t": 10**12}
_MEMORY_UNITS |= {"tb": 10**12, "ti": 2**40}


def _memory_bytes(value: str | None) -> int | None:
    """Memory ("512Mi", "1Gi", "1000M") as bytes; what does not parse is ignored."""
    match = _MEMORY.match(value or "")
    if not match:
        return None
    return int(match[1]) * _MEMORY_UNITS[(match[2] or "").lower()]


def _nano_cpus(value: str | None) -> int | None:
    """CPUs as nano CPUs ("500m" → 5e8, "2" → 2e9); what does not parse is ignored."""
    text = (value or "").strip().lower()
    if not text:
        return None
    try:
        cpus = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        return None
    return int(cpus * 1_000_000_000) if cpus > 0 else None


def _names_a_registry(uri: str) -> bool:
    """Whether the image reference starts with a registry host (has "." or ":", or is
    localhost), as Docker reads references."""
    first, slash, _ = uri.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


def _query_int(values: dict[str, str], name: str, default: int, low: int, high: int | None) -> int:
    """A FastAPI integer query parameter with bounds: 422 when it is not one or is outside."""
    if name not in values:
        return default
    text = values[name]
    try:
        number = int(text)
    except ValueError:
        msg = "Input should be a valid integer, unable to parse string as an integer"
        raise _unprocessable([_detail("int_parsing", ["query", name], msg, text)]) from None
    if number < low:
        detail = _detail(
            "greater_than_equal",
            ["query", name],
            f"Input should be greater than or equal to {low}",
            text,
        )
        detail["ctx"] = {"ge": low}
        raise _unprocessable([detail])
    if high is not None and number > high:
        detail = _detail(
            "less_than_equal",
            ["query", name],
            f"Input should be less than or equal to {high}",
            text,
        )
        detail["ctx"] = {"le": high}
        raise _unprocessable([detail])
    return number
