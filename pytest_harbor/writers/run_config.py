"""`run_config_<agent>.yaml`: a run of one taskset as a file it can be run again from
(`pytest --harbor-config=FILE`). Its settings sit where a `--harbor-config` file keeps
them; the rest says which dataset (as given and as resolved), agent, model, repeats and
selection. Each entry carries a fingerprint, so an edited entry is named when read."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_harbor import strict_json
from pytest_harbor.redaction import Redactor
from pytest_harbor.settings import CONFIG_BLOCK
from pytest_harbor.writers.files import write_atomically

__all__ = [
    "RunConfigError",
    "RunRecord",
    "encode_name",
    "read_run_config",
    "run_config_name",
]

#: The section only a run config has (a settings file has only CONFIG_BLOCK).
RECORD_SECTION = "pytest_harbor"


class RunConfigError(Exception):
    """A run config that cannot be used as it is; names the file and the entry."""


def encode_name(name: str) -> str:
    """A taskset name as the seed writes it in instance names: each byte of its UTF-8
    other than an ASCII letter, digit or `-` as `_` and two hex digits."""
    return "".join(
        chr(byte)
        if chr(byte).isascii() and (chr(byte).isalnum() or byte == 0x2D)
        else f"_{byte:02x}"
        for byte in name.encode()
    )


def run_config_name(agent: str) -> str:
    """`run_config_<agent>.yaml`; an agent name that is not a plain file name (a recipe's
    path) is encoded as a taskset name is."""
    plain = all(c.isascii() and (c.isalnum() or c in "-_.") for c in agent) and agent[:1] != "."
    return f"run_config_{agent if plain and agent else encode_name(agent)}.yaml"


class Selection(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    only_tasks: list[str] = []
    exclude_tasks: list[str] = []
    #: pytest's `-k` and `-m` expressions, as given.
    keyword: str = ""
    markexpr: str = ""


class RunRecord(BaseModel):
    """What a run config records of one taskset's run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    taskset: str
    run_id: str
    pytest_harbor_version: str | None
    #: The `--harbor-dataset` value (a folder, absolute, or a reference).
    dataset: str
    #: A reference as resolved (commits, digests); None for a folder.
    reference: dict[str, Any] | None = None
    dataset_digest: str
    task_digests: dict[str, str]
    agent: str
    agent_options: dict[str, Any] = {}
    #: name, base_url, params and api_key_env; never the key.
    model: dict[str, Any] | None = None
    check: bool = False
    repeats: int
    sandbox: str
    pass_reward: float
    selection: Selection = Selection()
    #: The settings that differ from their defaults (secrets left out: see `secrets`).
    settings: dict[str, Any] = {}
    #: The names of the secrets the run had (never their values).
    secrets: list[str] = []
    #: Where each option or setting that differs from its default came from.
    sources: dict[str, str] = {}

    def sections(self) -> dict[str, Any]:
        """The file's content, minus the fingerprints."""
        name = encode_name(self.taskset)
        server, group, block = CONFIG_BLOCK
        return {
            server: {group: {block: dict(self.settings)}},
            f"harbor_{name}_environment": {
                "dataset": self.dataset,
                "reference": self.reference,
                "dataset_digest": self.dataset_digest,
                "task_digests": dict(self.task_digests),
                "repeats": self.repeats,
                "selection": self.selection.model_dump(),
                "sandbox": self.sandbox,
            },
            f"harbor_{name}_agent": {
                "harness": self.agent,
                "options": dict(self.agent_options),
                "model": self.model,
                "check": self.check,
                "pass_reward": self.pass_reward,
            },
            RECORD_SECTION: {
                "taskset": self.taskset,
                "run_id": self.run_id,
                "pytest_harbor_version": self.pytest_harbor_version,
                "secrets": list(self.secrets),
                "sources": dict(self.sources),
            },
        }

    def write(self, path: Path, redactor: Redactor) -> None:
        import yaml

        sections = redactor.data(self.sections())
        sections[RECORD_SECTION]["fingerprints"] = _fingerprints(sections)
        header = (
            f"# pytest-harbor run of taskset {self.taskset!r} ({self.run_id}).\n"
            f"# Run it again: pytest --harbor-config={path.name}\n"
            "# Each entry has a fingerprint below: an edited entry is refused when read.\n"
        )
        body = yaml.safe_dump(strict_json.finite(sections), sort_keys=False, allow_unicode=True)
        write_atomically(path, header + body)


def _entries(sections: dict[str, Any]) -> dict[str, Any]:
    """Every fingerprinted entry: each setting of the settings block, each key of the other
    sections (a section that is not a mapping is one entry)."""
    server, group, block = CONFIG_BLOCK
    entries: dict[str, Any] = {}
    for section, values in sections.items():
        path = section
        if section == server:
            # Down to the settings themselves, as far as the file has that shape.
            for part in (group, block):
                if not (isinstance(values, dict) and set(values) == {part}):
                    break
                values, path = values[part], f"{path}.{part}"
        if not isinstance(values, dict):
            entries[path] = values
            continue
        for key, value in values.items():
            if not (section == RECORD_SECTION and key == "fingerprints"):
                entries[f"{path}.{key}"] = value
    return entries


def _fingerprint(value: Any) -> str:
    text = strict_json.dumps(value, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _fingerprints(sections: dict[str, Any]) -> dict[str, str]:
    return {key: _fingerprint(value) for key, value in _entries(sections).items()}


def read_run_config(path: Path) -> RunRecord | None:
    """The record of the run config at `path`; None when the file is a settings file (no
    `pytest_harbor` section). An entry added, removed or changed since the run wrote the
    file is refused, named."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise RunConfigError(f"{path}: cannot be read as YAML: {error}") from None
    if not isinstance(data, dict) or RECORD_SECTION not in data:
        return None
    record = data[RECORD_SECTION]
    recorded = record.get("fingerprints") if isinstance(record, dict) else None
    if not isinstance(recorded, dict):
        raise RunConfigError(f"{path}: {RECORD_SECTION}.fingerprints is missing")
    now = _fingerprints(data)
    edited = sorted(key for key in set(now) | set(recorded) if now.get(key) != recorded.get(key))
    if edited:
        what = {
            key: "added" if key not in recorded else "removed" if key not in now else "changed"
            for key in edited
        }
        raise RunConfigError(
            f"{path}: edited after the run wrote it: "
            + ", ".join(f"{key} ({how})" for key, how in what.items())
            + ". A run config reproduces the run it records; to run otherwise, leave "
            "--harbor-config out and give the options you want"
        )
    return _record(path, data)


def _record(path: Path, data: dict[str, Any]) -> RunRecord:
    server, group, block = CONFIG_BLOCK
    record = data[RECORD_SECTION]
    name = encode_name(str(record.get("taskset", "")))
    environment = data.get(f"harbor_{name}_environment")
    agent = data.get(f"harbor_{name}_agent")
    if not isinstance(environment, dict) or not isinstance(agent, dict):
        raise RunConfigError(
            f"{path}: expected the sections harbor_{name}_environment and harbor_{name}_agent"
        )
    try:
        return RunRecord(
            taskset=record["taskset"],
            run_id=record["run_id"],
            pytest_harbor_version=record.get("pytest_harbor_version"),
            secrets=record.get("secrets") or [],
            sources=record.get("sources") or {},
            settings=((data.get(server) or {}).get(group) or {}).get(block) or {},
            dataset=environment["dataset"],
            reference=environment.get("reference"),
            dataset_digest=environment["dataset_digest"],
            task_digests=environment["task_digests"],
            repeats=environment["repeats"],
            selection=Selection.model_validate(environment.get("selection") or {}),
            sandbox=environment["sandbox"],
            agent=agent["harness"],
            agent_options=agent.get("options") or {},
            model=agent.get("model"),
            check=agent.get("check", False),
            pass_reward=agent["pass_reward"],
        )
    except (KeyError, TypeError) as error:
        raise RunConfigError(f"{path}: the entry {error.args[0]} is missing or malformed") from None
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise RunConfigError(f"{path}: {key}: {first['msg']}") from None
