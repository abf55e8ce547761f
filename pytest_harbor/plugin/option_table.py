"""Every `--harbor-*` option: its flag, ini key, kind, default and help, in one table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pytest_harbor.datasets import DEFAULT_REGISTRY
from pytest_harbor.harnesses.model import DEFAULT_API_KEY_ENV

__all__ = ["OPTIONS", "Option"]


@dataclass(frozen=True)
class Option:
    name: str
    help: str
    kind: Literal["value", "list", "flag"]
    default: Any
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return f"--harbor-{self.name}"

    @property
    def dest(self) -> str:
        return f"harbor_{self.name.replace('-', '_')}"

    @property
    def ini_type(self) -> str:
        return {"value": "string", "list": "args", "flag": "bool"}[self.kind]


OPTIONS = {
    option.name: option
    for option in (
        Option(
            "dataset",
            "a task folder, a folder of task folders, harbor:NAME[@VERSION] (a dataset of "
            "the registry) or git+URL[@REF][#path=FOLDER] (repeatable)",
            "list",
            [],
            "PATH|REF",
        ),
        Option(
            "registry",
            "the registry harbor:NAME references are looked up in, a URL or a file in "
            f"Harbor's registry format (default: {DEFAULT_REGISTRY})",
            "value",
            DEFAULT_REGISTRY,
            "URL|PATH",
        ),
        Option(
            "cache-dir",
            "where datasets by reference are fetched to (default: "
            "$XDG_CACHE_HOME/pytest-harbor/datasets, else ~/.cache/pytest-harbor/datasets)",
            "value",
            None,
            "DIR",
        ),
        Option(
            "agent", "harness to run: oracle, nop or a registered one", "value", "oracle", "NAME"
        ),
        Option("sandbox", "sandbox provider", "value", "docker", "NAME"),
        Option("repeats", "trials per task (default: the dataset's, else 1)", "value", None, "N"),
        Option(
            "results-dir",
            "results go to DIR/harbor/[validation/]<taskset>/",
            "value",
            "results",
            "DIR",
        ),
        Option(
            "report",
            "the HTML report: a file PATH covering every taskset of the run, or none "
            "(default: report.html beside each taskset's run summary)",
            "value",
            None,
            "PATH|none",
        ),
        Option(
            "live-report",
            "rewrite the HTML report every SECONDS while the run goes, so that a browser "
            "shows its progress (the page refreshes itself until the run ends)",
            "value",
            None,
            "SECONDS",
        ),
        Option(
            "status-every",
            "where the output is no terminal (a CI log): a plain status line at most every "
            "SECONDS, as an episode ends (default 60; 0: after every one, none: never)",
            "value",
            "60",
            "SECONDS|none",
        ),
        Option(
            "pass-reward",
            "reward an agent run needs to pass (the oracle needs 1)",
            "value",
            "1.0",
            "R",
        ),
        Option(
            "only-tasks",
            "run only these tasks: names or globs, comma-separated",
            "list",
            [],
            "NAMES",
        ),
        Option(
            "exclude-tasks",
            "leave out these tasks: names or globs, comma-separated",
            "list",
            [],
            "NAMES",
        ),
        Option(
            "skip-unloadable",
            "leave out tasks that do not load or build (listed in skipped.json)",
            "flag",
            False,
        ),
        Option(
            "resume",
            "continue the newest run in the results folder that matches this one: keep its "
            "rows and terminal failures and run only the episodes still missing (with no "
            "such run, stop)",
            "flag",
            False,
        ),
        Option(
            "resume-or-start",
            "as --harbor-resume, but start afresh when there is no run to continue",
            "flag",
            False,
        ),
        Option(
            "allow-unsupported-pairing",
            "run a harness the dataset's allowed_agents does not admit",
            "flag",
            False,
        ),
        Option(
            "config",
            "settings file (YAML, Gym's harbor server block; repeatable; the settings: "
            "docs/options.md)",
            "list",
            [],
            "FILE",
        ),
        Option(
            "check",
            "author check: per task, the oracle must score 1 and nop below 1; every problem "
            "is listed and the run fails when a task has one",
            "flag",
            False,
        ),
        Option(
            "check-repeats",
            "with --harbor-check: run the oracle N times per task to find flaky verifiers "
            "(default 1)",
            "value",
            None,
            "N",
        ),
        Option(
            "set",
            "one setting, KEY=VALUE (repeatable, last wins; every setting and its default: "
            "docs/options.md)",
            "list",
            [],
            "KEY=VALUE",
        ),
        Option(
            "agent-option",
            "an option of the harness, KEY=VALUE, the value read as JSON where it parses "
            "(repeatable)",
            "list",
            [],
            "KEY=VALUE",
        ),
        Option("model", "the model a harness talks to", "value", None, "NAME"),
        Option(
            "model-url",
            "base URL of its OpenAI-compatible endpoint, ending in /v1",
            "value",
            None,
            "URL",
        ),
        Option(
            "model-param",
            "a request parameter, KEY=VALUE, the value read as JSON where it parses "
            "(temperature, max_tokens, seed, top_p, reasoning_effort; repeatable)",
            "list",
            [],
            "KEY=VALUE",
        ),
        Option(
            "model-api-key-env",
            f"the environment variable holding the API key (default {DEFAULT_API_KEY_ENV})",
            "value",
            DEFAULT_API_KEY_ENV,
            "VAR",
        ),
        Option(
            "model-api-key",
            "the API key itself (other users can read a command line: prefer the variable)",
            "value",
            None,
            "KEY",
        ),
        Option(
            "model-concurrency",
            "at most N model requests at once across the run's workers (default 16)",
            "value",
            "16",
            "N",
        ),
        Option(
            "no-preflight-request",
            "before the run, ask the endpoint for its model list only, not for one small "
            "request like the agent's (for an endpoint that bills per request)",
            "flag",
            False,
        ),
        Option("max-cost", "serve no model call once the run spent USD", "value", None, "USD"),
        Option("max-tokens", "serve no model call once the run spent N tokens", "value", None, "N"),
        Option("prices", "the price table (TOML) model calls are priced by", "value", None, "FILE"),
        Option("record", "keep every model request and answer below DIR", "value", None, "DIR"),
        Option(
            "replay",
            "answer model calls from what --harbor-record kept in DIR",
            "value",
            None,
            "DIR",
        ),
    )
}
