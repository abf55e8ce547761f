"""Real datasets at their critical path: trials go out longest first under xdist, what a run
took is recorded for the next, and a build that fails is tried once in a run."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import docker
import pytest

from pytest_harbor.sandboxes import ImageSource, SandboxStartError
from pytest_harbor.sandboxes.docker import DockerProvider
from pytest_harbor.sandboxes.docker.images import EngineImages
from pytest_harbor.sandboxes.images import image_tag_for
from tests.fixtures import BASE_IMAGE, Dataset, run_harbor

pytestmark = pytest.mark.docker


@pytest.fixture
def dataset(harbor_dataset: Dataset) -> Dataset:
    return harbor_dataset


def sleeping(seconds: float) -> str:
    return f"sleep {seconds}; echo 1 > /tmp/answer\n"


def test_the_longest_trial_goes_out_first_and_the_run_is_recorded(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    """`z-long` comes last in collection order; the record of an earlier run says it is the
    longest, so it starts among the first two of a -n 2 run."""
    for name in ("a-short", "b-short", "c-short"):
        dataset.task(name, solve_sh=sleeping(0.3))
    dataset.task("z-long", solve_sh=sleeping(3))
    folder = dataset.taskset_folder(pytester.path / "out")
    folder.mkdir(parents=True)
    record = {name: {"episode_s": 0.5} for name in ("a-short", "b-short", "c-short")}
    record["z-long"] = {"episode_s": 3.5}
    (folder / "durations.json").write_text(json.dumps({"tasks": record}))
    run_harbor(pytester, dataset, "-n", "2").assert_outcomes(passed=4)
    rows = dataset.rows(pytester.path / "out")
    starts = sorted(rows, key=lambda row: str(row["started_at"]))
    assert "z-long" in [row["task_id"] for row in starts[:2]]
    recorded = json.loads((folder / "durations.json").read_text())["tasks"]
    assert recorded["z-long"]["episode_s"] >= 3.0
    assert recorded["a-short"]["episode_s"] < 3.0


def test_a_build_that_failed_is_not_tried_again_in_the_same_run(
    tmp_path: Path, docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN echo 'cannot fetch the package' >&2; exit 3\n"
    )
    provider = DockerProvider()
    builds: list[str] = []
    real = EngineImages._build

    def counted(self: EngineImages, source: ImageSource, tag: str) -> None:
        builds.append(tag)
        real(self, source, tag)

    monkeypatch.setattr(EngineImages, "_build", counted)

    def source(run: str) -> ImageSource:
        return ImageSource(
            docker_image=None,
            context_dir=context,
            build_timeout_sec=120,
            labels={"pytest-harbor.run": run},
        )

    messages = []
    for run in ("run-one", "run-one", "run-one", "run-two"):
        with pytest.raises(SandboxStartError) as failed:
            provider.prepare_image(source(run))
        messages.append(str(failed.value))
    assert len(builds) == 2, "once per run"
    assert messages[0] == messages[1] == messages[2]
    assert "cannot fetch the package" in messages[0]
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(image_tag_for(context))


@pytest.mark.parametrize("builder", ["buildkit", "classic"])
def test_either_builder_makes_a_tasks_image_and_the_run_says_which(
    pytester: pytest.Pytester,
    dataset: Dataset,
    built_images: list[Path],
    builder: str,
) -> None:
    task = dataset.task(
        "built",
        toml="[verifier]\ntimeout_sec = 60\n",
        dockerfile=f"FROM {BASE_IMAGE}\nRUN echo {builder}-{dataset.name} > /built-by\n",
        test_sh=(
            f"if grep -q {builder} /built-by; then echo 1; else echo 0; fi"
            " > /logs/verifier/reward.txt\n"
        ),
    )
    built_images.append(task / "environment")
    result = run_harbor(
        pytester, dataset, f"--harbor-set=sandbox_provider_options.builder={builder}"
    )
    result.assert_outcomes(passed=1)
    name = {"buildkit": "BuildKit (docker buildx)", "classic": "the classic builder"}[builder]
    result.stdout.fnmatch_lines([f"images made ahead for 1 task, built with {name}"])


#: A Dockerfile BuildKit (Harbor's builder, through Compose) builds and the classic builder
#: refuses as written: a COPY of two sources to a destination without a trailing `/`.
TWO_SOURCES = f"FROM {BASE_IMAGE}\nWORKDIR /app\nCOPY a.txt b.txt .\n"

#: A Dockerfile only BuildKit reads (a flag of its own), whose RUN step says what network
#: it had.
BUILDKIT_ONLY = (
    f"FROM {BASE_IMAGE}\nCOPY --chmod=0755 a.txt /copied\n"
    "RUN ls /sys/class/net | tr '\\n' ' ' > /networks\n"
)


def buildx_answers() -> bool:
    try:
        return subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode == 0
    except OSError:
        return False


def copying_task(dataset: Dataset, built_images: list[Path], dockerfile: str, test_sh: str) -> None:
    task = dataset.task(
        "copying",
        toml="[verifier]\ntimeout_sec = 60\n",
        # An image of its own: another test's build of the same file is no answer.
        dockerfile=f"{dockerfile}LABEL case={dataset.name}\n",
        extra_files={"environment/a.txt": "a\n", "environment/b.txt": "b\n"},
        test_sh=f"{test_sh} && echo 1 > /logs/verifier/reward.txt\n",
    )
    built_images.append(task / "environment")


def test_several_sources_copy_into_a_folder_under_the_classic_builder(
    pytester: pytest.Pytester, dataset: Dataset, built_images: list[Path]
) -> None:
    copying_task(
        dataset,
        built_images,
        TWO_SOURCES,
        'test "$(cat /app/a.txt /app/b.txt)" = "$(printf "a\\nb")"',
    )
    result = run_harbor(pytester, dataset, "--harbor-set=sandbox_provider_options.builder=classic")
    result.assert_outcomes(passed=1)


def test_a_dockerfile_the_classic_builder_cannot_read_says_how_to_build_with_buildkit(
    pytester: pytest.Pytester, dataset: Dataset, built_images: list[Path]
) -> None:
    copying_task(dataset, built_images, BUILDKIT_ONLY, "test -x /copied")
    result = run_harbor(pytester, dataset, "--harbor-set=sandbox_provider_options.builder=classic")
    result.assert_outcomes(errors=1)
    reason = str(dataset.failures(pytester.path / "out")[0]["failure_reason"])
    assert "the --chmod option requires BuildKit" in reason
    assert "built with the classic builder" in reason
    assert "--harbor-set sandbox_provider_options.builder=buildkit" in reason


@pytest.mark.skipif(not buildx_answers(), reason="docker buildx does not answer here")
@pytest.mark.parametrize("builder", ["auto", "buildkit"])
def test_a_dockerfile_only_buildkit_reads_builds_with_its_steps_offline(
    pytester: pytest.Pytester, dataset: Dataset, built_images: list[Path], builder: str
) -> None:
    """By default (`auto`) the classic builder's refusal hands the build to BuildKit, whose
    RUN steps have no network but the loopback, as with `builder = "buildkit"`."""
    copying_task(
        dataset, built_images, BUILDKIT_ONLY, 'test -x /copied && test "$(cat /networks)" = "lo "'
    )
    options = (
        [] if builder == "auto" else [f"--harbor-set=sandbox_provider_options.builder={builder}"]
    )
    result = run_harbor(pytester, dataset, *options)
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("quiet", [False, True])
def test_a_long_run_says_what_it_is_doing_unless_quiet(
    pytester: pytest.Pytester, dataset: Dataset, quiet: bool
) -> None:
    for name in ("first", "second", "third"):
        dataset.task(name)
    folder = dataset.taskset_folder(pytester.path / "out")
    folder.mkdir(parents=True)
    record = {name: {"episode_s": 2.0} for name in ("first", "second", "third")}
    (folder / "durations.json").write_text(json.dumps({"tasks": record}))
    result = run_harbor(pytester, dataset, "--harbor-status-every=0", *(["-q"] if quiet else []))
    result.assert_outcomes(passed=3)
    lines = [line for line in result.outlines if line.startswith("harbor: ")]
    if quiet:
        assert lines == []
    else:
        assert "harbor: 1/3 done, 0 running, 2 waiting, about 4 s left" in lines
        # Each on a line of its own, never after a test's progress mark.
        glued = [line for line in result.outlines if "harbor: " in line[1:]]
        assert glued == []


def test_even_quiet_the_terminal_names_what_it_left_out(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    dataset.task("fine")
    for name in ("bad-1", "bad-2", "bad-3", "bad-4"):
        folder = dataset.path / name
        folder.mkdir()
        (folder / "task.toml").write_text("not = [toml")
    result = run_harbor(pytester, dataset, "-q", "--harbor-skip-unloadable")
    result.assert_outcomes(passed=1)
    skipped = dataset.results_folder(pytester.path / "out").resolve() / "skipped.json"
    result.stdout.fnmatch_lines(
        [
            f"{dataset.name}: left out 4 task folders (refused, or could not load)",
            "  bad-1: *task.toml: not valid TOML*",
            "  bad-2: *",
            "  bad-3: *",
            "  ... and 1 more",
            f"  all of them: {skipped}",
        ]
    )


def test_a_warning_about_a_task_comes_once_whatever_the_workers(
    pytester: pytest.Pytester, dataset: Dataset
) -> None:
    task = dataset.task("odd")
    with (task / "task.toml").open("a") as toml:
        toml.write("\n[extra]\nfoo = 1\n")
    # (pytester's own run warns that the plugin was imported before it could rewrite it)
    result = run_harbor(
        pytester, dataset, "-n", "2", "-W", "ignore::pytest.PytestAssertRewriteWarning"
    )
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*task.toml: unknown key ignored: extra (line *)*"])


def test_a_taskset_is_planned_once_per_process(
    pytester: pytest.Pytester, dataset: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pre-flight and collection share one plan: the tasks are loaded once."""
    from pytest_harbor.plugin import run as run_module

    planned: list[Path] = []
    original = run_module.plan_taskset

    def counting(path: Path, **kwargs: object) -> object:
        planned.append(path)
        return original(path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(run_module, "plan_taskset", counting)
    for name in ("first", "second"):
        dataset.task(name)
    result = run_harbor(pytester, dataset)
    result.assert_outcomes(passed=2)
    assert planned == [dataset.path]


def test_each_episode_takes_the_sandbox_started_ahead_for_it(
    pytester: pytest.Pytester, dataset: Dataset, docker_client: docker.DockerClient
) -> None:
    """One worker, three episodes: each but the first finds its sandbox started while the
    one before it ran, and uses it. One sandbox made per episode, not one thrown away
    and made again at the seed."""
    for name in ("a", "b", "c"):
        dataset.task(name)
    since = int(time.time()) - 1
    result = run_harbor(pytester, dataset, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    events = docker_client.api.events(
        since=since,
        until=int(time.time()) + 1,
        filters={"type": "container", "event": "create"},
        decode=True,
    )
    made = [
        event
        for event in events
        if str(
            event.get("Actor", {}).get("Attributes", {}).get("pytest-harbor.task", "")
        ).startswith(f"{dataset.name}/")
    ]
    assert len(made) == 3, made
