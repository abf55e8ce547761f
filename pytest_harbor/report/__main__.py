"""`python -m pytest_harbor.report RESULTS_DIR [-o OUT.html]`: the report of an existing
results folder (a taskset's, or any folder above one)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_harbor.report import REPORT, ReportError, find_summaries, write_report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_harbor.report",
        description="Write the HTML report of the runs whose rollouts_run_summary.json files "
        "are in RESULTS_DIR or below it.",
    )
    parser.add_argument("results_dir", metavar="RESULTS_DIR", type=Path)
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        type=Path,
        help=f"where to write the report (default: RESULTS_DIR/{REPORT})",
    )
    args = parser.parse_args(argv)
    try:
        summaries = find_summaries(args.results_dir)
        out = write_report(summaries, args.output or args.results_dir / REPORT)
    except ReportError as error:
        print(f"{parser.prog}: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"{parser.prog}: cannot write the report: {error}", file=sys.stderr)
        return 1
    print(f"report: {out} ({len(summaries)} taskset(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
