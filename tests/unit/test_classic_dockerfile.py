"""A Dockerfile BuildKit reads, in the classic builder's words: a COPY or ADD of several
sources gets a folder as its destination, and nothing else of the file changes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_harbor.sandboxes.docker.dockerfiles import classic_dockerfile, only_buildkit_reads


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("COPY server.py persona.md .", "COPY server.py persona.md ./"),
        ("ADD a b /opt/x", "ADD a b /opt/x/"),
        ("copy a b c /dest", "copy a b c /dest/"),
        (
            "COPY --chown=1000:1000 --from=build a b /app",
            "COPY --chown=1000:1000 --from=build a b /app/",
        ),
        ("COPY\ta\tb\t/tabs   ", "COPY\ta\tb\t/tabs/"),
        ('COPY ["a b", "c", "/with space"]', 'COPY ["a b", "c", "/with space/"]'),
        ('COPY --chown=1 ["a", "c", "."]', 'COPY --chown=1 ["a", "c", "./"]'),
        ("COPY a b $DEST", "COPY a b $DEST/"),
    ],
)
def test_several_sources_copy_into_a_folder(before: str, after: str) -> None:
    assert (
        classic_dockerfile(f"FROM base\n{before}\nRUN true\n") == f"FROM base\n{after}\nRUN true\n"
    )


@pytest.mark.parametrize(
    "instruction",
    [
        "COPY a /dest",  # one source: the destination may be a file
        "COPY a b /dest/",  # already a folder
        'COPY ["a", "b", "/dest/"]',
        'COPY ["a", "/dest"]',
        "COPY *.py /dest",  # a wildcard: the classic builder decides by what it matches
        "COPY <<EOF /dest",  # a heredoc: only BuildKit reads it at all
        "RUN cp a b /dest",
        "ENV COPY a b c",
        "COPY",
        "COPY [not json a b",
    ],
)
def test_everything_else_is_left_as_it_is(instruction: str) -> None:
    assert classic_dockerfile(f"FROM base\n{instruction}\n") is None


def test_an_instruction_over_several_lines_keeps_its_line_numbers() -> None:
    text = (
        "FROM base\n"
        "COPY a \\\n"
        "# a comment inside the instruction\n"
        "\n"
        "     b \\\n"
        "     /dest\n"
        "RUN echo done\n"
    )
    assert classic_dockerfile(text) == (
        "FROM base\nCOPY a      b      /dest/\n\n\n\n\nRUN echo done\n"
    )


def test_the_escape_directive_names_the_continuation_mark() -> None:
    text = "# escape=`\nFROM base\nCOPY a `\n  b C:\\dest\n"
    assert classic_dockerfile(text) == "# escape=`\nFROM base\nCOPY a   b C:\\dest/\n\n"
    # The backslash is then an ordinary character.
    assert classic_dockerfile("# escape=`\nFROM base\nCOPY a b c\\\nRUN x\n") == (
        "# escape=`\nFROM base\nCOPY a b c\\/\nRUN x\n"
    )


def test_a_comment_or_a_run_script_that_looks_like_a_copy_is_left_alone() -> None:
    text = "FROM base\n# COPY a b c\nRUN echo \\\n  COPY a b c\n"
    assert classic_dockerfile(text) is None


@given(
    st.lists(
        st.sampled_from(
            ["FROM base", "COPY a b c", "COPY a /d", "RUN x \\", "  y", "# note", "", "ADD a b c/"]
        ),
        max_size=12,
    )
)
def test_the_rewrite_keeps_the_number_of_lines(lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    rewritten = classic_dockerfile(text)
    if rewritten is not None:
        assert rewritten.count("\n") == text.count("\n")
        assert classic_dockerfile(rewritten) is None  # once is enough


@pytest.mark.parametrize(
    ("error", "only_buildkit"),
    [
        (
            "the --chmod option requires BuildKit. Refer to https://docs.docker.com/go/buildkit/",
            True,
        ),
        ("dockerfile parse error line 3: unknown instruction: ECHO", True),
        ("Dockerfile parse error line 2: Unknown flag: link", True),
        (
            "When using COPY with more than one source file, the destination must be a "
            "directory and end with a /",
            True,
        ),
        ("The command '/bin/sh -c false' returned a non-zero code: 1", False),
        ("COPY failed: file not found in build context", False),
        ("pull access denied for nothing, repository does not exist", False),
    ],
)
def test_a_refusal_of_the_form_is_told_from_a_step_that_failed(
    error: str, only_buildkit: bool
) -> None:
    assert only_buildkit_reads(error) is only_buildkit
