"""The run's labels as OpenSandbox metadata and back. The server takes metadata only as
Kubernetes labels (a value of at most 63 letters, digits, `.`, `_` and `-`); a label whose
value is not one (an owner, `host:pid:...`; a task's name) is written in base32 across
numbered keys, and read back whole."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping

__all__ = ["from_metadata", "to_metadata"]

_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
#: A label written in parts: `<key>.b32-<n>`.
_PART = ".b32-"
_PART_SIZE = 60


def to_metadata(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels as metadata: as they are where the server takes them, else in parts."""
    metadata: dict[str, str] = {}
    for key, value in labels.items():
        if _VALUE.match(value) and _NAME.match(key) and _PART not in key:
            metadata[key] = value
            continue
        encoded = base64.b32encode(value.encode()).decode().rstrip("=").lower() or "0"
        for index in range(0, len(encoded), _PART_SIZE):
            metadata[f"{key}{_PART}{index // _PART_SIZE}"] = encoded[index : index + _PART_SIZE]
    return metadata


def from_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """Labels from metadata written by to_metadata (other keys come back as they are; a
    label whose parts do not read back is left out)."""
    labels: dict[str, str] = {}
    parts: dict[str, dict[int, str]] = {}
    for key, value in metadata.items():
        stem, marker, number = key.rpartition(_PART)
        if marker and number.isdigit():
            parts.setdefault(stem, {})[int(number)] = value
        else:
            labels[key] = value
    for stem, pieces in parts.items():
        if sorted(pieces) != list(range(len(pieces))):
            continue
        encoded = "".join(pieces[index] for index in range(len(pieces))).upper()
        if encoded == "0":
            labels[stem] = ""
            continue
        try:
            labels[stem] = base64.b32decode(encoded + "=" * (-len(encoded) % 8)).decode()
        except ValueError:
            continue
    return labels
