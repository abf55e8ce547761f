"""The parts of a Compose task that need no engine: the episode's project (ports, names,
labels, the internal network, main's settings), project names, and the overlay's MCP
servers merged into a task's."""

from __future__ import annotations

from pathlib import Path

from pytest_harbor.sandboxes.compose.project import episode_project, project_name
from pytest_harbor.sandboxes.compose.tasks import with_overlay
from pytest_harbor.settings import ComposeOverlay, HarborSettings
from pytest_harbor.tasks import load_task
from tests.fixtures import write_task

CANONICAL = {
    "name": "environment",
    "services": {
        "main": {"image": "task:1", "networks": {"default": None}},
        "api": {
            "build": {"context": "/task/environment/api"},
            "container_name": "fixed",
            "ports": [{"target": 80, "published": "8080", "host_ip": "0.0.0.0", "protocol": "tcp"}],
            "labels": {"own": "yes"},
        },
    },
    "networks": {"default": {"name": "environment_default"}, "back": {"name": "x"}},
    "volumes": {"data": {"name": "environment_data"}},
}


def project(internal: bool = False) -> dict[str, object]:
    return episode_project(
        CANONICAL,
        name="hb-ep-1",
        main_image="layer:1",
        built={"api": "hb__api"},
        labels={"pytest-harbor.run": "r"},
        main={"entrypoint": ["/.pytest-harbor/busybox", "sleep"], "environment": {"A": "1"}},
        internal=internal,
    )


def test_the_episode_project_is_the_episodes_own() -> None:
    config = project()
    services = config["services"]
    assert config["name"] == "hb-ep-1"
    api = services["api"]
    assert api["image"] == "hb__api" and "build" not in api
    assert "container_name" not in api
    assert api["ports"] == [{"target": 80, "protocol": "tcp"}], "the engine picks host ports"
    assert api["labels"] == {"own": "yes", "pytest-harbor.run": "r"}
    main = services["main"]
    assert main["image"] == "layer:1"
    assert main["entrypoint"] == ["/.pytest-harbor/busybox", "sleep"]
    assert main["environment"] == {"A": "1"}
    assert config["networks"]["default"]["name"] == "hb-ep-1_default"
    assert config["networks"]["back"]["name"] == "hb-ep-1_back"
    assert config["volumes"]["data"]["name"] == "hb-ep-1_data"
    assert config["volumes"]["data"]["labels"] == {"pytest-harbor.run": "r"}
    assert "internal" not in config["networks"]["default"]
    assert CANONICAL["services"]["api"]["ports"][0]["published"] == "8080", "a copy is changed"


def test_no_network_makes_the_projects_networks_internal() -> None:
    networks = project(internal=True)["networks"]
    assert all(network["internal"] is True for network in networks.values())


def test_project_names_are_what_compose_takes() -> None:
    name = project_name("My Task/r0 (x)", "ab12")
    assert name == "hb-my-task-r0--x-ab12"
    assert project_name("", "ab12") == "hb-episode-ab12"


def test_the_overlay_mcp_servers_join_the_tasks(tmp_path: Path) -> None:
    folder = write_task(
        tmp_path,
        "mcp",
        toml=(
            '[environment]\ndocker_image = "x"\n'
            '[[environment.mcp_servers]]\nname = "files"\ntransport = "sse"\n'
            'url = "http://files:1/sse"\n'
            '[[environment.mcp_servers]]\nname = "search"\ntransport = "sse"\n'
            'url = "http://old:1/sse"\n'
        ),
    )
    task = load_task(folder)
    overlay = ComposeOverlay.model_validate(
        {"mcp_servers": [{"name": "search", "transport": "http", "url": "http://new:2/mcp"}]}
    )
    merged = with_overlay(task, HarborSettings(compose_overlay=overlay))
    servers = {s.name: s for s in merged.config.environment.mcp_servers}
    assert sorted(servers) == ["files", "search"]
    assert servers["search"].url == "http://new:2/mcp"
    assert servers["search"].transport == "streamable-http"
    assert with_overlay(task, HarborSettings()) is task
