"""Which harnesses are trusted beside a verifier's secret under a root agent."""

from __future__ import annotations


def test_only_the_engines_own_harnesses_and_the_oracle_are_trusted() -> None:
    """A trusted harness runs beside a verifier's secret under a root agent: only those
    that run nothing but the task's own code and the engine's."""
    from pytest_harbor.harnesses import BUILT_IN_HARNESSES
    from pytest_harbor.harnesses.probe import ProbeHarness

    trusted = {name for name, factory in BUILT_IN_HARNESSES.items() if factory().trusted}
    assert trusted == {"oracle", "nop"}
    assert ProbeHarness.trusted
