"""Attacks on the Dockerfile check (tasks/dockerfiles.py) and on the copy of a Dockerfile
the classic builder is given (sandboxes/docker/dockerfiles.py): each is a hostile task's
Dockerfile that Docker reads one way and pytest-harbor another. A test passes when the
two agree."""

from __future__ import annotations

import pytest

from pytest_harbor.sandboxes.docker.dockerfiles import classic_dockerfile, only_buildkit_reads
from pytest_harbor.tasks.dockerfiles import check_dockerfile_text

BASE = "FROM debian:bookworm-slim\n"

#: What the check must refuse, each written plainly: Docker reads it so.
REFUSED = {
    "add-url": BASE + "ADD http://127.0.0.1:8080/secret /secret\n",
    "from-local": "FROM 127.0.0.1:5000/stolen\n",
    "copy-from-local": BASE + "COPY --from=localhost:5000/stolen / /\n",
    "cache-mount": BASE + "RUN --mount=type=cache,target=/c true\n",
    "mount-from-local": BASE + "RUN --mount=type=bind,from=127.0.0.1:5000/x,target=/x true\n",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_is_written_plainly_is_refused(name: str) -> None:
    assert check_dockerfile_text(REFUSED[name]) is not None


def _hidden_by_an_empty_line(text: str) -> str:
    """`text` with its last instruction's keyword, a continuation and an empty line before
    its arguments: Docker joins them (with a warning), and reads the same instruction."""
    *head, last = text.rstrip("\n").split("\n")
    keyword, rest = last.split(" ", 1)
    return "\n".join([*head, f"{keyword} \\", "", rest]) + "\n"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_empty_line_inside_a_continuation_hides_nothing(name: str) -> None:
    assert check_dockerfile_text(_hidden_by_an_empty_line(REFUSED[name])) is not None


#: Characters Python's str.splitlines() breaks a line at, which Docker's parser (lines end
#: at "\n" only) reads as white space between an instruction's words.
DOCKER_WHITE_SPACE = {"cr": "\r", "form-feed": "\f", "vertical-tab": "\v"}


@pytest.mark.parametrize("space", sorted(DOCKER_WHITE_SPACE))
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_character_docker_reads_as_white_space_hides_nothing(name: str, space: str) -> None:
    *head, last = REFUSED[name].rstrip("\n").split("\n")
    keyword, rest = last.split(" ", 1)
    text = "\n".join([*head, keyword + DOCKER_WHITE_SPACE[space] + rest]) + "\n"
    assert check_dockerfile_text(text) is not None


@pytest.mark.parametrize(
    "text",
    [
        # Flags spelled in other cases: refused as unknown flags.
        BASE + "RUN --NETWORK=host true\n",
        BASE + "RUN --Mount=type=cache,target=/c true\n",
        BASE + "RUN --mount=TYPE=CACHE,target=/c true\n",
        # The mount type given twice: BuildKit keeps the last, and so does the check.
        BASE + "RUN --mount=type=bind,type=cache,target=/c true\n",
        BASE + 'RUN --mount="type=cache,target=/c" true\n',
        BASE + "RUN --network=host true\n",
        BASE + "RUN --security=insecure true\n",
        BASE + "RUN --mount=type=secret,id=x true\n",
        BASE + "RUN --mount=type=ssh true\n",
        # An instruction run by a later build.
        BASE + "ONBUILD RUN --mount=type=cache,target=/c true\n",
        BASE + "onbuild add http://127.0.0.1/x /x\n",
        # A continuation across a comment line.
        BASE + "ADD \\\n# a comment\nhttp://127.0.0.1/x /x\n",
        # The escape directive after `syntax` (Docker reads both), and a backslash then no
        # longer continuing the line.
        "# syntax=docker/dockerfile:1\n# escape=`\n"
        + BASE
        + "RUN echo \\\nADD http://127.0.0.1/x /x\n",
        "# escape=`\n" + BASE + "ADD `\nhttp://127.0.0.1/x /x\n",
        # Another frontend, in the directive's other spellings.
        "# syntax = evil/frontend\n" + BASE,
        "#SYNTAX=evil/frontend\n" + BASE,
        "# syntax=docker.io/docker/dockerfile:1@evil\n" + BASE,
        # A variable naming a URL.
        BASE + "ARG U=http://127.0.0.1/x\nADD $U /x\n",
        BASE + "ADD ${U:-http://169.254.169.254/latest/meta-data/} /x\n",
        BASE + 'ADD ["http://127.0.0.1/x", "/x"]\n',
        BASE + "ADD --chmod=644 git@127.0.0.1:repo /x\n",
    ],
)
def test_the_check_reads_these_as_docker_does(text: str) -> None:
    assert check_dockerfile_text(text) is not None


# ------------------------------------------------------------ the classic builder's copy


@pytest.mark.parametrize(
    "text",
    [
        BASE + "COPY a b c\n",
        BASE + "COPY --chown=1:1 a b \\\n  c\n",
        BASE + 'COPY ["a", "b", "c"]\n',
        "# escape=`\n" + BASE + "COPY a b `\n  c\n",
    ],
)
def test_the_copy_adds_the_slash_and_nothing_else(text: str) -> None:
    rewritten = classic_dockerfile(text)
    assert rewritten is not None
    escape = "`" if "escape=`" in text else "\\"

    def words(dockerfile: str) -> list[str]:
        return dockerfile.replace(escape + "\n", " ").split()

    assert "c/" in rewritten
    assert words(rewritten.replace("c/", "c")) == words(text)


@pytest.mark.parametrize(
    "text",
    [
        # A heredoc's body is not an instruction to BuildKit; the classic builder refuses
        # the file, and BuildKit is given the task's own.
        BASE + "RUN <<EOF\nCOPY a b c\nEOF\n",
        # Nothing to add: a destination with its slash, one source, a URL (refused earlier).
        BASE + "COPY a b c/\n",
        BASE + "COPY a c\n",
        # A line the rewrite cannot read as a list.
        BASE + 'COPY ["a", "b", c]\n',
    ],
)
def test_the_copy_touches_no_other_instruction(text: str) -> None:
    rewritten = classic_dockerfile(text)
    if rewritten is not None:
        # Only a COPY line may change, and only by its trailing slash.
        for before, after in zip(text.splitlines(), rewritten.splitlines(), strict=True):
            assert before == after or (after == before + "/" and before.startswith("COPY"))


def test_the_copy_makes_no_new_instruction() -> None:
    text = BASE + "COPY a b c\fRUN echo injected > /injected\n"
    rewritten = classic_dockerfile(text)
    assert rewritten is None or rewritten.count("\n") == text.count("\n")


@pytest.mark.parametrize(
    "error",
    [
        "The command '/bin/sh -c sleep 5; exit 1 # requires BuildKit' returned a non-zero code: 1",
        "The command '/bin/sh -c echo dockerfile parse error; false' returned a non-zero code: 1",
    ],
)
def test_a_step_that_ran_and_failed_is_not_a_refusal_of_the_form(error: str) -> None:
    assert not only_buildkit_reads(error)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_byte_order_mark_hides_nothing(name: str) -> None:
    *head, last = REFUSED[name].rstrip("\n").split("\n")
    text = "\n".join(["\ufeff# escape=`", *head, "RUN echo \\", last]) + "\n"
    if name == "from-local":
        text = "\n".join(["\ufeff# escape=`", BASE.strip(), "RUN echo \\", last]) + "\n"
    assert check_dockerfile_text(text) is not None
