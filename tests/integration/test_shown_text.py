"""What a sandbox prints reaches a person as text: escape sequences, C1 controls and
bidi overrides in a verifier's or a solution's output show escaped in the terminal, the
junit XML and the HTML report, never raw; the files copied out keep them as written."""

from __future__ import annotations

import re

import pytest

from tests.fixtures import Dataset, run_harbor

pytestmark = pytest.mark.docker

#: A window title, the clipboard (OSC 52), a cleared screen and colour (CSI), a line
#: written over (CR), a bell, the C1 forms of CSI and OSC, text reversed by U+202E.
ATTACK = (
    r"printf 'title \033]0;pwned\007 clip \033]52;c;cHduZWQ=\007 csi \033[2J\033[31mred\033[0m\n'"
    "\n"
    r"printf 'all good\rFAKE bell\007 c1 \302\233 \302\235 bidi \342\200\256evil\342\200\254 end\n'"
    "\n"
)

#: Raw characters that must not reach a person: C0 but newline and tab, DEL, C1, and the
#: bidi and format characters used above.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def test_escape_sequences_from_a_sandbox_show_escaped(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task(
        "hostile-output",
        test_sh=ATTACK + "echo 0 > /logs/verifier/reward.txt\n",
        solve_sh=ATTACK + "exit 1\n",
    )
    junit = pytester.path / "junit.xml"
    result = run_harbor(pytester, dataset, "-v", "-rA", f"--junitxml={junit}")
    result.assert_outcomes(failed=1)
    shown = result.stdout.str() + result.stderr.str()
    xml = junit.read_text()
    for where, text in (("terminal", shown), ("junit XML", xml)):
        assert RAW.findall(text) == [], where
        # Both outputs were shown, escaped.
        assert r"title \x1b]0;pwned\x07 clip \x1b]52;c;cHduZWQ=\x07" in text, where
        assert r"csi \x1b[2J\x1b[31mred\x1b[0m" in text, where
        assert r"all good\rFAKE bell\x07 c1 \x9b \x9d bidi \u202eevil\u202c end" in text, where
    assert "last lines of test-stdout.txt" in shown
    assert "last lines of /logs/agent/oracle.txt" in shown
    folder = dataset.results_folder(pytester.path / "out")
    page = (folder / "report.html").read_text()
    assert RAW.findall(page) == []
    assert r"\u202eevil" in page
    # The files copied out keep what the sandbox wrote, byte for byte.
    stdout = (folder / "verifier" / "hostile-output__r0" / "test-stdout.txt").read_bytes()
    assert b"\x1b]0;pwned\x07" in stdout
    oracle = (folder / "agent" / "hostile-output__r0" / "oracle.txt").read_bytes()
    assert b"\xe2\x80\xaeevil" in oracle
