"""Compose tasks, one room: what a Compose file may hold (`model`), the checks on its
source before Compose reads it (`source`), the checked project and the one an episode
starts (`project`, `builds`), which tasks run as one and their spec (`tasks`), and the
one runner of the `docker compose` CLI (`cli`). Provider-neutral: a provider hands the
CLI its environment and starts the project on its engine. `tasks` and `cli` load with
the engine; the reading of Compose files (`project`, `builds`, `model`, `source`, and
YAML) only when a run meets a Compose task."""
