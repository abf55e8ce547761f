"""What serves a whole run rather than one episode: the plan of the taskset
(`planning`), the scores over its episodes (`metrics`), the durations remembered between
runs (`durations`) and the sweep of what earlier runs left behind (`reaper`).

This layer sits between the engine (one episode) and the writers (the run's files)."""
