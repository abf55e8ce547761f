"""The HTML report of real runs, loaded in a real headless browser (Debian's chromium)."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import uuid
import zlib
from pathlib import Path

import docker
import pytest

from tests.fixtures import QUICKSTART, Dataset, run_harbor

#: Colours the charts fill with (the histogram's bars, the timeline's verify phase).
BAR_BLUE = (0x4C, 0x78, 0xA8)
VERIFY_GREEN = (0x54, 0xA2, 0x4B)


def chromium() -> str:
    """The browser; missing, the test skips on a developer's machine and fails in CI."""
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; .ci/setup --tests installs it", pytrace=False)
        pytest.skip("chromium is not installed (.ci/setup --tests installs it)")
    return path


def browse(page: Path, profile: Path, *args: str) -> tuple[str, list[str]]:
    """Load `page` from disk headless: what chromium printed, and the page's console
    messages (chromium logs them to stderr as `...:CONSOLE(line)] "text", source: ...`)."""
    done = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            f"--user-data-dir={profile}",  # one profile per load: loads at once keep apart
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


def png_colours(path: Path) -> set[tuple[int, int, int]]:
    """The distinct colours of an 8-bit RGB or RGBA PNG (such as chromium's screenshots)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, compressed = 8, b""
    width = height = channels = 0
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour_type = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour_type in (2, 6), (depth, colour_type)
            channels = 3 if colour_type == 2 else 4
        elif kind == b"IDAT":
            compressed += body
    raw = zlib.decompress(compressed)
    stride = width * channels
    previous = bytearray(stride)
    colours = set()
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):  # undo the row's filter (PNG spec, section 9)
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                estimate = left + up - corner
                pa, pb, pc = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
                best = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[i] = (line[i] + best) & 0xFF
        previous = line
        colours.update((line[i], line[i + 1], line[i + 2]) for i in range(0, stride, channels))
    return colours


def test_the_console_check_catches_a_broken_page(tmp_path: Path) -> None:
    """Without this, a report that loads with no console message proves nothing."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><p>broken</p><script>missingFunction();</script>")
    _, console = browse(page, tmp_path / "profile", "--dump-dom")
    assert any("ReferenceError: missingFunction is not defined" in line for line in console)


@pytest.mark.docker
def test_the_report_of_real_runs_loads_and_draws_its_charts(
    pytester: pytest.Pytester, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    chromium()
    copy = pytester.path / f"quickstart-{uuid.uuid4().hex[:8]}"
    shutil.copytree(QUICKSTART, copy)
    quickstart = Dataset(copy)
    results = pytester.path / "results"
    # The oracle, twice per task on two workers: the report goes beside the summary.
    oracle = pytester.runpytest(f"--harbor-dataset={copy}", "--harbor-repeats=2", "-n", "2")
    oracle.assert_outcomes(passed=8)
    oracle_folder = quickstart.results_folder(results)
    oracle.stdout.fnmatch_lines([f"  report: {oracle_folder.resolve() / 'report.html'}"])
    assert (oracle_folder / "report.html").is_file()
    # nop fails every task; its report cannot be written (a file stands where its folder
    # would be): that warns, and the run's files and exit status stay what they were.
    (pytester.path / "blocker").write_text("")
    nop = pytester.runpytest(
        f"--harbor-dataset={copy}", "--harbor-agent=nop", "--harbor-report=blocker/report.html"
    )
    nop.assert_outcomes(failed=4)
    assert nop.ret == pytest.ExitCode.TESTS_FAILED
    nop.stdout.fnmatch_lines(["*could not write the HTML report*blocker/report.html*"])
    assert (quickstart.results_folder(results, validation=False) / "rollouts.jsonl").is_file()
    assert quickstart.summary(results, validation=False)["counts"]["failed"] == 4

    # Both runs in one report, made afterwards from a copy of the results folder (its rows
    # name the original's folders) with a check.json written by hand.
    copied = tmp_path / "copied"
    shutil.copytree(results, copied)
    check = {
        "schema_version": 1,
        "repeats": 2,
        "tasks": {
            "hello-world": {
                "problems": [{"kind": "flaky-verifier", "detail": "rewards 1.0, <0.0>"}],
                "oracle_rewards": [1.0, 0.0],
                "nop_reward": 0.0,
            },
            "word-count": {"problems": [], "oracle_rewards": [1.0, 1.0], "nop_reward": 0.0},
        },
    }
    (copied / "harbor" / "validation" / copy.name / "latest" / "check.json").write_text(
        json.dumps(check)
    )
    shutil.rmtree(results)
    page = tmp_path / "both" / "report.html"
    made = subprocess.run(
        [sys.executable, "-m", "pytest_harbor.report", str(copied), "-o", str(page)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert "(2 taskset(s))" in made.stdout

    dom, console = browse(page, tmp_path / "profile", "--dump-dom")
    assert console == []
    # The check comes first, though its taskset is the second.
    assert dom.count("<h2>Task check: ") == 1
    assert dom.index(f"<h2>Task check: {copy.name}</h2>") < dom.index("<h3>Summary</h3>")
    assert "rewards 1.0, &lt;0.0&gt;" in dom and "1 task(s) without problems" in dom
    assert dom.count('<svg class="chart histogram"') == 2
    assert dom.count('class="bar"') == 20  # ten bins a taskset
    oracle_summary = quickstart.summary(copied)
    assert len(oracle_summary["pass_at_k"]) == 2
    assert dom.count('class="point"') == 2  # pass@1 and pass@2 of the oracle run
    workers = {row["worker"] for row in quickstart.rows(copied)}
    assert len(re.findall(r'<g class="lane" data-worker="[^"]+"', dom)) == len(workers) + 1
    assert 'data-worker="main"' in dom  # the nop run had no workers
    assert dom.count('class="phase phase-agent"') == 12  # one a single-step episode
    assert dom.count('<details class="episode"') == 12
    assert "<strong>the verifier scored 0</strong> (4)" in dom
    # Every link to a log resolves from where the report is.
    links = re.findall(r'href="([^"#][^"]*)"', dom)
    assert links and all((page.parent / link).exists() for link in links)
    assert any(link.endswith("hello-world__r1/trajectory.json") for link in links)

    shot = tmp_path / "report.png"
    browse(page, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,3000")
    colours = png_colours(shot)
    assert len(colours) > 20  # text, tables and charts, not a blank page
    assert BAR_BLUE in colours and VERIFY_GREEN in colours


@pytest.mark.docker
def test_the_report_option(pytester: pytest.Pytester, harbor_dataset: Dataset) -> None:
    harbor_dataset.task("one")
    folder = harbor_dataset.results_folder(pytester.path / "out")
    run_harbor(pytester, harbor_dataset).assert_outcomes(passed=1)
    assert (folder / "report.html").is_file()
    # none: no report, and the one of the run before is gone with that run's files (a
    # check.json of an earlier check run too: the report would show it).
    (folder / "check.json").write_text('{"tasks": {}}')
    result = run_harbor(pytester, harbor_dataset, "--harbor-report=none")
    result.assert_outcomes(passed=1)
    assert not (folder / "report.html").exists() and not (folder / "check.json").exists()
    assert "report:" not in result.stdout.str()
    # The ini key: one file for the run, relative to where pytest runs.
    pytester.makeini("[pytest]\nharbor_report = reports/run.html\n")
    result = run_harbor(pytester, harbor_dataset)
    result.stdout.fnmatch_lines([f"report: {pytester.path / 'reports' / 'run.html'}"])
    html = (pytester.path / "reports" / "run.html").read_text()
    assert harbor_dataset.name in html and not (folder / "report.html").exists()
    summary = json.loads((folder / "rollouts_run_summary.json").read_text())
    assert summary["counts"]["passed"] == 1
