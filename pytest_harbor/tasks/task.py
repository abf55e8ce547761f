"""A loaded task folder and the turns an episode runs through."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_harbor.tasks.config import ArtifactConfig, HealthcheckConfig, TaskConfig
from pytest_harbor.templates import SecretReference

__all__ = ["COMPOSE_FILES", "SINGLE_STEP_TURN", "PythonVerifier", "Task", "Turn"]

#: The item name of the one turn of a single-step task.
SINGLE_STEP_TURN = "episode"


@dataclass(frozen=True)
class PythonVerifier:
    """A turn graded by a Python `verify(...)` rather than a `test.sh`."""

    #: The module that defines `verify`, as a path in the sandbox.
    module: str
    #: Files the dataset shares, shipped beside the engine's runner (`verifier.py` for a
    #: task graded by the dataset's, `task_data.py`), as read when the task loaded.
    files: Mapping[str, bytes] = field(default_factory=dict)
    #: The task's fields (its `task_data.json`).
    task_data: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Turn:
    """What one turn of an episode needs: instruction, solution, tests, users and budgets."""

    name: str
    instruction: str
    solution_dir: Path | None
    tests_dirs: tuple[Path, ...]
    agent_timeout_sec: float | None
    agent_user: str | None
    verifier_timeout_sec: float
    verifier_user: str | None
    #: The verifier's environment; an entry that gives a secret is a reference to it, filled
    #: only where the verifier's exec is made (engine/verification.py).
    verifier_env: dict[str, str | SecretReference] = field(default_factory=dict)
    solution_env: dict[str, str] = field(default_factory=dict)
    min_reward: float | dict[str, float] | None = None
    #: Whether the agent's phase, and the verifier's, have the network (each phase's own
    #: `network_mode`, else the step's, else the environment's).
    agent_network: bool = True
    verifier_network: bool = True
    #: The hosts each phase may reach when its network is an allow-list (None: it is not).
    agent_hosts: tuple[str, ...] | None = None
    verifier_hosts: tuple[str, ...] | None = None
    #: A step's `steps/<name>/workdir/`: copied into the working directory before the
    #: turn, its `setup.sh` run after the copy (multi-step tasks only).
    workdir_dir: Path | None = None
    #: The step's `[steps.healthcheck]`, run after the set-up and before the agent.
    healthcheck: HealthcheckConfig | None = None
    #: What is copied out of the sandbox at the end of the turn: the task's `artifacts`,
    #: then the step's (`/logs/artifacts` always).
    artifacts: tuple[ArtifactConfig, ...] = ()
    #: Set when no `test.sh` grades the turn but a `verifier.py` does.
    python_verifier: PythonVerifier | None = None

    @property
    def setup_script(self) -> Path | None:
        """The step's `workdir/setup.sh`, when it has one."""
        if self.workdir_dir is None:
            return None
        script = self.workdir_dir / "setup.sh"
        return script if script.is_file() else None

    @property
    def solve_script(self) -> Path | None:
        if self.solution_dir is None:
            return None
        script = self.solution_dir / "solve.sh"
        return script if script.is_file() else None


#: The names a task's Compose file may have (`environment/`), in the order looked for.
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml")


@dataclass(frozen=True)
class Task:
    """A task folder that loaded: its id, its validated task.toml, its turns and digest."""

    path: Path
    config: TaskConfig
    turns: tuple[Turn, ...]
    digest: str = ""
    unknown_keys: tuple[str, ...] = ()
    #: Each unknown key's line in task.toml (None: not on one of its own) and the known
    #: key it most likely misspells (None: none close).
    unknown_key_lines: Mapping[str, int | None] = field(default_factory=dict)
    unknown_key_meant: Mapping[str, str | None] = field(default_factory=dict)
    #: Other things the loader read but did not use, worth a warning.
    notes: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """The folder name: unique within a dataset, unlike `[task].name`."""
        return self.path.name

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def dockerfile(self) -> Path | None:
        """The Dockerfile to build, or None when the task names a prebuilt image (or a
        Compose file that gives `main` an image of its own)."""
        if self.config.environment.docker_image is not None:
            return None
        dockerfile = self.environment_dir / "Dockerfile"
        if self.compose_file is not None and not dockerfile.is_file():
            return None
        return dockerfile

    @property
    def compose_file(self) -> Path | None:
        """`environment/docker-compose.yaml` (or `.yml`, or `compose.yaml`): a Compose task."""
        for name in COMPOSE_FILES:
            path = self.environment_dir / name
            if path.is_file():
                return path
        return None

    @property
    def loose_environment_files(self) -> bool:
        """A prebuilt image with files beside it: they go to the working directory."""
        return (
            self.config.environment.docker_image is not None
            and self.environment_dir.is_dir()
            and not (self.environment_dir / "Dockerfile").exists()
            and self.compose_file is None
            and any(self.environment_dir.iterdir())
        )

    @property
    def filtered(self) -> bool:
        """Some phase's network is an allow-list: the environment's, or a turn's."""
        return self.config.environment.network_mode == "allowlist" or any(
            turn.agent_hosts is not None or turn.verifier_hosts is not None for turn in self.turns
        )

    @property
    def is_validatable(self) -> bool:
        """True when every turn has a reference solution the oracle can run."""
        return all(turn.solve_script is not None for turn in self.turns)

    @property
    def verifier_dockerfile(self) -> Path | None:
        """`tests/Dockerfile`: a separate verifier image built with `tests/` as context."""
        dockerfile = self.path / "tests" / "Dockerfile"
        return dockerfile if dockerfile.is_file() else None
