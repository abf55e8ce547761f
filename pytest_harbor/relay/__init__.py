"""The model relay: one process per run, on this machine, between every harness and the
model endpoint. It holds the endpoint's key (a harness holds a token made for its episode),
counts and prices every call, stops serving when the run's budget is spent, and records
or replays the calls (docs/cost-and-replay.md).

`server.py` is the relay's process; `control.py` is the run's side of it (its start and
stop, and the questions the engine asks it); `wire.py` the HTTP it reads and writes,
`upstream.py` the endpoint, `usage.py` and `prices.py` what a call took and cost,
`ledger.py` the books, `cassettes.py` the recordings, `reports.py` what crosses between
the processes.
"""

from pytest_harbor.relay.control import RelayAddress, RelayClient, RelayError, RelayProcess
from pytest_harbor.relay.reports import Counts, GrantReport, GrantRequest, RelayStart, RunSpend

__all__ = [
    "Counts",
    "GrantReport",
    "GrantRequest",
    "RelayAddress",
    "RelayClient",
    "RelayError",
    "RelayProcess",
    "RelayStart",
    "RunSpend",
]
