"""Hostile dataset names against the run folders, in whole runs on the scripted fake
sandboxes (tests/fake_provider.py): no engine is needed. Each test is an attack the
product refuses."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import pytest

import tests.fake_provider  # noqa: F401  (imported once, before any run: see the conftest)
from tests.fixtures import write_task

CONFTEST = """
from tests.fake_provider import FakeProvider

def pytest_harbor_sandbox_providers():
    return {"fake": lambda *, options, context: FakeProvider()}
"""


def run(pytester: pytest.Pytester, dataset: Path, agent: str) -> pytest.RunResult:
    return pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--harbor-sandbox=fake",
        f"--harbor-agent={agent}",
        f"--harbor-results-dir={pytester.path / 'out'}",
        "-p",
        "no:cacheprovider",
    )


def _runs(folder: Path) -> list[str]:
    runs = folder / "runs"
    return sorted(path.name for path in runs.iterdir()) if runs.is_dir() else []


def test_a_dataset_named_validation_leaves_the_oracles_runs_in_place(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    demo = pytester.path / "demo"
    write_task(demo, "alpha")
    assert run(pytester, demo, "oracle").ret == pytest.ExitCode.OK
    validated = pytester.path / "out" / "harbor" / "validation" / "demo"
    before = _runs(validated)
    assert len(before) == 1

    hostile = pytester.path / "sets" / "validation"
    write_task(hostile, "beta")
    run(pytester, hostile, "nop")
    assert _runs(validated) == before


def test_a_dataset_named_like_the_earlier_layouts_folder_keeps_its_runs(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    hostile = pytester.path / "sets" / "demo.previous"
    write_task(hostile, "beta")
    run(pytester, hostile, "nop")
    theirs = pytester.path / "out" / "harbor" / "demo.previous"
    before = _runs(theirs)
    assert len(before) == 1

    demo = pytester.path / "demo"
    write_task(demo, "alpha")
    run(pytester, demo, "nop")
    assert _runs(theirs) == before
    assert len(_runs(pytester.path / "out" / "harbor" / "demo")) == 1


class _HostileStatusLine:
    """An endpoint that answers every request with an HTTP error whose reason phrase holds
    terminal escapes (a window title, a cleared screen) and a C1 CSI."""

    REASON = b"Unauthorized \x1b]0;pwned\x07\x1b[2J\x9b31m"

    def __enter__(self) -> str:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        return f"http://127.0.0.1:{self.server.getsockname()[1]}/v1"

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(5)
                with contextlib.suppress(OSError):
                    connection.recv(65536)
                    connection.sendall(
                        b"HTTP/1.1 401 " + self.REASON + b"\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 2\r\n"
                        b"Connection: close\r\n\r\n{}"
                    )

    def __exit__(self, *exc: object) -> None:
        self.server.close()


def test_the_endpoints_reason_phrase_cannot_send_escapes_to_the_terminal(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = pytester.path / "tasks"
    write_task(dataset, "alpha")
    monkeypatch.setenv("HARBOR_MODEL_API_KEY", "sk-not-a-real-key")
    with _HostileStatusLine() as url:
        result = pytester.runpytest(
            f"--harbor-dataset={dataset}",
            f"--harbor-results-dir={pytester.path / 'out'}",
            "--harbor-agent=shell-agent",
            "--harbor-model=gpt-test",
            f"--harbor-model-url={url}",
            "-p",
            "no:cacheprovider",
        )
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "Unauthorized" in output
    assert "\x1b" not in output and "\x9b" not in output
