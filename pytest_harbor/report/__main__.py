"""`python -m pytest_harbor.report RESULTS_DIR [-o OUT.html]`: the report of an existing
results folder (a taskset's, or any folder above one); `--compare OLD NEW` (or `--compare
TASKSET_DIR`, its latest two runs): what changed between two runs."""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_harbor.display import escape_controls
from pytest_harbor.report import REPORT, ReportError, find_summaries, write_report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_harbor.report",
        description="Write the HTML report of the runs whose rollouts_run_summary.json files "
        "are in RESULTS_DIR or below it; or, with --compare, a page and a table of what "
        "changed between two runs.",
    )
    parser.add_argument("results_dir", metavar="RESULTS_DIR", type=Path, nargs="?")
    parser.add_argument(
        "--compare",
        metavar="RUN",
        type=Path,
        nargs="+",
        help="compare two run folders, OLD NEW (each holding rollouts_run_summary.json); "
        "or the latest two runs of one taskset folder holding runs/<run-name>/",
    )
    parser.add_argument(
        "--all",
        dest="show_all",
        action="store_true",
        help="with --compare: list the unchanged tasks in the terminal table too",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        type=Path,
        help=f"where to write the page (default: RESULTS_DIR/{REPORT}; with --compare, "
        "NEW/compare.html)",
    )
    args = parser.parse_args(argv)
    if args.compare is not None:
        if args.results_dir is not None or len(args.compare) > 2:
            parser.error("--compare takes OLD NEW, or one taskset folder, and no RESULTS_DIR")
        return _compare(parser.prog, args.compare, args.output, args.show_all)
    if args.results_dir is None:
        parser.error("give RESULTS_DIR, or --compare OLD NEW")
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


def _compare(prog: str, runs: list[Path], output: Path | None, show_all: bool) -> int:
    # Loaded here: a plain report needs none of it.
    from pytest_harbor.report.compare import compare_runs, latest_two
    from pytest_harbor.report.compare_page import COMPARISON, write_comparison
    from pytest_harbor.report.compare_table import comparison_table

    try:
        if len(runs) == 1:
            old, new = latest_two(runs[0])
            said = f"comparing the latest two runs of {runs[0]}: {old.name} (OLD), {new.name} (NEW)"
            print(escape_controls(said))
        else:
            old, new = runs
        comparison = compare_runs(old, new)
        if isinstance(sys.stdout, io.TextIOWrapper):
            # The table's arrows and dashes on a terminal that cannot show them: escapes.
            sys.stdout.reconfigure(errors="backslashreplace")
        colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        sys.stdout.write(comparison_table(comparison, show_all=show_all, colour=colour))
        out = write_comparison(comparison, output or new / COMPARISON)
    except ReportError as error:
        print(escape_controls(f"{prog}: {error}"), file=sys.stderr)
        return 2
    except OSError as error:
        print(escape_controls(f"{prog}: cannot write the comparison: {error}"), file=sys.stderr)
        return 1
    print(escape_controls(f"comparison: {out}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
