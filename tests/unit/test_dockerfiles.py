"""What a task's Dockerfile may ask of the builder: a list of what is allowed, each refusal
naming its line; anything else in a Dockerfile is the builder's to judge."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_harbor.tasks.dockerfiles import check_dockerfile, check_dockerfile_text
from pytest_harbor.tasks.errors import TaskLoadError


@pytest.mark.parametrize(
    "text",
    [
        "FROM debian\nRUN apt-get update\n",
        "# syntax=docker/dockerfile:1.7\nFROM debian\n",
        "# syntax = docker.io/docker/dockerfile-upstream:master\nFROM debian\n",
        "FROM debian\nRUN --mount=type=bind,source=req.txt,target=/r pip install -r /r\n",
        "FROM debian\nRUN --mount=target=/data,from=builder cp -r /data /out\n",
        "FROM debian\nRUN --mount=type=tmpfs,target=/tmp --network=none make\n",
        "FROM debian\nRUN echo --mount=type=cache\n",
        'FROM debian\nRUN ["sh", "-c", "echo --network=host"]\n',
        "# escape=`\nFROM debian\nRUN echo a `\n  && echo b\n",
    ],
)
def test_what_a_task_may_ask_passes(text: str) -> None:
    assert check_dockerfile_text(text) is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            "FROM debian\nRUN --mount=type=cache,target=/root/.cache/pip pip install x\n",
            "line 2: RUN --mount=type=cache: a cache mount is shared by every build",
        ),
        ("FROM debian\nRUN --mount=type=secret,id=aws cat /run/secrets/aws\n", "no secrets"),
        ("FROM debian\nRUN --mount=target=/k,type=ssh ssh-add -l\n", "no SSH agent"),
        ("FROM debian\nRUN --network=host curl 127.0.0.1\n", "RUN --network=host: only"),
        ("FROM debian\nRUN --security=insecure mount\n", "runs the step privileged"),
        ("FROM debian\nRUN --device=/dev/kmsg cat\n", "RUN --device is not supported"),
        ("# syntax=attacker/frontend:1\nFROM debian\n", "line 1: # syntax=attacker/frontend"),
        (
            "FROM debian\nRUN echo a \\\n# a comment inside\n  && echo b\n"
            "ONBUILD RUN --mount=type=cache,target=/c true\n",
            "line 5: RUN --mount=type=cache",
        ),
        ("FROM debian\nrun \\\n  --mount=type=CACHE,target=/c true\n", "line 2: RUN --mount=type"),
    ],
)
def test_what_reaches_beyond_the_build_is_refused_by_line(text: str, words: str) -> None:
    problem = check_dockerfile_text(text)
    assert problem is not None and words in problem, problem


def test_the_error_names_the_file(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM debian\nRUN --mount=type=cache,target=/c true\n")
    with pytest.raises(TaskLoadError) as caught:
        check_dockerfile(dockerfile)
    assert caught.value.path == dockerfile and "line 2" in caught.value.message


@given(st.text(max_size=300))
def test_any_text_is_checked_without_raising(text: str) -> None:
    problem = check_dockerfile_text(text)
    assert problem is None or problem.startswith("line ")
