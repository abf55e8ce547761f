"""A task's own Compose file as written, read before Compose reads anything it names."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pytest_harbor.sandboxes.compose.model import (
    PROJECT,
    SERVICE,
    SERVICE_REFUSED,
    TOP_LEVEL_REFUSED,
    ComposeRefused,
    Reading,
    fields,
)

__all__ = ["check_source"]

#: A task's Compose file larger than this is refused before it is parsed.
MAX_SOURCE_BYTES = 1 << 20


class _Loader(yaml.SafeLoader):
    """YAML as Compose reads it: a tag (`!reset`, `!override`) is read as its plain value."""


def _untagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_Loader.add_multi_constructor("!", _untagged)


def check_source(task_path: Path, file: Path) -> None:
    """The task's own Compose file as written, before Compose reads anything it names:
    no `include` or `extends` of another file (Compose merges them and the canonical
    configuration no longer shows where they came from) and every `env_file` a file in the
    task folder, named without `${...}` (Compose reads it into `environment`)."""
    reading = Reading(file, task_path.resolve())
    data = _parsed(reading, file)
    if data is None:
        return
    for name in data:
        _check_top_level(reading, str(name))
    services = data.get("services")
    if not isinstance(services, Mapping):
        return
    for name, service in services.items():
        if isinstance(service, Mapping):
            _check_service(reading, file, f"services.{name}", service)


def _parsed(reading: Reading, file: Path) -> Mapping[Any, Any] | None:
    """The file as YAML (None when empty); refused when it is too large, does not parse
    or is not a mapping."""
    try:
        if file.stat().st_size > MAX_SOURCE_BYTES:
            reading.refuse("", f"is over {MAX_SOURCE_BYTES} bytes")
        data = yaml.load(file.read_text(errors="replace"), Loader=_Loader)
    except (OSError, yaml.YAMLError, ValueError, TypeError, RecursionError) as error:
        if isinstance(error, ComposeRefused):
            raise
        text = str(error).splitlines()[0] if str(error) else type(error).__name__
        reading.refuse("", f"does not parse as Compose: {text}")
    if data is not None and not isinstance(data, Mapping):
        reading.refuse("", "does not parse as Compose: not a mapping")
    return data


def _check_top_level(reading: Reading, key: str) -> None:
    if key in TOP_LEVEL_REFUSED:
        reading.refuse(key, f"{key} {TOP_LEVEL_REFUSED[key]}; refused")
    if key not in PROJECT and key != "version" and not key.startswith("x-"):
        reading.refuse(key, f"{key} is not supported (supported: {', '.join(PROJECT)})")


def _check_service(reading: Reading, file: Path, where: str, service: Mapping[Any, Any]) -> None:
    """A service's keys as written: each one known, no `extends` of another file, and its
    env_files in the task folder."""
    for option in service:
        known = option in SERVICE or option == "extends"
        if not known and not str(option).startswith("x-"):
            fields(SERVICE, SERVICE_REFUSED)(reading, {option: None}, where)
    extends = service.get("extends")
    if isinstance(extends, Mapping) and "file" in extends:
        reading.refuse(
            f"{where}.extends.file",
            "extends a service of another file, which may lie outside the task folder "
            "(only a service of the same file); refused",
        )
    _env_files(reading, file.parent, service.get("env_file"), f"{where}.env_file")


def _env_files(reading: Reading, base: Path, value: Any, key: str) -> None:
    entries = value if isinstance(value, list) else [] if value is None else [value]
    for index, entry in enumerate(entries):
        where = f"{key}[{index}]" if isinstance(value, list) else key
        path = entry.get("path") if isinstance(entry, Mapping) else entry
        if not isinstance(path, str) or "$" in path:
            reading.refuse(where, f"env_file {path!r}: a path in the task folder, without ${{...}}")
        reading.inside(where, path, "env_file", base)
