"""References made into folders: each task fetched once into the cache, checked by its
digest whenever it is used again, and a folder per taskset made of them for the run."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from pytest_harbor.atomic import write_atomically
from pytest_harbor.datasets.files import tree_digest
from pytest_harbor.datasets.git import GitError, GitStore
from pytest_harbor.datasets.models import PinnedTask, ResolvedDataset
from pytest_harbor.datasets.references import (
    GitReference,
    RegistryReference,
    parse_reference,
    taskset_name_error,
)
from pytest_harbor.datasets.registry import (
    RegistryError,
    RegistryTask,
    find_dataset,
    read_registry,
)
from pytest_harbor.locks import held
from pytest_harbor.untrusted import load_json

__all__ = ["DatasetCache"]


class DatasetCache:
    """The cache folder: `repos/` (git objects), `tasks/` (one folder per URL, commit and
    path, with its digest), `views/` (a folder per resolved taskset), `registries/`."""

    def __init__(self, root: Path, warn: Callable[[str], None]) -> None:
        self.root = root
        self._warn = warn
        self.git = GitStore(root, warn)

    def resolve(self, given: str, registry: str) -> ResolvedDataset:
        """Raises ReferenceError, RegistryError or GitError for what spoils the whole
        reference; a registry task that cannot be fetched is `refused`, the others run."""
        reference = parse_reference(given)
        self.root.mkdir(parents=True, exist_ok=True)
        if isinstance(reference, RegistryReference):
            return self._registry_dataset(reference, registry)
        return self._git_dataset(reference)

    def pinned(self, recorded: ResolvedDataset) -> ResolvedDataset:
        """A recorded resolution made again from its commits (no branch is resolved, no
        registry read): a run config's dataset."""
        if recorded.kind == "git":
            task = recorded.tasks[0]
            return self._git_view(recorded, task)
        return self._registry_view(recorded, list(recorded.tasks), dict(recorded.refused))

    def _registry_dataset(self, reference: RegistryReference, registry: str) -> ResolvedDataset:
        datasets = read_registry(registry, self.root, self._warn)
        dataset = find_dataset(datasets, reference, registry)
        names = [task.name for task in dataset.tasks]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise RegistryError(
                f"{reference.given}: the registry {registry} lists the task {twice[0]!r} "
                f"twice in {dataset.name}@{dataset.version} (task names are folder names)"
            )
        pinned: list[PinnedTask] = []
        refused: dict[str, str] = {}
        for task in dataset.tasks:
            problem = _task_problem(task)
            if problem is None:
                try:
                    assert task.git_url is not None
                    commit = self.git.resolve(task.git_url, task.git_commit_id)
                except GitError as error:
                    problem = str(error)
                else:
                    ref = None if commit == task.git_commit_id else task.git_commit_id
                    pinned.append(
                        PinnedTask(
                            name=task.name,
                            git_url=task.git_url,
                            ref=ref,
                            git_commit_id=commit,
                            path=task.path.strip("/"),
                        )
                    )
            if problem is not None:
                refused[task.name] = problem
        resolved = ResolvedDataset(
            given=reference.given,
            kind="registry",
            name=dataset.name,
            registry=registry,
            version=dataset.version,
            folder="",
            tasks=pinned,
        )
        return self._registry_view(resolved, pinned, refused)

    def _registry_view(
        self, resolved: ResolvedDataset, tasks: list[PinnedTask], refused: dict[str, str]
    ) -> ResolvedDataset:
        cached: list[PinnedTask] = []
        for task in tasks:
            try:
                cached.append(self._cached(task))
            except GitError as error:
                refused[task.name] = str(error)
        view = self._view(resolved.name, cached, one_folder=False)
        return resolved.model_copy(
            update={"folder": str(view), "tasks": cached, "refused": refused}
        )

    def _git_dataset(self, reference: GitReference) -> ResolvedDataset:
        commit = self.git.resolve(reference.url, reference.ref)
        task = PinnedTask(
            name=reference.name,
            git_url=reference.url,
            ref=None if commit == reference.ref else reference.ref,
            git_commit_id=commit,
            path=reference.path,
        )
        resolved = ResolvedDataset(
            given=reference.given, kind="git", name=reference.name, folder="", tasks=[task]
        )
        return self._git_view(resolved, task)

    def _git_view(self, resolved: ResolvedDataset, task: PinnedTask) -> ResolvedDataset:
        cached = self._cached(task)
        view = self._view(resolved.name, [cached], one_folder=True)
        return resolved.model_copy(update={"folder": str(view), "tasks": [cached]})

    def _entry(self, task: PinnedTask) -> Path:
        key = f"{task.git_url}\0{task.git_commit_id}\0{task.path}"
        return self.root / "tasks" / hashlib.sha256(key.encode()).hexdigest()[:24]

    def _cached(self, task: PinnedTask) -> PinnedTask:
        """The task's folder in the cache, fetched when missing and fetched again when its
        content no longer matches the digest it had when fetched (said in a warning)."""
        entry = self._entry(task)
        entry.parent.mkdir(parents=True, exist_ok=True)
        with held(entry.with_suffix(".lock")):
            record = _read_json(entry / "entry.json")
            if record is not None and (entry / "tree").is_dir():
                now = tree_digest(entry / "tree")
                if now == record.get("digest"):
                    return _checked(task, now)
                self._warn(
                    f"the cached copy of {task.name} ({task.git_url} at "
                    f"{task.git_commit_id[:12]}: {task.path or '(top)'}) changed since it was "
                    f"fetched (digest {str(record.get('digest'))[7:19]} then, {now[7:19]} now); "
                    f"fetched again into {entry}"
                )
            shutil.rmtree(entry, ignore_errors=True)
            entry.mkdir()
            self.git.fetch(task.git_url, task.git_commit_id)
            self.git.export(task.git_url, task.git_commit_id, task.path, entry / "tree")
            digest = tree_digest(entry / "tree")
            record = {
                "git_url": task.git_url,
                "git_commit_id": task.git_commit_id,
                "path": task.path,
                "digest": digest,
            }
            write_atomically(entry / "entry.json", json.dumps(record, indent=2) + "\n")
            return _checked(task, digest)

    def _view(self, name: str, tasks: list[PinnedTask], *, one_folder: bool) -> Path:
        """`views/<key>/<name>/`: for a registry dataset, a folder of its tasks (each named
        by the registry's task name); for a git reference (`one_folder`), the folder it
        names. Made afresh when missing or when it no longer matches what it was made of."""
        key_text = json.dumps([name, one_folder, [task.model_dump() for task in tasks]])
        key = hashlib.sha256(key_text.encode()).hexdigest()[:24]
        views = self.root / "views"
        views.mkdir(parents=True, exist_ok=True)
        folder = views / key / name
        with held(views / f"{key}.lock"):
            record = _read_json(views / key / "view.json")
            if record is not None and folder.is_dir() and _view_matches(folder, record):
                return folder
            shutil.rmtree(views / key, ignore_errors=True)
            scratch = Path(tempfile.mkdtemp(dir=views, prefix=".view-"))
            digests: dict[str, str] = {}
            if one_folder:
                tree = self._entry(tasks[0]) / "tree"
                shutil.copytree(tree, scratch / name, symlinks=True, ignore=_host_code(tree))
                digests["."] = tree_digest(scratch / name)
            else:
                (scratch / name).mkdir()
                for task in tasks:
                    copy = scratch / name / task.name
                    shutil.copytree(self._entry(task) / "tree", copy, symlinks=True)
                    digests[task.name] = tree_digest(copy)
            write_atomically(scratch / "view.json", json.dumps(digests, indent=2) + "\n")
            scratch.rename(views / key)
        return folder


def _view_matches(folder: Path, record: dict[str, str]) -> bool:
    return all(
        (folder / relative).is_dir() and tree_digest(folder / relative) == digest
        for relative, digest in record.items()
    )


def _host_code(top: Path) -> Callable[[str, list[str]], list[str]]:
    """A fetched dataset runs nothing on this machine: its top conftest.py (which pytest
    would import) is left out of the view."""

    def ignore(folder: str, names: list[str]) -> list[str]:
        return ["conftest.py"] if Path(folder) == top and "conftest.py" in names else []

    return ignore


def _checked(task: PinnedTask, digest: str) -> PinnedTask:
    if task.digest is not None and task.digest != digest:
        raise GitError(
            f"{task.git_url} at {task.git_commit_id[:12]}: {task.path or '(top)'} has digest "
            f"{digest[7:19]}, not {task.digest[7:19]} as recorded"
        )
    return task.model_copy(update={"digest": digest})


def _task_problem(task: RegistryTask) -> str | None:
    if task.git_url is None:
        return f"no git_url (path {task.path}): this release fetches tasks from git only"
    problem = taskset_name_error(task.name)
    if problem:
        return f"the task name {task.name!r} {problem}"
    return None


def _read_json(path: Path) -> dict[str, str] | None:
    try:
        data = load_json(path.read_bytes()).value
    except OSError:
        return None
    return data if isinstance(data, dict) else None
