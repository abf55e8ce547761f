"""A failure's reason that quotes a sandbox (here a provider's start error, as Docker's
quotes what the image said) shows escaped in the terminal and the junit XML, and stays as
written in the failures file. None of these starts a container."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.fixtures import write_task

#: A provider whose start error quotes what a hostile image printed.
PROVIDER = r"""
from pytest_harbor.sandboxes import ImageConfig, SandboxCapabilities, SandboxStartError

SAID = (
    "title \x1b]0;pwned\x07 clip \x1b]52;c;cHduZWQ=\x07 csi \x1b[2J\x1b[31mred\x1b[0m "
    "all good\rFAKE c1 \x9b\x9d bidi \u202eevil\u202c \u2066iso\u2069 zw\u200b end"
)


class Hostile:
    name = "hostile"
    capabilities = SandboxCapabilities()

    def prepare_image(self, source):
        return source.docker_image

    def image_config(self, image):
        return ImageConfig()

    def prepare_layer(self, layer):
        return layer.base

    def start(self, spec):
        raise SandboxStartError(f"the image said: {SAID}")

    def remove_labelled(self, labels):
        return 0

    def labelled(self, key):
        return []

    def remove(self, sandbox_id):
        pass

    def remove_image(self, image):
        pass


def pytest_harbor_sandbox_providers():
    return {"hostile": lambda *, options, context: Hostile()}
"""

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")
ESCAPED = (
    r"title \x1b]0;pwned\x07 clip \x1b]52;c;cHduZWQ=\x07 csi \x1b[2J\x1b[31mred\x1b[0m "
    r"all good\rFAKE c1 \x9b\x9d bidi \u202eevil\u202c \u2066iso\u2069 zw\u200b end"
)


def test_a_reason_quoting_a_sandbox_shows_escaped(pytester: pytest.Pytester) -> None:
    dataset = pytester.path / "tasks"
    write_task(dataset, "plain")
    pytester.makeconftest(PROVIDER)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest(
        f"--harbor-dataset={dataset}",
        "--harbor-sandbox=hostile",
        "--harbor-results-dir=out",
        f"--junitxml={junit}",
        "-v",
        "-rA",
    )
    result.assert_outcomes(errors=1)
    shown = result.stdout.str() + result.stderr.str()
    xml = junit.read_text()
    for where, text in (("terminal", shown), ("junit XML", xml)):
        assert RAW.findall(text) == [], where
        assert ESCAPED in text, where
    failures = Path(pytester.path / "out/harbor/validation/tasks/latest/rollouts_failures.jsonl")
    (failure,) = [json.loads(line) for line in failures.read_text().splitlines()]
    assert "\x1b]0;pwned\x07" in failure["failure_reason"]
    assert "\u202eevil" in failure["failure_reason"]
