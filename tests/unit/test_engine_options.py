"""The docker provider's `hosts`: several engines, each checked, named in the error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.locks import Slots
from pytest_harbor.sandboxes import ProviderContext, ProviderOptionsError, make_provider
from pytest_harbor.sandboxes.docker import DockerFleet, DockerProvider, Endpoint
from pytest_harbor.sandboxes.docker.watchdog import engine_socket


def _make(hosts: Any, tmp_path: Path) -> Any:
    return make_provider(
        "docker", {"hosts": hosts}, context=ProviderContext(run_id="r", scratch_dir=tmp_path)
    )


def _tls_folder(tmp_path: Path) -> str:
    folder = tmp_path / "tls"
    folder.mkdir()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (folder / name).write_text("x")
    return str(folder)


def test_hosts_make_a_fleet_of_engines(tmp_path: Path) -> None:
    pytest.importorskip("paramiko", reason="ssh:// engines need the ssh extra (paramiko)")
    tls = _tls_folder(tmp_path)
    fleet = _make(
        [
            "unix:///var/run/docker.sock",
            {"url": "tcp://10.0.0.5:2376", "capacity": 8, "name": "big", "cert_path": tls},
            {"url": "ssh://ci@builder", "tls_verify": False},
        ],
        tmp_path,
    )
    assert isinstance(fleet, DockerFleet)
    assert [engine.name for engine in fleet.engines] == [
        "unix:///var/run/docker.sock",
        "big",
        "ssh://ci@builder",
    ]
    assert [engine.capacity for engine in fleet.engines] == [None, 8, None]
    big = fleet.engines[1].provider
    assert isinstance(big, DockerProvider)
    assert big.endpoint == Endpoint("tcp://10.0.0.5:2376", cert_path=tls)
    # Each engine may copy an image from the others.
    assert fleet.engines[0].provider.peers == [engine.provider for engine in fleet.engines[1:]]


def test_without_hosts_the_provider_is_the_environment_s_engine(tmp_path: Path) -> None:
    provider = make_provider("docker", {}, context=ProviderContext(scratch_dir=tmp_path))
    assert isinstance(provider, DockerProvider) and provider.endpoint is None


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ([], "the docker provider's hosts must be a list of engines"),
        ("unix:///x", "the docker provider's hosts must be a list of engines"),
        ([42], "hosts[0]: expected an engine URL or a mapping with url"),
        (["http://x"], "hosts[0].url: expected unix://PATH, tcp://HOST:PORT or ssh://USER@HOST"),
        ([{"capacity": 2}], "hosts[0].url: expected unix://PATH"),
        (["unix:///a", {"url": "unix:///b", "capacity": 0}], "hosts[1].capacity: expected a whole"),
        ([{"url": "unix:///b", "capacity": True}], "hosts[0].capacity: expected a whole"),
        ([{"url": "unix:///b", "tls_verify": "yes"}], "hosts[0].tls_verify: expected true or"),
        ([{"url": "unix:///b", "cert_path": 3}], "hosts[0].cert_path: expected a folder"),
        ([{"url": "tcp://h:2376", "socket": 1}], "hosts[0].socket: expected the path of"),
        ([{"url": "unix:///b", "weight": 3}], "hosts[0]: unknown keys weight"),
        ([{"url": "tcp://h:2376", "cert_path": "/nowhere"}], "hosts[0].cert_path: /nowhere has no"),
        (["unix:///a", "unix:///a"], "the docker provider's hosts name one engine twice"),
    ],
)
def test_bad_hosts_are_refused_naming_the_entry(hosts: Any, message: str, tmp_path: Path) -> None:
    with pytest.raises(ProviderOptionsError, match=None) as raised:
        _make(hosts, tmp_path)
    assert str(raised.value).startswith(message)


def test_tls_and_ssh_reach_the_client_and_the_cli(tmp_path: Path) -> None:
    folder = _tls_folder(tmp_path)
    tls = Endpoint("tcp://10.0.0.5:2376", cert_path=folder)
    kwargs = tls.client_kwargs()
    assert kwargs["base_url"] == "tcp://10.0.0.5:2376"
    assert kwargs["tls"].cert == (f"{folder}/cert.pem", f"{folder}/key.pem")
    assert kwargs["tls"].ca_cert == f"{folder}/ca.pem" and kwargs["tls"].verify is True
    env = tls.cli_env()
    assert env["DOCKER_HOST"] == "tcp://10.0.0.5:2376"
    assert env["DOCKER_CERT_PATH"] == folder and env["DOCKER_TLS_VERIFY"] == "1"
    assert Endpoint("ssh://ci@builder").client_kwargs()["use_ssh_client"] is True
    assert "DOCKER_TLS_VERIFY" not in Endpoint("unix:///x").cli_env()


def test_free_slots_are_counted_without_being_held(tmp_path: Path) -> None:
    slots = Slots(tmp_path / "s", 3)
    held = slots.try_acquire()
    assert held is not None
    assert slots.free() == 2
    assert slots.free() == 2  # looking does not take one
    others = [slots.try_acquire(), slots.try_acquire()]
    assert all(others) and slots.try_acquire() is None and slots.free() == 0
    held.release()
    assert slots.free() == 1


def test_an_ssh_engine_without_paramiko_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pytest_harbor.sandboxes.docker.options._can_ssh", lambda: False)
    with pytest.raises(ProviderOptionsError, match=r"pytest-harbor\[ssh\]"):
        _make(["unix:///a", "ssh://ci@builder"], tmp_path)


def test_the_engine_socket_a_watchdog_is_given(tmp_path: Path) -> None:
    """A unix:// engine's own path, else Docker's default place, unless `socket` says."""
    assert engine_socket(Endpoint("unix:///run/b.sock"), {}) == "/run/b.sock"
    assert engine_socket(Endpoint("tcp://h:2376"), {}) == "/var/run/docker.sock"
    assert engine_socket(None, {"DOCKER_HOST": "unix:///x.sock"}) == "/x.sock"
    fleet = _make([{"url": "tcp://h:2376", "socket": "/srv/docker.sock"}], tmp_path)
    assert isinstance(fleet, DockerFleet)
    assert fleet.engines[0].provider.engine_socket == "/srv/docker.sock"
