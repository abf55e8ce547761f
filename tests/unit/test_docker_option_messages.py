"""Every `sandbox_provider_options` the docker provider refuses, in the whole sentence its
user reads: the first problem found, where it is, and what is expected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_harbor.sandboxes import ProviderContext, ProviderOptionsError, make_provider
from pytest_harbor.sandboxes.base import NamesBuilder
from pytest_harbor.sandboxes.docker.builders import builder_hint

_SCHEMES = "expected unix://PATH, tcp://HOST:PORT or ssh://USER@HOST"
_ENGINE_KEYS = "(an engine takes capacity, cert_path, name, socket, tls_verify, url)"
_TLS_FILES = "(the folder holds the client's TLS files as Docker names them)"
_SSH = (
    "an ssh:// engine needs paramiko, which the Docker SDK imports for it: "
    "pip install 'pytest-harbor[ssh]'"
)


def _refusal(options: dict[Any, Any], tmp_path: Path) -> str:
    with pytest.raises(ProviderOptionsError) as raised:
        make_provider("docker", options, context=ProviderContext(run_id="r", scratch_dir=tmp_path))
    return str(raised.value)


def _engine(**keys: Any) -> dict[str, Any]:
    return {"hosts": [keys]}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"colour": 1},
            "the docker provider takes the options network, builder and hosts, not: colour",
        ),
        (
            {"size": 1, "colour": 2},
            "the docker provider takes the options network, builder and hosts, not: size, colour",
        ),
        ({"builder": "fast"}, "the docker provider's builder is auto, buildkit or classic"),
        ({"builder": None}, "the docker provider's builder is auto, buildkit or classic"),
        ({"network": ""}, "the docker provider's network must be a network's name"),
        ({"network": 3}, "the docker provider's network must be a network's name"),
        ({"hosts": {"url": "unix:///a"}}, "the docker provider's hosts must be a list of engines"),
        ({"hosts": [None]}, "hosts[0]: expected an engine URL or a mapping with url"),
        ({"hosts": [True]}, "hosts[0]: expected an engine URL or a mapping with url"),
        ({"hosts": ["http://x"]}, f"hosts[0].url: {_SCHEMES}, got 'http://x'"),
        ({"hosts": [""]}, f"hosts[0].url: {_SCHEMES}, got ''"),
        (_engine(), f"hosts[0].url: {_SCHEMES}, got None"),
        (_engine(url=None), f"hosts[0].url: {_SCHEMES}, got None"),
        (_engine(url=3), "hosts[0].url: Input should be a valid string"),
        (_engine(url="unix:///b", name=3), "hosts[0].name: Input should be a valid string"),
        (
            _engine(url="unix:///b", capacity=-3),
            "hosts[0].capacity: expected a whole number of at least 1",
        ),
        (
            _engine(url="unix:///b", capacity="2"),
            "hosts[0].capacity: expected a whole number of at least 1",
        ),
        (
            _engine(url="unix:///b", capacity=2.0),
            "hosts[0].capacity: expected a whole number of at least 1",
        ),
        (_engine(url="unix:///b", tls_verify=None), "hosts[0].tls_verify: expected true or false"),
        (_engine(url="unix:///b", tls_verify=1), "hosts[0].tls_verify: expected true or false"),
        (_engine(url="unix:///b", cert_path=3), "hosts[0].cert_path: expected a folder's path"),
        (
            _engine(url="tcp://h:2376", socket=1),
            "hosts[0].socket: expected the path of the engine's socket on its machine",
        ),
        (
            _engine(url="unix:///b", weight=3, zeta=1),
            f"hosts[0]: unknown keys weight {_ENGINE_KEYS}",
        ),
        (_engine(zeta=1, weight=3, url="unix:///b"), f"hosts[0]: unknown keys zeta {_ENGINE_KEYS}"),
        (
            _engine(url="tcp://h:2376", cert_path="/nowhere"),
            f"hosts[0].cert_path: /nowhere has no cert.pem, key.pem, ca.pem {_TLS_FILES}",
        ),
        ({"hosts": [{1: 2}]}, "hosts[0].1: Keys should be strings"),
        (
            {"colour": 3, 1: 2},
            "the docker provider takes the options network, builder and hosts, not: colour",
        ),
        (
            {"hosts": [{"capacity": 0, 1: 2}]},
            "hosts[0].capacity: expected a whole number of at least 1",
        ),
        # The first problem is the one told: a key's value before an unknown key, an
        # unknown key before a missing url, all of those before the certificates.
        (
            _engine(weight=3, capacity=0),
            "hosts[0].capacity: expected a whole number of at least 1",
        ),
        (_engine(url="http://x", weight=3), f"hosts[0].url: {_SCHEMES}, got 'http://x'"),
        (_engine(weight=3), f"hosts[0]: unknown keys weight {_ENGINE_KEYS}"),
        (_engine(cert_path="/nowhere"), f"hosts[0].url: {_SCHEMES}, got None"),
        (
            _engine(url="tcp://h:2376", cert_path="/nowhere", capacity=0),
            "hosts[0].capacity: expected a whole number of at least 1",
        ),
        ({"hosts": [42, "http://x"]}, "hosts[0]: expected an engine URL or a mapping with url"),
        ({"hosts": ["ssh://ci@b", "http://x"]}, f"hosts[1].url: {_SCHEMES}, got 'http://x'"),
        (
            {"colour": 1, "hosts": [{"url": "unix:///b", "weight": 3}]},
            f"hosts[0]: unknown keys weight {_ENGINE_KEYS}",
        ),
        (
            {"colour": 1, "hosts": [42]},
            "hosts[0]: expected an engine URL or a mapping with url",
        ),
        (
            {"hosts": ["unix:///a", "unix:///a"], "colour": 1},
            "the docker provider takes the options network, builder and hosts, not: colour",
        ),
        (
            {"hosts": [42], "builder": "x"},
            "the docker provider's builder is auto, buildkit or classic",
        ),
        ({"builder": "x", "network": ""}, "the docker provider's network must be a network's name"),
        ({"network": 3, "hosts": []}, "the docker provider's network must be a network's name"),
        (
            {"hosts": [{"url": "unix:///a", "capacity": 1}, "unix:///a"]},
            "the docker provider's hosts name one engine twice",
        ),
    ],
)
def test_a_bad_option_reads_as_one_sentence(
    options: dict[Any, Any], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pytest_harbor.sandboxes.docker.options._can_ssh", lambda: True)
    assert _refusal(options, tmp_path) == message


def test_a_folder_missing_one_tls_file_names_it(tmp_path: Path) -> None:
    folder = tmp_path / "tls"
    folder.mkdir()
    for name in ("cert.pem", "key.pem"):
        (folder / name).write_text("x")
    assert _refusal(_engine(url="tcp://h:2376", cert_path=str(folder)), tmp_path) == (
        f"hosts[0].cert_path: {folder} has no ca.pem {_TLS_FILES}"
    )
    # Without verification the engine's CA is not needed.
    fleet = make_provider(
        "docker",
        _engine(url="tcp://h:2376", cert_path=str(folder), tls_verify=False),
        context=ProviderContext(run_id="r", scratch_dir=tmp_path),
    )
    assert fleet.name == "docker"


@pytest.mark.parametrize(
    "options",
    [{"hosts": ["ssh://ci@b"]}, _engine(url="ssh://ci@b", capacity=0)],
)
def test_an_ssh_engine_without_paramiko_is_refused_before_its_other_keys(
    options: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pytest_harbor.sandboxes.docker.options._can_ssh", lambda: False)
    assert _refusal(options, tmp_path) == f"hosts[0].url: {_SSH}"


def test_a_failed_builds_hint_names_a_setting_that_picks_the_other_builder(tmp_path: Path) -> None:
    """The setting a failed classic build names is one the docker provider takes, and it
    picks BuildKit; a failed BuildKit build names the setting it ran under."""
    hint = builder_hint("classic")
    assert hint.startswith("built with the classic builder")
    setting = hint.split("--harbor-set ", 1)[1].split()[0]
    key, value = setting.split("=")
    assert key == "sandbox_provider_options.builder"
    context = ProviderContext(run_id="r", scratch_dir=tmp_path)
    provider = make_provider("docker", {key.split(".")[1]: value}, context=context)
    assert isinstance(provider, NamesBuilder)
    assert provider.builder == "buildkit"
    assert builder_hint("buildkit").startswith(f"built with BuildKit ({key}=buildkit)")
