"""The run's labels as OpenSandbox metadata and back. The server takes metadata only as
Kubernetes labels (a value of at most 63 letters, digits, `.`, `_` and `-`); a label whose
value is not one (an owner, `host:pid:...`; a task's name) is written in base32 across
numbered keys, and read back whole.

The server also lists an image's own labels among a sandbox's metadata, and a task's
image is a stranger's: every label the provider writes has a key `<key>.enc` saying how
(`plain`, or `b32-<parts>`), which the image cannot change (what the provider writes
wins over an image's label of the same key). Only labels so marked are read back."""

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


#: The key beside each label that says how it is written.
_HOW = ".enc"


def to_metadata(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels as metadata: as they are where the server takes them, else in parts;
    each with its `.enc` key."""
    metadata: dict[str, str] = {}
    for key, value in labels.items():
        if _VALUE.match(value) and _NAME.match(key):
            metadata[key] = value
            metadata[key + _HOW] = "plain"
            continue
        encoded = base64.b32encode(value.encode()).decode().rstrip("=").lower() or "0"
        parts = [
            encoded[index : index + _PART_SIZE] for index in range(0, len(encoded), _PART_SIZE)
        ]
        for number, part in enumerate(parts):
            metadata[f"{key}{_PART}{number}"] = part
        metadata[key + _HOW] = f"b32-{len(parts)}"
    return metadata


def from_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """The labels to_metadata wrote (others, an image's, are left out; so is a label whose
    parts do not read back)."""
    labels: dict[str, str] = {}
    for marker, how in metadata.items():
        if not marker.endswith(_HOW):
            continue
        key = marker[: -len(_HOW)]
        if how == "plain":
            if key in metadata:
                labels[key] = metadata[key]
            continue
        count = how[4:] if how.startswith("b32-") else ""
        if not count.isdigit() or not 0 < int(count) <= 64:
            continue
        pieces = [metadata.get(f"{key}{_PART}{number}") for number in range(int(count))]
        if any(piece is None for piece in pieces):
            continue
        encoded = "".join(piece or "" for piece in pieces).upper()
        if encoded == "0":
            labels[key] = ""
            continue
        try:
            labels[key] = base64.b32decode(encoded + "=" * (-len(encoded) % 8)).decode()
        except ValueError:
            continue
    return labels
