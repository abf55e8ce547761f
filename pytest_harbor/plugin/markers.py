"""Markers from a task's `[metadata]`: `difficulty_easy`, `category_<c>`, `tag_<t>`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["metadata_markers"]


def metadata_markers(metadata: Mapping[str, Any]) -> list[str]:
    """Marker names for `difficulty` (one value), `category` and `tags` (one or several).

    Values become marker-name-safe: lower case, runs of other characters than letters,
    digits and `_` turned into one `_`. `difficulty = "Very Hard"` gives
    `difficulty_very_hard`; `tags = ["multi-key"]` gives `tag_multi_key`.
    """
    names: list[str] = []
    for key, prefix in (("difficulty", "difficulty"), ("category", "category"), ("tags", "tag")):
        values = metadata.get(key)
        if values is None:
            continue
        for value in values if isinstance(values, list | tuple) else [values]:
            part = _safe(str(value))
            if part:
                names.append(f"{prefix}_{part}")
    return list(dict.fromkeys(names))


def _safe(value: str) -> str:
    return re.sub(r"[^0-9a-z_]+", "_", value.lower()).strip("_")
