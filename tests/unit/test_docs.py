"""The documentation holds together: links and anchors resolve, every page is reachable
from the README, the options it names are the plugin's, and every console block is one the
suite can run (tests/integration/test_doc_commands.py runs them)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_examples import (
    Block,
    Step,
    anchors,
    console_blocks,
    links,
    matches,
    pages,
    parse_console_blocks,
    problems,
    stray_prompts,
)
from tests.fixtures import REPO_ROOT

# Pages and options documented here and made on other branches; checked as missing only
# while they are: once merged, drop them from these sets.
PENDING_PAGES: set[str] = set()
PENDING_OPTIONS: set[str] = set()

README = REPO_ROOT / "README.md"
OPTIONS_PAGE = REPO_ROOT / "docs" / "options.md"


def _relative(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def _pending(target: Path) -> bool:
    return not target.exists() and _relative(target) in PENDING_PAGES


@pytest.mark.parametrize("page", pages(), ids=_relative)
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for link in links(page.read_text()):
        if re.match(r"[a-z]+:", link):
            continue  # https:, mailto:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if _pending(target):
            continue
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target.read_text()):
            broken.append(f"{link}: no heading makes #{anchor}")
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {
        _relative((README.parent / link.partition("#")[0]).resolve())
        for link in links(README.read_text())
        if not re.match(r"[a-z]+:", link)
    }
    docs = {_relative(path) for path in (REPO_ROOT / "docs").glob("*.md")} | PENDING_PAGES
    assert docs - linked == set()


def test_the_readme_stays_short() -> None:
    assert len(README.read_text()) < 8000


@pytest.fixture(scope="module")
def plugin_options() -> set[str]:
    """The `--harbor-*` options the plugin registers, as `pytest --help` shows them."""
    shown = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(re.findall(r"^\s+(--harbor-[a-z-]+)", shown, re.MULTILINE))


def test_every_option_the_docs_name_exists(plugin_options: set[str]) -> None:
    named = {
        option
        for page in pages()
        for option in re.findall(r"--harbor-[a-z]+(?:-[a-z]+)*", page.read_text())
    }
    assert named - plugin_options - PENDING_OPTIONS == set()


def test_every_option_is_in_the_options_table_with_its_ini_key(
    plugin_options: set[str],
) -> None:
    table = {}
    for line in OPTIONS_PAGE.read_text().splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 4 and cells[0].startswith("`--harbor-"):
            table[cells[0].strip("`").split()[0].split("`")[0]] = cells[1].strip("`")
    assert plugin_options | PENDING_OPTIONS <= set(table)
    for option, ini in table.items():
        assert ini == "harbor_" + option.removeprefix("--harbor-").replace("-", "_")


# ------------------------------------------------------------------------ runnable examples


@pytest.mark.parametrize("page", pages(), ids=_relative)
def test_every_console_block_can_be_run(page: Path) -> None:
    assert {block.id: problems(block) for block in console_blocks(page)} == {
        block.id: [] for block in console_blocks(page)
    }


@pytest.mark.parametrize("page", pages(), ids=_relative)
def test_prompts_appear_only_in_console_blocks(page: Path) -> None:
    assert stray_prompts(page) == []


def test_the_docs_have_runnable_examples() -> None:
    assert sum(len(console_blocks(page)) for page in pages()) >= 10
    assert console_blocks(README)


def _block(text: str) -> Block:
    (block,) = parse_console_blocks(text, "docs/probe.md")
    return block


def test_a_block_is_read_as_commands_and_their_output() -> None:
    block = _block(
        "Text.\n\n  ```console\n  $ pytest --harbor-dataset=x \\\n      -k hello\n"
        "  ...\n  quickstart: 1 episodes\n  $ echo $?\n  1\n  ```\n",
    )
    assert block.steps == [
        Step("pytest --harbor-dataset=x -k hello", ["...", "quickstart: 1 episodes"]),
        Step("echo $?", ["1"]),
    ]
    assert block.line == 3
    assert problems(block) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("$ vllm serve Qwen/Qwen2.5-7B-Instruct\n", "not runnable here (vllm"),
        ("$ pip install 'pytest-harbor[agents]'\n", "not runnable here (pip"),
        ("$ pytest --harbor-model-url=https://api.openai.com/v1\n", "not a local endpoint"),
        ("$ echo $?\n0\n", "must follow"),
        ("$ pytest -q\n$ echo $?\nfailed\n", "the status, a number"),
        ("output\n$ pytest -q\n", "output before the first command"),
        ("nothing to run\n", "output before the first command"),
    ],
)
def test_a_block_that_cannot_run_is_refused(text: str, problem: str) -> None:
    found = problems(_block(f"```console\n{text}```\n"))
    assert any(problem in line for line in found), found


def test_a_prompt_outside_a_console_block_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```sh\n$ pytest\n```\n\n    $ vllm serve x\n\n```console\n$ pytest\n```\n")
    assert stray_prompts(page) == [2, 5]


@pytest.mark.parametrize(
    ("pattern", "line", "found"),
    [
        ("quickstart/hello-world . [100%]", "quickstart/hello-world .      [100%]", True),
        ("= 3 passed in * =", "===== 3 passed in 1.40s =====", False),
        ("=* 3 passed in * =*", "===== 3 passed in 1.40s =====", True),
        ("rows: */results/x.jsonl", "  rows: /tmp/a/results/x.jsonl", True),
        ("reward 0", "reward 0.5", False),
    ],
)
def test_expected_lines_match_with_wildcards_and_loose_spaces(
    pattern: str, line: str, found: bool
) -> None:
    assert matches(pattern, line) is found


def test_anchors_follow_githubs_rules() -> None:
    text = "# Decisions and limits\n## dataset.toml\n## Crashes, interrupts and leaks\n## A\n## A\n"
    assert anchors(text) == {
        "decisions-and-limits",
        "datasettoml",
        "crashes-interrupts-and-leaks",
        "a",
        "a-1",
    }
