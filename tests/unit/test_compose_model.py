"""The model of what a Compose file may hold: the project is written out from it (what it
does not know never passes through), and reading any configuration or any file text
ends in a project or a refusal, never another exception."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_harbor.sandboxes.compose.model import ComposeRefused, read_project
from pytest_harbor.sandboxes.compose.source import check_source


def test_the_project_is_written_out_from_the_model(tmp_path: Path) -> None:
    config = {
        "name": "chosen",
        "x-anything": {"cap_add": ["ALL"]},
        "services": {
            "main": {
                "image": "busybox:musl",
                "x-note": "left out",
                "environment": {"A": "1", "B": None},
                "volumes": [
                    {"type": "bind", "source": str(tmp_path / "data"), "target": "/data"},
                    {"type": "volume", "source": "cache", "target": "/cache"},
                ],
                "networks": {"back": {"aliases": ["m"]}},
            }
        },
        "networks": {"back": {"name": "pytest-harbor-tools-0123", "internal": True, "ipam": {}}},
        "volumes": {"cache": {"name": "pytest-harbor-tools-0123", "driver": "local"}},
    }
    project = read_project(tmp_path, tmp_path / "compose.yaml", config)
    assert project == {
        "services": {
            "main": {
                "image": "busybox:musl",
                "environment": {"A": "1"},
                "volumes": [
                    {
                        "type": "bind",
                        "source": str(tmp_path / "data"),
                        "target": "/data",
                        "read_only": True,
                    },
                    {"type": "volume", "source": "cache", "target": "/cache"},
                ],
                "networks": {"back": {"aliases": ["m"]}},
            }
        },
        "networks": {"back": {"internal": True, "ipam": {}}},
        "volumes": {"cache": {"driver": "local"}},
    }


@pytest.mark.parametrize(
    ("service", "key"),
    [
        ({"volumes": [{"type": "volume", "source": "elsewhere", "target": "/x"}]}, "source"),
        ({"volumes": [{"type": "npipe", "source": "x", "target": "/x"}]}, "volumes[0]"),
        ({"depends_on": {"ghost": {"condition": "service_started"}}}, "depends_on.ghost"),
        ({"networks": {"outside": None}}, "networks.outside"),
        ({"pid": "container:abc"}, "pid"),
        ({"ipc": "host"}, "ipc"),
        ({"cgroup": "host"}, "cgroup"),
        ({"privileged": True}, "privileged"),
        ({"deploy": {"resources": {"reservations": {"devices": [{"count": 1}]}}}}, "devices"),
        ({"ports": [{"target": 80, "host_ip": {"x": 1}}]}, "host_ip"),
    ],
)
def test_a_value_outside_the_model_is_refused_by_its_key(
    tmp_path: Path, service: dict[str, Any], key: str
) -> None:
    config = {"services": {"main": {"image": "busybox:musl", **service}}}
    with pytest.raises(ComposeRefused) as caught:
        read_project(tmp_path, tmp_path / "compose.yaml", config)
    assert caught.value.key is not None and caught.value.key.endswith(key), caught.value.key


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=30,
)
KEYS = st.sampled_from(["services", "volumes", "networks", "secrets", "configs", "name", "x-a"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, JSON | st.dictionaries(st.sampled_from(["main", "db"]), JSON)))
def test_reading_any_configuration_gives_a_project_or_a_refusal(config: dict[str, Any]) -> None:
    root = Path("/nonexistent-task")
    try:
        project = read_project(root, root / "compose.yaml", config)
    except ComposeRefused as refusal:
        assert refusal.file == root / "compose.yaml"
    else:
        assert set(project) <= {"services", "volumes", "networks", "secrets", "configs"}


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_reading_any_file_text_checks_or_refuses(tmp_path_factory: Any, text: str) -> None:
    folder = tmp_path_factory.mktemp("task")
    file = folder / "compose.yaml"
    file.write_text(text)
    try:
        check_source(folder, file)
    except ComposeRefused as refusal:
        assert refusal.file == file


def test_the_docs_list_every_key_the_model_holds_or_refuses() -> None:
    """docs/compose-tasks.md says what a Compose file may hold: every key of the model's
    tables is named there."""
    from pytest_harbor.sandboxes.compose.model import SERVICE, SERVICE_REFUSED, TOP_LEVEL_REFUSED

    page = (Path(__file__).resolve().parents[2] / "docs" / "compose-tasks.md").read_text()
    section = page.split("## What a Compose file may hold")[1].split("\n## ")[0]
    missing = [
        key
        for key in (*SERVICE, *SERVICE_REFUSED, *TOP_LEVEL_REFUSED)
        if f"`{key}`" not in section and f"`{key}:" not in section
    ]
    assert missing == []
