"""The report page's inline style sheet and its few lines of script."""

from __future__ import annotations

__all__ = ["CSS", "SCRIPT"]

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1400px;padding:0 24px 48px;
color:#222;background:#fff}
h1{margin:24px 0 4px}h2{border-bottom:2px solid #ccc;margin-top:40px}h3{margin-top:28px}
.meta{color:#666;font-size:12px}nav ul{display:flex;gap:16px;list-style:none;padding:0}
.note{background:#fff6d6;border-left:4px solid #e0b000;padding:6px 10px}
.empty{color:#777;font-style:italic}
.figures{display:flex;flex-wrap:wrap;gap:10px}
.figure{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:90px}
.figure .value{display:block;font-size:20px;font-weight:600}.figure .label{color:#666}
table{border-collapse:collapse;margin:8px 0}th,td{border:1px solid #ddd;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}
table.sortable th{cursor:pointer}table.sortable th:hover{background:#e6e6e6}
td .links,td .meta{font-size:11px}td.reason{max-width:600px;white-space:pre-wrap;
word-break:break-word}
.s-passed{background:#e3f4e1}.s-failed{background:#fbe3e1}.s-masked{background:#eee}
.s-partial{background:#eef}.s-no_result{background:#fde9cc}.s-skipped,.s-not_run{background:#f7f7f7}
svg.chart{max-width:100%;height:auto;display:block;margin:8px 0}
.phase-build{fill:#bab0ac}.phase-start{fill:#f58518}.phase-agent{fill:#4c78a8}
.phase-verify{fill:#54a24b}
details.episode{border:1px solid #ddd;border-radius:6px;margin:6px 0;padding:4px 10px}
details.episode>summary{cursor:pointer}details.episode>summary span{padding:0 6px;
border-radius:4px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px}dt{color:#666}
dd{margin:0;white-space:pre-wrap;word-break:break-word}
.turn{border-top:1px dashed #ccc;padding:4px 0}
pre{white-space:pre-wrap;word-break:break-word;background:#f8f8f8;padding:6px;margin:4px 0;
max-height:480px;overflow:auto}
.step{border-left:3px solid #ccc;padding:2px 8px;margin:6px 0}.step-user{border-color:#f58518}
.step-agent{border-color:#4c78a8}.step-system{border-color:#999}.who{font-weight:600}
.tool-call pre{background:#eef3fa}.observation pre{background:#f1f8ef}
.live{background:#e8f1fb;border-left:4px solid #4c78a8;padding:6px 10px;margin-top:12px}
"""

# Sorting by a click on a column's head; the page reads the same without it.
SCRIPT = """
(function () {
  function key(cell) {
    var raw = cell.getAttribute("data-sort");
    if (raw === null) { raw = cell.textContent; }
    var number = parseFloat(raw);
    return raw !== "" && !isNaN(number) && isFinite(raw) ? number : raw.toLowerCase();
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("thead th").forEach(function (head, column) {
      head.addEventListener("click", function () {
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var up = head.getAttribute("data-order") !== "up";
        head.setAttribute("data-order", up ? "up" : "down");
        rows.sort(function (a, b) {
          var x = key(a.cells[column]), y = key(b.cells[column]);
          if (x === y) { return 0; }
          if (typeof x !== typeof y) { return (typeof x === "number" ? -1 : 1); }
          return (x < y ? -1 : 1) * (up ? 1 : -1);
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
  function openTarget() {
    var target = location.hash && document.getElementById(location.hash.slice(1));
    if (target && target.tagName === "DETAILS") { target.open = true; }
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();
})();
"""
