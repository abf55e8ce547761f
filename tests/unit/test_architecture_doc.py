"""docs/architecture.md names every module and sub-package of `sandboxes/`, `engine/`,
`run/` and `plugin/` in that folder's section: a module added without a word on its job
fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
FOLDERS = [
    ("sandboxes", "The sandboxes folder"),
    ("engine", "The engine folder"),
    ("run", "The run folder"),
    ("plugin", "The plugin folder"),
]


def section(heading: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    found = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert found, f"docs/architecture.md has no section {heading!r}"
    return found.group(1)


def parts_of(folder: str) -> list[str]:
    """The folder's modules (`name.py`) and sub-packages (`name/`), its __init__ aside."""
    base = ROOT / "pytest_harbor" / folder
    modules = [path.name for path in base.glob("*.py") if path.name != "__init__.py"]
    packages = [
        f"{path.name}/"
        for path in base.iterdir()
        if path.is_dir() and not path.name.startswith(("_", "."))
    ]
    return sorted(modules + packages)


@pytest.mark.parametrize(("folder", "heading"), FOLDERS)
def test_every_module_of_the_folder_is_in_its_section(folder: str, heading: str) -> None:
    text = section(heading)
    missing = [name for name in parts_of(folder) if f"`{name}`" not in text]
    assert missing == [], f"docs/architecture.md, {heading!r}, does not name: {missing}"


def test_a_named_module_that_does_not_exist_fails_too() -> None:
    """Names in the two sections that look like modules are files of the folder (or of
    its sub-packages)."""
    for folder, heading in FOLDERS:
        named = set(re.findall(r"`([a-z_]+\.py)`", section(heading)))
        files = {path.name for path in (ROOT / "pytest_harbor" / folder).rglob("*.py")}
        gone = sorted(named - files - {"conftest.py"})  # pytest's, not ours
        assert gone == [], f"{heading!r} names modules that do not exist: {gone}"
