"""Writing result files so that a reader never sees half of one."""

from __future__ import annotations

from pytest_harbor.atomic import write_atomically

__all__ = ["write_atomically"]
