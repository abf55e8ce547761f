"""Every label pytest-harbor puts on what it makes on an engine (containers, networks,
volumes, images), and those of Docker Compose it reads: one home for their names."""

from __future__ import annotations

__all__ = [
    "AGENT_LABEL",
    "CACHE_LABEL",
    "COMPOSE_PROJECT_LABEL",
    "COMPOSE_SERVICE_LABEL",
    "CONTENT_HASH_LABEL",
    "LABEL_PREFIX",
    "OWNER_LABEL",
    "RUN_LABEL",
    "TASK_LABEL",
    "TRIAL_LABEL",
]

#: Every label of ours begins so (`sandbox_metadata` may not).
LABEL_PREFIX = "pytest-harbor."

#: The run that made it: a run's sandboxes are found, and removed, by it.
RUN_LABEL = LABEL_PREFIX + "run"
#: The process that made it: the reaper removes what a process that is gone left.
OWNER_LABEL = LABEL_PREFIX + "owner"
#: A sandbox's `<taskset>/<task>`, and its trial (`<taskset>/<task>::r<N>`).
TASK_LABEL = LABEL_PREFIX + "task"
TRIAL_LABEL = LABEL_PREFIX + "trial"
#: An image a CLI agent was installed into: `<recipe>@<version>`.
AGENT_LABEL = LABEL_PREFIX + "agent"
#: What is kept between runs as a cache (the tools volume, agent layers), and the content
#: hash an agent layer was made from.
CACHE_LABEL = LABEL_PREFIX + "cache"
CONTENT_HASH_LABEL = LABEL_PREFIX + "content-hash"

#: Docker Compose's labels on the containers of a project.
COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
COMPOSE_SERVICE_LABEL = "com.docker.compose.service"
