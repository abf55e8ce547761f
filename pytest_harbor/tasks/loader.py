"""Find task folders and load them into Tasks, with errors that name file and key."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from pytest_harbor.display import escape_controls, unshowable
from pytest_harbor.tasks.config import (
    EnvironmentConfig,
    SolutionConfig,
    StepConfig,
    StepVerifierConfig,
    TaskConfig,
    VerifierConfig,
    known_instead,
)
from pytest_harbor.tasks.dataset import DatasetConfig, DatasetFiles
from pytest_harbor.tasks.digest import TaskFolderError, task_digest
from pytest_harbor.tasks.dockerfiles import check_dockerfile
from pytest_harbor.tasks.errors import TaskLoadError, describe_validation_error, error_key
from pytest_harbor.tasks.graders import graded, python_verifier, read_task_data
from pytest_harbor.tasks.registries import check_task_images
from pytest_harbor.tasks.task import COMPOSE_FILES, SINGLE_STEP_TURN, Task, Turn
from pytest_harbor.tasks.typos import key_line, near_miss
from pytest_harbor.templates import SecretReference, TemplateSources, fill, whole_template
from pytest_harbor.untrusted import load_toml

__all__ = [
    "MAX_TASK_DEPTH",
    "TaskLoadError",
    "discover_task_dirs",
    "is_dataset_dir",
    "is_task_dir",
    "load_task",
    "matches_any",
    "refuse_unusable_name",
    "strip_canary",
]

#: How deep below a dataset folder task folders are searched for.
MAX_TASK_DEPTH = 6

TASK_FILE = "task.toml"


# ---------------------------------------------------------------------------- discovery


def is_task_dir(path: Path) -> bool:
    return (path / TASK_FILE).is_file()


def discover_task_dirs(root: Path, max_depth: int = MAX_TASK_DEPTH) -> list[Path]:
    """Task folders at or below `root`, sorted; hidden folders and task contents are skipped."""
    if is_task_dir(root):
        return [root]
    found: list[Path] = []
    level = [root]
    for _ in range(max_depth):
        below: list[Path] = []
        for folder in level:
            for child in _subfolders(folder):
                (found if is_task_dir(child) else below).append(child)
        level = below
    return sorted(found, key=lambda path: path.relative_to(root).as_posix())


def is_dataset_dir(path: Path, test_file_patterns: Iterable[str] = ()) -> bool:
    """A folder of task folders that holds no Python test files of its own.

    Used to decide whether a plain positional argument (`pytest path`) names a dataset:
    a folder with both task folders and pytest test modules outside them is a project,
    not a dataset, and pytest collects it as usual.
    """
    if not path.is_dir() or is_task_dir(path):
        return False
    patterns = tuple(test_file_patterns)
    has_task = False
    level = [path]
    for _ in range(MAX_TASK_DEPTH):
        below: list[Path] = []
        for folder in level:
            if patterns and _holds_test_module(folder, patterns):
                return False
            for child in _subfolders(folder):
                if is_task_dir(child):
                    has_task = True
                else:
                    below.append(child)
        level = below
    return has_task


#: The longest task or dataset folder name, in bytes: the name goes into the names of
#: files and folders of the results (with suffixes), which may hold 255.
MAX_NAME_BYTES = 128


def refuse_unusable_name(path: Path, what: str) -> None:
    """A folder whose name holds control or format characters (the name is a pytest id,
    a label, a file name and a line in the terminal and the junit XML), or is longer than
    MAX_NAME_BYTES, is refused; the error shows the name escaped."""
    bad = unshowable(path.name)
    shown = path.parent / escape_controls(path.name)
    if bad:
        raise TaskLoadError(
            shown, f"the {what}'s name holds control or format characters ({bad!r}); rename it"
        )
    size = len(path.name.encode(errors="surrogateescape"))
    if size > MAX_NAME_BYTES:
        raise TaskLoadError(
            shown, f"the {what}'s name is {size} bytes long (at most {MAX_NAME_BYTES}); rename it"
        )


def matches_any(name: str, patterns: Sequence[str]) -> bool:
    """Task selection: a name or a glob, as `--harbor-only-tasks a,b*` gives them."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _subfolders(folder: Path) -> list[Path]:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return [
        Path(entry.path)
        for entry in entries
        if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=True)
    ]


def _holds_test_module(folder: Path, patterns: tuple[str, ...]) -> bool:
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.is_file()]
    except OSError:
        return False
    return any(
        name.endswith(".py") and any(fnmatch.fnmatch(name, pattern) for pattern in patterns)
        for name in names
    )


# ---------------------------------------------------------------------------- loading


def load_task(
    path: Path,
    *,
    variables: TemplateSources | None = None,
    dataset: DatasetConfig | None = None,
    dataset_files: DatasetFiles | None = None,
    allow_remote_add: bool = False,
) -> Task:
    """Load and validate one task folder; raise TaskLoadError naming the file and key.

    `dataset` applies a dataset.toml's `[gym]` overrides (before validation) and defaults;
    `dataset_files` are the dataset root's shared `verifier.py` and `task_data.py`;
    `variables` are what `${NAME}` may read (none when not given; a run gives its
    settings' `template_sources()`): in verifier env tables a secret, kept in the Task as
    a reference by name, else a host variable. A table the agent's sandbox gets reads host
    variables alone, and one that holds a secret's text is refused there.
    `allow_remote_add` lets a Dockerfile's `ADD` fetch a URL (the run's setting).
    """
    variables = TemplateSources() if variables is None else variables
    task_file = path / TASK_FILE
    refuse_unusable_name(path, "task folder")
    if path.is_symlink():
        raise TaskLoadError(path, "a task folder must not be a symlink")
    _refuse_links_out(path)
    raw = _read_toml(task_file)
    text = _text(task_file)
    override = dataset.override_for(path.name) if dataset else None
    if override:
        raw = _merged(raw, override)
    try:
        config = _validate(task_file, raw, from_dataset=bool(override))
        if dataset is not None:
            config = dataset.defaults.scale(config)
        shared = dataset_files or DatasetFiles()
        _check_layout(path, config, shared, allow_remote_add)
        task_data = read_task_data(path)
        config, references = _fill_env_templates(task_file, config, variables)
    except TaskLoadError as error:
        # A key that is missing or wrong may be one the file misspells.
        hint = near_miss(raw, text, error.key) if error.path == task_file and error.key else None
        if hint is None:
            raise
        raise TaskLoadError(error.path, f"{error.message}; {hint}", key=error.key) from None
    meant = known_instead(config)
    try:
        digest = task_digest(path)
    except TaskFolderError as error:
        raise TaskLoadError(error.path, str(error)) from None
    return Task(
        path=path,
        config=config,
        turns=_turns(path, config, references, shared, task_data),
        digest=digest,
        unknown_keys=tuple(meant),
        unknown_key_lines={key: key_line(text, key) for key in meant},
        unknown_key_meant=meant,
        notes=_notes(config) + _stray_setups(path, config),
    )


def _refuse_links_out(task_dir: Path) -> None:
    """A task folder holds no symlink to a folder, and no file symlink that leads out of
    it (or nowhere): its files are uploaded into sandboxes and built into images, and none
    of them may be a file of this machine."""
    inside = task_dir.resolve()
    for root, dirs, files in os.walk(task_dir):
        for name in dirs:
            if (Path(root) / name).is_symlink():
                raise TaskLoadError(
                    Path(root) / name, "a task folder must not hold a symlink to a folder"
                )
        for name in files:
            link = Path(root) / name
            if not link.is_symlink():
                continue
            target = link.resolve()
            if not target.is_relative_to(inside):
                raise TaskLoadError(
                    link, f"is a symlink to {target}, outside the task folder: copy the file in"
                )
            if not target.is_file():
                raise TaskLoadError(link, f"is a symlink to {target}, which is not a file")


def _text(task_file: Path) -> str:
    """The file's text (read already as TOML: it can be read)."""
    return task_file.read_text(encoding="utf-8")


def _read_toml(task_file: Path) -> dict[str, Any]:
    """The file as TOML, bounded in size and depth before it is parsed."""
    try:
        data = task_file.read_bytes()
    except OSError as error:
        raise TaskLoadError(task_file, f"cannot be read: {error}") from None
    parsed = load_toml(data)
    if parsed.error is not None:
        raise TaskLoadError(task_file, parsed.error.removeprefix("is "))
    value: dict[str, Any] = parsed.value
    return value


def _merged(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def _validate(task_file: Path, raw: dict[str, Any], *, from_dataset: bool) -> TaskConfig:
    try:
        return TaskConfig.model_validate(raw)
    except ValidationError as error:
        raise TaskLoadError(
            task_file, describe_validation_error(error, from_dataset), key=error_key(error) or None
        ) from None


def _check_layout(path: Path, config: TaskConfig, shared: DatasetFiles, remote: bool) -> None:
    """Harbor's file rules (§1.3), the per-step features Gym's loader refuses, and what
    the engine would fetch for the task (`remote`: ADD may fetch a URL)."""
    task_file = path / TASK_FILE
    environment = path / "environment"
    if config.environment.docker_image is None and not any(
        (environment / name).is_file() for name in ("Dockerfile", *COMPOSE_FILES)
    ):
        raise TaskLoadError(
            task_file,
            "no environment: set [environment].docker_image or add environment/Dockerfile "
            "(or a Compose file)",
            key="environment.docker_image",
        )
    check_task_images(task_file, config)
    built = [path / "tests" / "Dockerfile"]
    if config.environment.docker_image is None:
        built.append(environment / "Dockerfile")
    for dockerfile in built:
        if dockerfile.is_file():
            check_dockerfile(dockerfile, allow_remote_add=remote)
    bundled = _bundles_tests(path, config)
    if not config.is_multi_step:
        if not (path / "instruction.md").is_file():
            raise TaskLoadError(path / "instruction.md", "missing: a single-step task needs one")
        tests = [path / "tests"] if (path / "tests").is_dir() else []
        if not bundled and not graded(tests, shared):
            raise TaskLoadError(
                path / "tests" / "test.sh",
                "missing: the verifier script is required (or tests/verifier.py, or the "
                "dataset's verifier.py for a task without tests/)",
            )
        return
    _check_steps(path, config, bundled, shared)


def _bundles_tests(path: Path, config: TaskConfig) -> bool:
    """A separate verifier image that may carry its own tests (tests/ need not exist)."""
    tests = path / "tests"
    image = config.verifier.environment and config.verifier.environment.docker_image
    return bool(
        image or (tests / "Dockerfile").is_file() or (tests / "docker-compose.yaml").is_file()
    )


def _check_steps(path: Path, config: TaskConfig, bundled: bool, shared: DatasetFiles) -> None:
    task_file = path / TASK_FILE
    if config.verifier.mode == "separate" or (path / "tests" / "Dockerfile").is_file():
        raise TaskLoadError(
            task_file,
            "a multi-step task verifies in its agent's sandbox only (shared mode); "
            "remove the separate verifier",
            key="verifier.environment_mode"
            if config.verifier.environment_mode
            else "verifier.environment",
        )
    for index, step in enumerate(config.steps or []):
        _check_step(path, index, step, bundled, shared)


def _check_step(
    path: Path, index: int, step: StepConfig, bundled: bool, shared: DatasetFiles
) -> None:
    task_file = path / TASK_FILE
    folder = path / "steps" / step.name
    where = f"steps[{index}]"
    named = f"step {step.name!r}"
    if step.verifier.environment is not None or step.verifier.environment_mode == "separate":
        key = "environment" if step.verifier.environment is not None else "environment_mode"
        raise TaskLoadError(
            task_file,
            f"{named}: per-step separate verification is not run",
            key=f"{where}.verifier.{key}",
        )
    if not folder.is_dir():
        raise TaskLoadError(folder, f"missing: {named} needs its folder")
    workdir = folder / "workdir"
    if workdir.exists() and not workdir.is_dir():
        raise TaskLoadError(workdir, f"{named}: workdir must be a folder")
    setup = workdir / "setup.sh"
    if setup.exists() and not setup.is_file():
        raise TaskLoadError(setup, f"{named}: setup.sh must be a file")
    if not (folder / "instruction.md").is_file():
        raise TaskLoadError(folder / "instruction.md", f"missing: {named} needs an instruction")
    tests = [tests for tests in (path / "tests", folder / "tests") if tests.is_dir()]
    if not bundled and not graded(tests, shared):
        raise TaskLoadError(
            folder / "tests" / "test.sh",
            f"missing: {named} has no verifier (no test.sh or verifier.py in "
            f"steps/{step.name}/tests/ or tests/)",
        )


# ---------------------------------------------------------------------------- env templates

_EnvTable = EnvironmentConfig | VerifierConfig | SolutionConfig | StepVerifierConfig
#: The secrets each verifier env table gives, by the table's key in task.toml
#: (`verifier`, `steps[0].verifier`), then by variable.
_References = dict[str, dict[str, SecretReference]]


def _fill_entry(
    task_file: Path, key: str, value: str, variables: TemplateSources, *, verifier: bool
) -> str | SecretReference:
    """One env value filled: a secret's stays a reference (`verifier`: a verifier env
    table), and is refused in a table the agent's sandbox gets."""
    template = whole_template(value)
    reference = None if template is None else variables.reference(template.name, verifier=verifier)
    if reference is not None and not verifier:
        raise TaskLoadError(
            task_file,
            f"{value} would give the secret {reference.secrets[0]} to the agent's sandbox: "
            "secrets reach [verifier].env and [steps.verifier].env only",
            key=key,
        )
    if reference is not None:
        return reference
    filled = fill(value, variables.host)
    if filled is None:
        raise TaskLoadError(
            task_file,
            f"{value} names a variable that is not set and has no default (write "
            "${NAME:-default} to give one; a host variable reaches a task only when the "
            "host_env setting names it)",
            key=key,
        )
    return filled


def _fill_env_templates(
    task_file: Path, config: TaskConfig, variables: TemplateSources
) -> tuple[TaskConfig, _References]:
    """`config` with every env table's templates filled, and the secrets its verifier
    tables give; such an entry keeps its template as task.toml writes it, so that the
    config holds no secret's value."""
    references: _References = {}

    def filled(key: str, table: _EnvTable, *, verifier: bool) -> Any:
        env: dict[str, str] = {}
        given: dict[str, SecretReference] = {}
        for name, value in table.env.items():
            entry = _fill_entry(task_file, f"{key}.env.{name}", value, variables, verifier=verifier)
            if isinstance(entry, SecretReference):
                given[name] = entry
            env[name] = value if isinstance(entry, SecretReference) else entry
        references[key] = given
        return table.model_copy(update={"env": env})

    verifier = filled("verifier", config.verifier, verifier=True)
    if verifier.environment is not None:
        # The separate verifier's sandbox starts with it: a secret reaches the exec alone.
        environment = filled("verifier.environment", verifier.environment, verifier=False)
        verifier = verifier.model_copy(update={"environment": environment})
    steps = None
    if config.steps is not None:
        steps = [
            step.model_copy(
                update={"verifier": filled(f"steps[{i}].verifier", step.verifier, verifier=True)}
            )
            for i, step in enumerate(config.steps)
        ]
    config = config.model_copy(
        update={
            "environment": filled("environment", config.environment, verifier=False),
            "verifier": verifier,
            "solution": filled("solution", config.solution, verifier=False),
            "steps": steps,
        }
    )
    return config, references


def _verifier_env(
    config: TaskConfig, references: _References, step: int | None
) -> dict[str, str | SecretReference]:
    """A turn's verifier environment: the task's, then its step's (`step`, its index)
    entry by entry, each secret's entry a reference."""
    env: dict[str, str | SecretReference] = {**config.verifier.env, **references["verifier"]}
    if step is not None and config.steps is not None:
        env.update(config.steps[step].verifier.env)
        env.update(references[f"steps[{step}].verifier"])
    return env


# ---------------------------------------------------------------------------- turns

_CANARY = re.compile(r"^\s*(<!--.*canary.*-->|#.*canary.*)\s*$", re.IGNORECASE)


def strip_canary(text: str) -> str:
    """Drop leading canary lines (`<!-- ...canary... -->` or `# ...canary...`) and blanks after."""
    lines = text.splitlines(keepends=True)
    index = 0
    while index < len(lines) and _CANARY.match(lines[index]):
        index += 1
    if index:
        while index < len(lines) and not lines[index].strip():
            index += 1
    return "".join(lines[index:])


def _user(value: str | int | None) -> str | None:
    return None if value is None else str(value)


def _turns(
    path: Path,
    config: TaskConfig,
    references: _References,
    shared: DatasetFiles,
    task_data: dict[str, Any] | None,
) -> tuple[Turn, ...]:
    tests = path / "tests"
    solution = path / "solution"
    if not config.is_multi_step:
        return (
            Turn(
                name=SINGLE_STEP_TURN,
                instruction=strip_canary((path / "instruction.md").read_text(encoding="utf-8")),
                solution_dir=solution if solution.is_dir() else None,
                tests_dirs=(tests,) if tests.is_dir() else (),
                agent_timeout_sec=config.agent.timeout_sec,
                agent_user=_user(config.agent.user),
                verifier_timeout_sec=config.verifier.timeout_sec,
                verifier_user=_user(config.verifier.user),
                verifier_env=_verifier_env(config, references, None),
                solution_env=dict(config.solution.env),
                agent_network=_online(config.agent.network_mode, config),
                verifier_network=_online(config.verifier.network_mode, config),
                agent_hosts=allowed_hosts(config, config.agent),
                verifier_hosts=allowed_hosts(config, config.verifier),
                artifacts=tuple(config.artifacts),
                python_verifier=python_verifier(
                    (tests,) if tests.is_dir() else (), shared, task_data
                ),
            ),
        )
    turns = []
    for index, step in enumerate(config.steps or []):
        folder = path / "steps" / step.name
        own_solution = folder / "solution"
        # A step folder's own solution/ is its answer even without solve.sh (then missing).
        step_solution = own_solution if own_solution.is_dir() else solution
        turns.append(
            Turn(
                name=step.name,
                instruction=strip_canary((folder / "instruction.md").read_text(encoding="utf-8")),
                solution_dir=step_solution if step_solution.is_dir() else None,
                tests_dirs=tuple(d for d in (tests, folder / "tests") if d.is_dir()),
                agent_timeout_sec=step.agent.timeout_sec or config.agent.timeout_sec,
                agent_user=_user(
                    step.agent.user if step.agent.user is not None else config.agent.user
                ),
                verifier_timeout_sec=step.verifier.timeout_sec or config.verifier.timeout_sec,
                verifier_user=_user(
                    step.verifier.user if step.verifier.user is not None else config.verifier.user
                ),
                verifier_env=_verifier_env(config, references, index),
                solution_env=dict(config.solution.env),
                min_reward=step.min_reward,
                agent_network=_online(step.agent.network_mode or config.agent.network_mode, config),
                verifier_network=_online(
                    step.verifier.network_mode or config.verifier.network_mode, config
                ),
                agent_hosts=allowed_hosts(config, step.agent, config.agent),
                verifier_hosts=allowed_hosts(config, step.verifier, config.verifier),
                workdir_dir=folder / "workdir" if (folder / "workdir").is_dir() else None,
                healthcheck=step.healthcheck,
                artifacts=(*config.artifacts, *step.artifacts),
                python_verifier=python_verifier(
                    tuple(d for d in (tests, folder / "tests") if d.is_dir()), shared, task_data
                ),
            )
        )
    return tuple(turns)


class _NetworkTable(Protocol):
    @property
    def network_mode(self) -> str | None: ...

    @property
    def allowed_hosts(self) -> list[str] | None: ...


def allowed_hosts(config: TaskConfig, *phases: _NetworkTable) -> tuple[str, ...] | None:
    """The hosts a phase may reach when its network is an allow-list (None: it is not):
    the first of `phases` (a step's table, then the task's) that sets `network_mode`
    decides, else the environment."""
    for table in (*phases, config.environment):
        if table.network_mode is not None:
            if table.network_mode != "allowlist":
                return None
            return tuple(table.allowed_hosts or ())
    return None


def _online(mode: str | None, config: TaskConfig) -> bool:
    """A phase's network: its own mode, else the environment's ("allowlist" is refused
    before a task runs on a provider that cannot enforce it)."""
    return (mode or config.environment.network_mode) != "no-network"


def _stray_setups(path: Path, config: TaskConfig) -> tuple[str, ...]:
    """A `steps/<name>/setup.sh` beside `workdir/`, which Harbor does not run either."""
    return tuple(
        f"steps/{step.name}/setup.sh is not run: a step's set-up script is "
        f"steps/{step.name}/workdir/setup.sh"
        for step in config.steps or []
        if (path / "steps" / step.name / "setup.sh").is_file()
    )


def _notes(config: TaskConfig) -> tuple[str, ...]:
    mode = config.multi_step_reward_mode
    if mode is None or mode == "aggregate":
        return ()
    strategy = config.multi_step_reward_strategy or "mean"
    return (
        f"multi_step_reward_mode = {mode!r} is a pre-1.3 key and was dropped; the task rolls "
        f"up with multi_step_reward_strategy = {strategy!r}",
    )
