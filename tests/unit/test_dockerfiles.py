"""What a task's Dockerfile may ask of the builder: a list of what is allowed, each refusal
naming its line; what the engine would fetch itself (an `ADD` of a URL, an image from a
registry of this machine or a private network) refused too; anything else in a
Dockerfile is the builder's to judge."""

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
        # What the context holds, and images the engine pulls from public registries.
        "FROM debian\nADD ./local /x\n",
        "FROM debian\nADD archive.tar.gz /\n",
        'FROM debian\nADD --chown=1:1 ["a b.txt", "/dst/"]\n',
        "FROM debian\nADD $FILE /x\n",
        "FROM debian\nCOPY http.txt /x\n",
        "FROM debian:bookworm-slim\n",
        "FROM docker.io/library/debian\n",
        "FROM ghcr.io/a/b:1\n",
        "FROM 8.8.8.8:5000/x\n",
        "FROM [2001:4860:4860::8888]:5000/x\n",
        "FROM --platform=linux/amd64 debian AS builder\nFROM scratch\nCOPY --from=builder /a /b\n",
        "FROM debian\nCOPY --from=0 /a /b\n",
        "FROM debian\nRUN --mount=type=bind,from=ghcr.io/a/b,target=/m true\n",
        "FROM ${BASE}\n",
        "ARG BASE=debian:bookworm-slim\nFROM ${BASE}\n",
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
        ("FROM debian\nRUN\t--network=host true\n", "line 2: RUN --network=host"),
    ],
)
def test_what_reaches_beyond_the_build_is_refused_by_line(text: str, words: str) -> None:
    problem = check_dockerfile_text(text)
    assert problem is not None and words in problem, problem


#: What the engine would fetch itself, over this machine's own network.
REMOTE_ADD = [
    ("ADD http://127.0.0.1:1/x /x", "ADD http://127.0.0.1:1/x"),
    ("ADD HTTPS://example.com/a.tgz /", "ADD HTTPS://example.com/a.tgz"),
    ("add ftp://10.0.0.1/f /f", "ADD ftp://10.0.0.1/f"),
    ("ADD git://example.com/r.git /src", "ADD git://example.com/r.git"),
    ("ADD ssh://git@example.com/r.git /src", "ADD ssh://git@example.com/r.git"),
    ("ADD git@github.com:owner/repo.git#main /src", "ADD git@github.com:owner/repo.git"),
    ("ADD ./here http://169.254.169.254/latest/meta-data/ /x", "ADD http://169.254.169.254"),
    ('ADD ["http://127.0.0.1:1/x", "/dst"]', "ADD http://127.0.0.1:1/x"),
    (
        "ADD --checksum=sha256:00 --chown=1:1 --chmod=644 http://127.0.0.1:1/x /x",
        "ADD http://127.0.0.1:1/x",
    ),
    ("ADD --keep-git-dir=true https://example.com/r.git /src", "ADD https://example.com/r.git"),
    ('ADD --link ["https://example.com/f", "/f"]', "ADD https://example.com/f"),
    ("ONBUILD ADD http://127.0.0.1:1/x /x", "ADD http://127.0.0.1:1/x"),
    ("ADD\thttp://127.0.0.1:1/x /x", "ADD http://127.0.0.1:1/x"),
    ('ADD "http://127.0.0.1:1/x" /x', 'ADD "http://127.0.0.1:1/x"'),
    ("ARG SOURCE=http://127.0.0.1:1/x\nADD ${SOURCE} /x", "ADD ${SOURCE}"),
    ("ADD ${SOURCE:-http://127.0.0.1:1/x} /x", "ADD ${SOURCE:-http"),
]


@pytest.mark.parametrize(("line", "words"), REMOTE_ADD)
def test_an_add_the_engine_would_fetch_is_refused_by_line(line: str, words: str) -> None:
    problem = check_dockerfile_text(f"FROM debian\n{line}\n")
    number = 2 + line.count("\n")  # the ADD is the last line
    assert problem is not None and problem.startswith(f"line {number}: {words}"), problem
    assert "this machine's own network" in problem and "allow_remote_add" in problem


@pytest.mark.parametrize(("line", "words"), REMOTE_ADD)
def test_allow_remote_add_lets_the_engine_fetch_it(line: str, words: str) -> None:
    assert check_dockerfile_text(f"FROM debian\n{line}\n", allow_remote_add=True) is None


def test_an_add_whose_variables_cannot_be_read_is_refused() -> None:
    problem = check_dockerfile_text("FROM debian\nARG S=http://x/y\nADD ${S%/y} /x\n")
    assert problem is not None and problem.startswith("line 3: ADD ${S%/y}: its variables")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("FROM 127.0.0.1:5000/private\n", "line 1: FROM 127.0.0.1:5000/private names the "),
        ("FROM localhost:5000/x\n", "registry localhost:5000, a name of this machine"),
        ("FROM LOCALHOST/x\n", "registry LOCALHOST, a name of this machine"),
        ("FROM localhost/x\n", "registry localhost, a name of this machine"),
        ("FROM registry.localhost/x\n", "a name of this machine"),
        ("FROM --platform=linux/amd64 127.0.0.1:5000/x AS base\n", "FROM 127.0.0.1:5000/x"),
        ("FROM [::1]:5000/x\n", "registry [::1]:5000, a loopback address"),
        ("FROM 127.1:5000/x\n", "a loopback address"),
        ("FROM 0x7f000001:5000/x\n", "a loopback address"),
        ("FROM 0177.0.0.1/x\n", "a loopback address"),
        ("FROM [::ffff:127.0.0.1]/x\n", "a loopback address"),
        ("FROM 0.0.0.0:5000/x\n", "the unspecified address"),
        ("FROM 10.0.0.5:5000/x\n", "a private-network address"),
        ("FROM 172.16.0.1/x\n", "a private-network address"),
        ("FROM 192.168.1.4:5000/x\n", "a private-network address"),
        ("FROM 100.64.0.1/x\n", "not a public address"),
        ("FROM 169.254.169.254/x\n", "a link-local address"),
        ("FROM [fe80::1]:5000/x\n", "a link-local address"),
        ("FROM [fd00::1]/x\n", "a private-network address"),
        ("FROM 224.0.0.1/x\n", "a multicast address"),
        ("FROM 240.0.0.1/x\n", "address"),
        (
            "FROM debian\nCOPY --from=10.0.0.5:5000/img /a /b\n",
            "line 2: COPY --from=10.0.0.5:5000/img names the registry",
        ),
        (
            "FROM debian\nONBUILD COPY --from=localhost:5000/img /a /b\n",
            "line 2: COPY --from=localhost:5000/img",
        ),
        (
            "FROM debian\nRUN --mount=type=bind,from=[::1]:5000/img,target=/m true\n",
            "line 2: RUN --mount=...,from=[::1]:5000/img names the registry [::1]:5000",
        ),
        (
            "ARG BASE=127.0.0.1:5000/x\nFROM ${BASE}\n",
            "line 2: FROM ${BASE} (as 127.0.0.1:5000/x) names the registry 127.0.0.1:5000",
        ),
        ("FROM ${BASE:-localhost:5000/x}\n", "(as localhost:5000/x)"),
        ("ARG H=127.0.0.1\nFROM ${H%.1}:5000/x\n", "line 2: FROM ${H%.1}:5000/x: its variables"),
    ],
)
def test_an_image_from_this_machine_or_a_private_network_is_refused(text: str, words: str) -> None:
    problem = check_dockerfile_text(text)
    assert problem is not None and words in problem, problem
    assert problem.startswith("line ")


def test_the_build_arguments_are_read_into_its_variables() -> None:
    text = "FROM ${BASE}\n"
    problem = check_dockerfile_text(text, args={"BASE": "192.168.1.4:5000/x"})
    assert problem is not None and "(as 192.168.1.4:5000/x)" in problem
    assert check_dockerfile_text(text, args={"BASE": "debian"}) is None


def test_allow_remote_add_leaves_the_registry_check() -> None:
    problem = check_dockerfile_text("FROM localhost:5000/x\n", allow_remote_add=True)
    assert problem is not None and "a name of this machine" in problem


def test_the_error_names_the_file(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM debian\nRUN --mount=type=cache,target=/c true\n")
    with pytest.raises(TaskLoadError) as caught:
        check_dockerfile(dockerfile)
    assert caught.value.path == dockerfile and "line 2" in caught.value.message


def test_the_remote_add_error_names_the_file_and_line(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM debian\nADD http://127.0.0.1:1/x /x\n")
    with pytest.raises(TaskLoadError) as caught:
        check_dockerfile(dockerfile)
    assert caught.value.path == dockerfile
    assert caught.value.message.startswith("line 2: ADD http://127.0.0.1:1/x")
    check_dockerfile(dockerfile, allow_remote_add=True)


@given(st.text(max_size=300))
def test_any_text_is_checked_without_raising(text: str) -> None:
    problem = check_dockerfile_text(text)
    assert problem is None or problem.startswith("line ")


#: Pieces of Dockerfiles, so that random text reaches every reader.
_PIECES = st.sampled_from(
    [
        "FROM ", "ADD ", "COPY ", "RUN ", "ONBUILD ", "ARG ", "ENV ", "--from=", "--mount=",
        "type=bind,from=", "--platform=x ", "--chown=1 ", " AS b", "[", "]", '"', "'", "\\",
        "`", "\n", "\t", " ", "/", ":", ".", "@", "=", ",", "http://", "git@h:", "localhost",
        "127.0.0.1", "0x7f.1", "[::1]", "[fe80::1%eth0]", "$", "${", "}", ":-", ":+", "?",
        "%", "A", "B", "A=", "B=$A$A", "# escape=`\n", "\\\n",
    ]
)  # fmt: skip


@given(st.lists(st.one_of(_PIECES, st.text(max_size=4)), max_size=60).map("".join))
def test_any_dockerfile_like_text_is_checked_without_raising(text: str) -> None:
    for allow in (False, True):
        problem = check_dockerfile_text(text, allow_remote_add=allow, args={"A": "$B", "B": "x"})
        assert problem is None or problem.startswith("line ")


@pytest.mark.parametrize(
    "label",
    [
        'LABEL pytest-harbor.cache="tools"',
        "LABEL note=x pytest-harbor.owner=someone",
        "LABEL PYTEST-HARBOR.run=x",
        'LABEL "pytest-harbor.trial"=x',
        "LABEL com.docker.compose.project=other",
        "ARG KEY=pytest-harbor.cache\nLABEL ${KEY}=tools",
        "LABEL pytest-harbor.cache tools",
    ],
)
def test_a_label_of_the_engines_own_is_refused(label: str) -> None:
    problem = check_dockerfile_text(f"FROM debian:bookworm-slim\n{label}\n")
    assert problem is not None and "a label of pytest-harbor's or Compose's own" in problem


def test_ordinary_labels_pass() -> None:
    text = (
        "FROM debian:bookworm-slim\n"
        'LABEL org.opencontainers.image.title="pytest-harbor.cache" maintainer=me\n'
        "LABEL com.docker.desktop.extension.api.version=1\n"
    )
    assert check_dockerfile_text(text) is None
