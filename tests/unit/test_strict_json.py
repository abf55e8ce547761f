"""Every results file is strict JSON: odd numbers become null, never NaN or Infinity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pytest_harbor import strict_json
from pytest_harbor.redaction import Redactor
from pytest_harbor.writers.rollouts import ResultsLayout, RolloutsWriter


def refuse(constant: str) -> object:
    raise ValueError(constant)


def test_non_finite_floats_become_null_at_any_depth() -> None:
    value = {"a": math.inf, "b": [1.5, -math.inf, {"c": math.nan}], "d": (math.nan,), "e": 2}
    text = strict_json.dumps(value, sort_keys=True)
    assert json.loads(text, parse_constant=refuse) == {
        "a": None,
        "b": [1.5, None, {"c": None}],
        "d": [None],
        "e": 2,
    }


def test_plain_json_is_not_strict_and_the_rows_writer_is(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        json.loads(json.dumps({"a": math.inf}), parse_constant=refuse)
    writer = RolloutsWriter(
        ResultsLayout(tmp_path, validation=True, runs={"ts": "run"}), Redactor([])
    )
    line = writer._line({"task_id": "t", "reward": math.inf, "usage": {"cost_usd": math.nan}})
    assert json.loads(line, parse_constant=refuse) == {
        "task_id": "t",
        "reward": None,
        "usage": {"cost_usd": None},
    }
