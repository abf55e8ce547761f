"""The README's promises: two commands first, the test command is what CI runs."""

from __future__ import annotations

import re

from tests.fixtures import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def commands() -> list[str]:
    return re.findall(r"^    (\.ci/setup(?: --tests)? && .+)$", README, re.MULTILINE)


def test_readme_opens_with_the_main_job_and_the_test_command() -> None:
    main_job, test_suite = commands()[:2]
    assert main_job == (
        ".ci/setup && .venv/bin/pytest --harbor-dataset=example_datasets/quickstart -n 2"
    )
    assert test_suite.startswith(".ci/setup --tests && .venv/bin/pytest")
    assert README.index(main_job) < README.index("## ")


def test_ci_runs_the_readme_test_command() -> None:
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert commands()[1] in ci.splitlines()
