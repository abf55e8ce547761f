"""The model spend of a taskset's run as the report shows it: per task, from its run
summary's `usage_per_task` (what the model relay counted, retried attempts included)."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from pytest_harbor import strict_json
from pytest_harbor.report.results import as_mapping

__all__ = ["spend_table"]

_COLUMNS = (
    ("requests", "Requests"),
    ("prompt_tokens", "Prompt tokens"),
    ("completion_tokens", "Completion tokens"),
    ("cached_tokens", "Cached"),
)


def spend_table(summary: Mapping[str, Any]) -> str:
    """A sortable table of each task's model calls, tokens and cost; nothing when the
    run called no model."""
    per_task = as_mapping(summary.get("usage_per_task"))
    if not per_task:
        return ""
    head = "<tr><th>Task</th>" + "".join(f"<th>{label}</th>" for _, label in _COLUMNS)
    head += "<th>Cost (USD)</th></tr>"
    rows = []
    for task, raw in per_task.items():
        usage = as_mapping(raw)
        cells = "".join(_count_cell(usage.get(key)) for key, _ in _COLUMNS)
        cost = strict_json.as_float(usage.get("cost_usd"))
        shown = "unpriced" if cost is None else f"{cost:.4f}"
        rows.append(
            f'<tr><td data-sort="{escape(str(task))}">{escape(str(task))}</td>{cells}'
            f'<td data-sort="{"" if cost is None else cost}">{shown}</td></tr>'
        )
    return (
        '<h3>Model spend</h3><table class="spend sortable">'
        f"<thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _count_cell(value: object) -> str:
    count = value if isinstance(value, int) and not isinstance(value, bool) else 0
    return f'<td data-sort="{count}">{count:,}</td>'
