"""GPUs: the request each sandbox carries, the refusal on an engine without a GPU runtime,
GPU tasks on a provider of their own (`gpu_sandbox_provider`), `request_gpu_type`, and a
GPU task end to end where the engine has GPUs (skipped elsewhere)."""

from __future__ import annotations

import json
import textwrap

import docker
import pytest

from pytest_harbor.sandboxes.base import SandboxSpec, SandboxStartError
from pytest_harbor.sandboxes.docker.limits import GPU_RUNTIME, compose_gpu_request, gpu_request
from pytest_harbor.sandboxes.docker.provider import DockerProvider
from pytest_harbor.settings import SettingsError, load_settings, parse_assignments
from tests.fixtures import BASE_IMAGE, Dataset, run_harbor

GPU_TOML = (
    f'[environment]\ndocker_image = "{BASE_IMAGE}"\ngpus = 1\ngpu_types = ["H100", "A100"]\n'
    "[agent]\ntimeout_sec = 60\n"
)


def test_a_sandbox_asks_the_engine_for_its_gpus() -> None:
    assert gpu_request(SandboxSpec(image="x")) == {}
    (request,) = gpu_request(SandboxSpec(image="x", gpus=2))["device_requests"]
    assert request["Count"] == 2 and request["Capabilities"] == [["gpu"]]
    assert compose_gpu_request(SandboxSpec(image="x", gpus=2)) == {
        "deploy": {
            "resources": {
                "reservations": {
                    "devices": [{"driver": "nvidia", "count": 2, "capabilities": ["gpu"]}]
                }
            }
        }
    }
    with pytest.raises(SandboxStartError, match="cannot choose a GPU type \\('H100'\\)"):
        gpu_request(SandboxSpec(image="x", gpus=1, gpu_type="H100"))


def test_the_gpu_settings_are_read_and_a_bad_block_names_its_key() -> None:
    settings = load_settings(
        {},
        [],
        parse_assignments(
            [
                "gpu_sandbox_provider.sandbox=docker",
                "gpu_sandbox_provider.options.network=host",
                "request_gpu_type=true",
            ]
        ),
    )
    assert settings.gpu_sandbox_provider is not None
    assert settings.gpu_sandbox_provider.sandbox == "docker"
    assert settings.gpu_sandbox_provider.options == {"network": "host"}
    assert settings.request_gpu_type
    with pytest.raises(SettingsError, match="gpu_sandbox_provider"):
        load_settings({}, [], parse_assignments(["gpu_sandbox_provider.engine=docker"]))


@pytest.mark.docker
def test_a_gpu_task_on_an_engine_without_a_gpu_runtime_is_refused_naming_both(
    pytester: pytest.Pytester, harbor_dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    if GPU_RUNTIME in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("this engine has a GPU runtime")
    harbor_dataset.task("trains", toml=GPU_TOML)
    harbor_dataset.task("plain")
    result = run_harbor(pytester, harbor_dataset, "--harbor-skip-unloadable")
    result.assert_outcomes(passed=1)
    skipped = json.loads(
        (harbor_dataset.results_folder(pytester.path / "out") / "skipped.json").read_text()
    )
    (reason,) = skipped.values()
    assert list(skipped) == ["trains"]
    assert "task.toml: environment.gpus: asks for 1 GPU(s): the Docker engine at" in reason
    assert "has no GPU runtime" in reason
    # Without --harbor-skip-unloadable it is a collection error, the message the same.
    result = run_harbor(pytester, harbor_dataset)
    result.stdout.fnmatch_lines(["*environment.gpus: asks for 1 GPU(s): the Docker engine at*"])


#: A provider that says it has GPUs (it starts plain containers, noting what each asked
#: for): GPU tasks go to it through gpu_sandbox_provider, the others stay on docker.
STAND_IN = textwrap.dedent(
    """
    import json, os
    from dataclasses import replace

    from pytest_harbor.sandboxes.base import SandboxCapabilities
    from pytest_harbor.sandboxes.docker import DockerProvider


    class StandIn(DockerProvider):
        name = "gpu-stand-in"
        capabilities = SandboxCapabilities(user_groups=True, compose=True, gpus=True)

        def gpu_problem(self):
            return None

        def start(self, spec):
            with open(os.environ["GPU_LOG"], "a") as log:
                log.write(json.dumps({"image": spec.image, "gpus": spec.gpus}) + "\\n")
            return super().start(replace(spec, gpus=None))


    def pytest_harbor_sandbox_providers():
        return {"gpu-stand-in": lambda options, context: StandIn()}
    """
)


@pytest.mark.docker
def test_gpu_tasks_run_on_the_gpu_sandbox_provider_and_the_rest_on_the_runs(
    pytester: pytest.Pytester, harbor_dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = pytester.path / "gpu.jsonl"
    monkeypatch.setenv("GPU_LOG", str(log))
    pytester.makeconftest(STAND_IN)
    harbor_dataset.task("trains", toml=GPU_TOML)
    harbor_dataset.task("plain")
    result = run_harbor(
        pytester, harbor_dataset, "--harbor-set=gpu_sandbox_provider.sandbox=gpu-stand-in"
    )
    result.assert_outcomes(passed=2)
    (started,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert started == {"image": BASE_IMAGE, "gpus": 1}
    # request_gpu_type on a provider that cannot choose a type: refused by name.
    result = run_harbor(
        pytester,
        harbor_dataset,
        "--harbor-set=gpu_sandbox_provider.sandbox=gpu-stand-in",
        "--harbor-set=request_gpu_type=true",
        "--harbor-skip-unloadable",
    )
    result.assert_outcomes(passed=1)
    skipped = json.loads(
        (harbor_dataset.results_folder(pytester.path / "out") / "skipped.json").read_text()
    )
    assert (
        "request_gpu_type asks the gpu-stand-in sandbox for the GPU type 'H100'"
        in (skipped["trains"])
    )


def _engine_has_gpus() -> bool:
    try:
        return GPU_RUNTIME in (docker.from_env().info().get("Runtimes") or {})
    except docker.errors.DockerException:
        return False


@pytest.mark.docker
@pytest.mark.skipif(not _engine_has_gpus(), reason="the engine has no GPU runtime")
def test_a_gpu_task_sees_its_gpu(pytester: pytest.Pytester, harbor_dataset: Dataset) -> None:
    harbor_dataset.task(
        "nvidia-smi",
        toml=GPU_TOML.replace('gpu_types = ["H100", "A100"]\n', ""),
        test_sh="nvidia-smi -L && echo 1 > /logs/verifier/reward.txt\n",
    )
    result = run_harbor(pytester, harbor_dataset)
    result.assert_outcomes(passed=1)


def test_the_docker_provider_says_it_can_give_gpus() -> None:
    assert DockerProvider.capabilities.gpus and not DockerProvider.capabilities.gpu_types
