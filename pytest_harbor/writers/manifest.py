"""`rollouts_manifest.json`: what a run of a taskset was, so a resumed run can check it is
the same run (targets, agent, settings, task folders)."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_harbor import strict_json
from pytest_harbor.redaction import Redactor
from pytest_harbor.settings import HarborSettings
from pytest_harbor.writers.files import write_atomically

__all__ = [
    "RUN_ONLY_SETTINGS",
    "ManifestError",
    "RunManifest",
    "dataset_digest",
    "read_manifest",
    "secrets_key",
]

#: Beside the results: the key of the secrets' fingerprint. Keep it out of anything shared.
SECRETS_KEY = ".secrets_key"

#: Settings that change how a run is scheduled or cleaned up, not what an episode does:
#: a resumed run may change them.
RUN_ONLY_SETTINGS = frozenset(
    {
        "max_concurrent_episodes",
        "queue_timeout_seconds",
        "cleanup_timeout_seconds",
        "sandbox_metadata",
    }
)


class ManifestError(Exception):
    """A manifest that cannot be read, naming the file."""


def dataset_digest(task_digests: Mapping[str, str], shared: str | None = None) -> str:
    """SHA-256 over the sorted records `task_id NUL digest LF` of the run's tasks, then,
    when the dataset's root shares files with its tasks, the record `NUL shared LF` of
    their digest."""
    hasher = hashlib.sha256()
    for task_id, digest in sorted(task_digests.items()):
        hasher.update(f"{task_id}\0{digest}\n".encode())
    if shared is not None:
        hasher.update(f"\0{shared}\n".encode())
    return hasher.hexdigest()


def _secrets_fingerprint(settings: HarborSettings, key: bytes) -> str:
    """HMAC-SHA256, keyed with the results folder's own random key, over the secrets'
    names and values: it tells two runs' secrets apart, and without the key it cannot be
    used to try guesses at a weak secret."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for name, value in sorted(settings.revealed_secrets().items()):
        mac.update(f"{name}\0{value}\n".encode())
    return mac.hexdigest()


def secrets_key(folder: Path) -> bytes:
    """The random key of a results folder (`.secrets_key`, readable by its owner only),
    made the first time it is asked for and kept across runs."""
    path = folder / SECRETS_KEY
    if path.is_file():
        return bytes.fromhex(path.read_text().strip())
    folder.mkdir(parents=True, exist_ok=True)
    key = os.urandom(32)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(key.hex() + "\n")
    return key


class RunManifest(BaseModel):
    """One taskset of one run. Secret values never appear: only a fingerprint of them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = 1
    run_id: str
    started_at: str
    target: str
    taskset: str
    agent: str
    sandbox: str
    repeats: int
    settings: dict[str, Any]
    secrets_fingerprint: str
    dataset_digest: str
    task_digests: dict[str, str]
    #: The model's name, URL and request parameters (never its key); None without one.
    model: dict[str, Any] | None = None
    #: The `--harbor-agent-option` values.
    agent_options: dict[str, Any] = {}
    #: SHA-256 of the dataset's dataset.toml (its [gym] table scales timeouts and
    #: resources, and overrides tasks), None without one.
    dataset_config_digest: str | None = None
    #: The digest of the files the dataset's root shares (`verifier.py`, `task_data.py`),
    #: None without them.
    dataset_files_digest: str | None = None
    #: The release that made the rows (what they hold and how they are graded).
    pytest_harbor_version: str | None = None
    #: A dataset by reference, as resolved: each task's repository, commit, folder and
    #: digest (None for a folder given by path).
    reference: dict[str, Any] | None = None

    @classmethod
    def describe(
        cls,
        *,
        run_id: str,
        started_at: str,
        target: Path | str,
        taskset: str,
        agent: str,
        sandbox: str,
        repeats: int,
        settings: HarborSettings,
        task_digests: Mapping[str, str],
        secrets_key: bytes = b"",
        model: Mapping[str, Any] | None = None,
        agent_options: Mapping[str, Any] | None = None,
        dataset_config: Path | None = None,
        dataset_files_digest: str | None = None,
        reference: Mapping[str, Any] | None = None,
    ) -> RunManifest:
        return cls(
            run_id=run_id,
            started_at=started_at,
            target=str(target),
            taskset=taskset,
            agent=agent,
            sandbox=sandbox,
            repeats=repeats,
            settings=settings.redacted(),
            secrets_fingerprint=_secrets_fingerprint(settings, secrets_key),
            dataset_digest=dataset_digest(task_digests, dataset_files_digest),
            task_digests=dict(task_digests),
            model=None if model is None else dict(model),
            agent_options=dict(agent_options or {}),
            dataset_config_digest=(
                hashlib.sha256(dataset_config.read_bytes()).hexdigest()
                if dataset_config is not None and dataset_config.is_file()
                else None
            ),
            dataset_files_digest=dataset_files_digest,
            pytest_harbor_version=_version(),
            reference=None if reference is None else dict(reference),
        )

    def differences(self, current: RunManifest) -> list[str]:
        """What keeps `current` from resuming this run, one sentence each (empty: none)."""
        found = [
            f"{name}: {getattr(self, name)!r} then, {getattr(current, name)!r} now"
            for name in ("target", "agent", "sandbox", "repeats")
            if getattr(self, name) != getattr(current, name)
        ]
        for name, what in (
            ("dataset_config_digest", "dataset.toml"),
            ("dataset_files_digest", "the dataset's verifier.py and task_data.py"),
            ("pytest_harbor_version", "pytest-harbor"),
        ):
            before, after = getattr(self, name), getattr(current, name)
            if before != after:
                found.append(f"{what}: {_short(before)} then, {_short(after)} now")
        for name in ("model", "agent_options"):
            before, after = getattr(self, name), getattr(current, name)
            if before != after:
                found.append(f"{name}: {_show(before)} then, {_show(after)} now")
        for key in sorted(set(self.settings) | set(current.settings)):
            if key in RUN_ONLY_SETTINGS or key == "secrets":
                continue
            before, after = self.settings.get(key), current.settings.get(key)
            if before != after:
                found.append(f"setting {key}: {_show(before)} then, {_show(after)} now")
        had, has = self.settings.get("secrets") or {}, current.settings.get("secrets") or {}
        if (had or has) and self.secrets_fingerprint != current.secrets_fingerprint:
            found.append("setting secrets: the names or values differ")
        for task_id in sorted(set(self.task_digests) & set(current.task_digests)):
            before, after = self.task_digests[task_id], current.task_digests[task_id]
            if before != after:
                found.append(
                    f"task folder {task_id} changed (digest {before[:12]} then, {after[:12]} now)"
                )
        return found

    def write(self, path: Path, redactor: Redactor) -> None:
        data = redactor.data(self.model_dump(mode="json"))
        write_atomically(path, strict_json.dumps(data, indent=2) + "\n")


def _version() -> str | None:
    try:
        return version("pytest-harbor")
    except PackageNotFoundError:
        return None


def _short(value: str | None) -> str:
    """A digest cut to a readable length, a version as it is, or `none`."""
    if value is None:
        return "none"
    return value[:12] if len(value) == 64 else value


def _show(value: Any) -> str:
    return strict_json.dumps(value, sort_keys=True)


def read_manifest(path: Path) -> RunManifest | None:
    """The manifest at `path`, or None when there is none."""
    if not path.is_file():
        return None
    try:
        return RunManifest.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as error:
        first = error.errors()[0]["msg"] if isinstance(error, ValidationError) else str(error)
        raise ManifestError(
            f"{path}: not a run manifest pytest-harbor can read ({first})"
        ) from None
