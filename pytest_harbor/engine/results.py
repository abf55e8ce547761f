"""What an episode produces; plain data that crosses process boundaries as JSON."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from pytest_harbor.harnesses.base import Usage

__all__ = ["EpisodeResult", "PhaseTimings", "TurnResult", "TurnTimings"]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PhaseTimings(_Record):
    """Seconds spent in each phase of an episode.

    `build_s` (making the image) is outside the episode's clock; so is `start_s` when the
    sandbox started early. `total_s` runs from the
    start of the seed to the end of cleanup, or to the end of the last turn when the
    sandbox is removed after the row is written (as under pytest).
    """

    build_s: float | None = None
    #: Making (or finding cached) the agent's install image, for an in-sandbox agent.
    agent_install_s: float | None = None
    #: Creating and starting the sandbox, wherever that happened (it may have started
    #: early, while the episode before it ran: then it is not part of seed_s).
    start_s: float | None = None
    seed_s: float | None = None
    agent_s: float | None = None
    verify_s: float | None = None
    cleanup_s: float | None = None
    total_s: float | None = None


class TurnTimings(_Record):
    """Seconds spent in the phases of one turn."""

    #: Opening the harness session (charged to harness_setup_allowance_s).
    setup_s: float | None = None
    agent_s: float | None = None
    verify_s: float | None = None


class TurnResult(_Record):
    """One turn: the agent's work on one instruction and its verification."""

    step: str
    reward: float
    verifier_rewards: dict[str, float] | None = None
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None
    #: The classified cause when the agent's turn failed (`timeout`, `rate_limited`,
    #: `api_error`, `context_length_exceeded`, `agent_crashed`), whatever the reward.
    failure_cause: str | None = None
    reward_file: str | None = None
    agent_exit_code: int | None = None
    agent_timed_out: bool = False
    verifier_exit_code: int | None = None
    verifier_timed_out: bool = False
    agent_log_tail: str = ""
    verifier_mode: str = "shared"
    #: The folder this turn's /logs/verifier was copied to.
    verifier_logs_dir: str | None = None
    #: Files of /logs/verifier cut short or left out of that copy (its caps).
    verifier_files_cut: list[str] = []
    #: The folder this turn's artifacts were copied to (`/logs/artifacts` and the
    #: declared ones, with a manifest.json), when there were any.
    artifacts_dir: str | None = None
    #: The folder the harness kept its own files of this turn in on this machine (the
    #: oracle's output, oracle.txt; a CLI agent's logs), when it kept any.
    agent_logs_dir: str | None = None
    response: str | None = None
    usage: Usage | None = None
    timings: TurnTimings = TurnTimings()
    #: What went wrong without deciding the reward (a failing collect hook, say).
    notes: list[str] = []


class EpisodeResult(_Record):
    """One task and repeat, scored: the fields of a rollouts.jsonl row."""

    task_id: str
    taskset: str
    repeat: int
    agent: str
    #: The model the agent talked to, when it talked to one.
    model: str | None = None
    #: The task folder's digest (see docs/task-format.md); rows of an edited folder are refused.
    digest: str | None = None
    reward: float
    verifier_rewards: dict[str, float] | None = None
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None
    #: The agent's classified failure cause (the last turn's that had one).
    failure_cause: str | None = None
    verifier_mode: str = "shared"
    #: The episode's verifier folder; None for a multi-step episode (each turn has one).
    verifier_logs_dir: str | None = None
    solution_exit_code: int | None = None
    #: The step after which the episode stopped early, if it did.
    stopped_after_turn: str | None = None
    #: Some of the episode's steps were not selected (`-k`, `--deselect`): the row holds the
    #: turns that ran (`turns`), not the episode. Out of the score; a resume runs it again.
    partial: bool = False
    #: The steps left out, for a partial row.
    unselected_steps: list[str] = []
    response: str | None = None
    #: Model tokens, requests and cost over every turn of the attempt that was kept (None
    #: when the agent used no model); counted by the model relay in a run.
    usage: Usage | None = None
    #: The same over the attempts given up for a retry (None when there were none).
    retried_usage: Usage | None = None
    #: 1, or more when agent_outcome_policy ran the episode again in a fresh sandbox.
    attempts: int = 1
    #: Wall-clock UTC times (ISO 8601) of the seed's start and the last turn's end.
    started_at: str | None = None
    finished_at: str | None = None
    #: The process that ran the episode: the pytest-xdist worker id (`gw0`, ...), or
    #: `main` in a run without workers.
    worker: str | None = None
    timings: PhaseTimings = PhaseTimings()
    turns: list[TurnResult] = []

    @property
    def episode_id(self) -> str:
        return episode_id(self.task_id, self.repeat)

    def row(self) -> dict[str, object]:
        """The rollouts.jsonl row: every field except the per-turn log tails."""
        data = self.model_dump(mode="json")
        for turn in data["turns"]:
            turn.pop("agent_log_tail", None)
        return data


def episode_id(task_id: str, repeat: int) -> str:
    """The name of an episode's folders: `<task>__r<repeat>`."""
    return f"{task_id}__r{repeat}"
