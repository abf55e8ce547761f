"""What the live view costs: a worker's phase report (one small file written atomically,
four or more per episode), and one tick of the controller's thread (the ledger read, each
running episode's phase file read, the block drawn) for a run of many episodes; with
`--harbor-live-report`, one rewrite of the report of a taskset whose episodes all ended.

    .venv/bin/python bench/live_view.py [--episodes 2000] [--running 8] [--rounds 200]

Prints the median and the 95th percentile of each, in milliseconds.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _pytest._io import TerminalWriter  # noqa: E402

from pytest_harbor.plugin.ledger import EpisodeLedger  # noqa: E402
from pytest_harbor.plugin.live_terminal import LiveBlock  # noqa: E402
from pytest_harbor.plugin.phases import PhaseBoard  # noqa: E402
from pytest_harbor.plugin.planned import PlannedRun  # noqa: E402
from pytest_harbor.plugin.progress import run_progress  # noqa: E402
from pytest_harbor.report import LiveNote, write_live_report  # noqa: E402


def timed(rounds: int, work: Callable[[], object]) -> tuple[float, float]:
    """Median and 95th percentile of `work`, in ms."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1]


class _Reporter:
    def __init__(self) -> None:
        self._tw = TerminalWriter(io.StringIO())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--running", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        board = PhaseBoard(Path(scratch) / "phases")
        ledger = EpisodeLedger(run_id="r", agent="oracle", validation=True, pass_reward=1.0)
        names = [f"task-{index:05d}" for index in range(args.episodes)]
        ledger.plan("bench", 1, {name: "digest" for name in names})
        ledger.select(f"bench/{name}::r0::episode" for name in names)
        for record in list(ledger.trials.values())[: args.running]:
            record.started, record.began_at = True, time.monotonic()
            board.post(f"bench/{record.task_id}::r0", "agent", "episode")
        post = timed(args.rounds, lambda: board.post("bench/task-00000::r0", "agent", None))
        block = LiveBlock(_Reporter())  # type: ignore[arg-type]

        def tick() -> None:
            progress = run_progress(ledger, PlannedRun(), phases=board)
            block.show(progress.block(block.width, 10))

        ticked = timed(args.rounds, tick)
        print(f"phase report (worker, per phase): median {post[0]:.3f} ms, p95 {post[1]:.3f} ms")
        print(
            f"tick of {args.episodes} episodes, {args.running} running (controller, every "
            f"2 s): median {ticked[0]:.3f} ms, p95 {ticked[1]:.3f} ms"
        )
        summary = {
            "taskset": "bench",
            "episodes": [
                {"task_id": name, "repeat": 0, "status": "passed", "reward": 1.0} for name in names
            ],
        }
        note = LiveNote(args.episodes, args.episodes, 0, 0, "now", 10)
        out = Path(scratch) / "report.html"
        rounds = max(3, args.rounds // 20)
        report = timed(rounds, lambda: write_live_report([(Path(scratch), summary)], out, note))
        print(
            f"live report of {args.episodes} episodes (controller, every --harbor-live-report "
            f"s): median {report[0]:.1f} ms, p95 {report[1]:.1f} ms"
        )


if __name__ == "__main__":
    main()
