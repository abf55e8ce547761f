"""Runs a task's Python verifier in its sandbox, for pytest-harbor (Python 3.8 or newer,
standard library only).

The engine's `test.sh` starts it in isolated mode (`-I`: no PYTHONPATH, no user site, not
this folder on the path) from the working directory, which it is given as the
`workspace`. `verifier.json` beside it names the verifier module and holds the task's
fields. `verify(...)` gets only the parameters it declares (`workspace`, `task_data`,
`response`, `state`; positional-only ones by position); an `async def` is awaited. A
number it returns becomes `/logs/verifier/reward.txt`, a dict of numbers `reward.json`.
What keeps the call from being made or read (a contract error) is written to
`/logs/verifier/contract-error.txt`, and the run ends with status 3 and no reward. The
helpers of this folder (`harbor_verifiers`) are loaded before the verifier, so nothing of
that name in the task or the image takes their place.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import math
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
LOGS = Path("/logs/verifier")
GIVEN = ("workspace", "task_data", "response", "state")
HELPERS = "harbor_verifiers"


class ContractError(Exception):
    """The verifier cannot be called as its task declares it, or returned no reward."""


def _load(name: str, path: Path, package: bool = False) -> ModuleType:
    """The module at `path`, as `name` (replacing anything of that name loaded before)."""
    for loaded in list(sys.modules):
        if loaded == name or loaded.startswith(name + "."):
            del sys.modules[loaded]
    spec = importlib.util.spec_from_file_location(
        name, str(path), submodule_search_locations=[str(path.parent)] if package else None
    )
    if spec is None or spec.loader is None:
        raise ContractError(f"{path} cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _fields(model: Any) -> set[str] | None:
    known = getattr(model, "model_fields", None) or getattr(model, "__fields__", None)
    return None if known is None else set(known)


def _task_data(data: dict[str, Any]) -> dict[str, Any]:
    """The task's fields, typed by the dataset's `TaskData` when it ships `task_data.py`
    (where its imports are there to be had)."""
    model_file = HERE / "task_data.py"
    if not model_file.is_file():
        return data
    try:
        module = _load("task_data", model_file)
    except ImportError as error:
        print(
            f"task_data.py was not applied ({type(error).__name__}: {error}); "
            "verify() gets the fields as task_data.json holds them",
            file=sys.stderr,
        )
        return data
    model = getattr(module, "TaskData", None)
    if model is None:
        raise ContractError("the dataset's task_data.py defines no TaskData")
    known = _fields(model)
    unknown = sorted(set(data) - known) if known is not None else []
    if unknown:
        raise ContractError(f"task_data.json holds fields TaskData lacks: {', '.join(unknown)}")
    try:
        validate = getattr(model, "model_validate", None)
        typed = validate(data) if validate is not None else model(**data)
    except Exception as error:  # the model's own error, whatever its type
        raise ContractError(f"task_data.json does not fit TaskData: {error}") from None
    for dump in ("model_dump", "dict"):
        method = getattr(typed, dump, None)
        if callable(method):
            result = method()
            if isinstance(result, dict):
                return result
    return dict(vars(typed))


def _arguments(
    verify: Any, available: dict[str, Any], has_response: bool
) -> tuple[list[Any], dict[str, Any]]:
    try:
        signature = inspect.signature(verify)
    except (TypeError, ValueError) as error:
        raise ContractError(f"verify() has no signature to read: {error}") from None
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    gap = False  # a positional-only parameter was left to its default
    for name, parameter in signature.parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        required = parameter.default is parameter.empty
        given = name in available and (name != "response" or has_response)
        if not given:
            if required and name == "response":
                raise ContractError(
                    "verify() requires `response`, and this turn has none (the oracle's, or "
                    "a harness that gave no final answer); give it a default such as None"
                )
            if required:
                raise ContractError(
                    f"verify() requires {name!r}; it may declare only {', '.join(GIVEN)}"
                )
            gap = gap or parameter.kind == parameter.POSITIONAL_ONLY
            continue
        if parameter.kind == parameter.POSITIONAL_ONLY:
            if gap:
                raise ContractError(f"verify() takes {name!r} by position after one it lacks")
            args.append(available[name])
        else:
            kwargs[name] = available[name]
    return args, kwargs


async def _awaited(value: Any) -> Any:
    return await value


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _write_reward(result: Any) -> None:
    if isinstance(result, dict):
        rewards: dict[str, float] = {}
        for key, value in result.items():
            number = _number(value)
            if not isinstance(key, str) or number is None:
                raise ContractError(f"verify() returned a dict whose {key!r} is not a number")
            rewards[key] = number
        if not rewards:
            raise ContractError("verify() returned an empty dict")
        (LOGS / "reward.json").write_text(json.dumps(rewards) + "\n")
        return
    number = _number(result)
    if number is None:
        raise ContractError(
            f"verify() returned {type(result).__name__}, not a number or a dict of numbers"
        )
    (LOGS / "reward.txt").write_text(f"{number!r}\n")


def main(workspace: Path) -> None:
    settings = json.loads((HERE / "verifier.json").read_text(encoding="utf-8"))
    _load(HELPERS, HERE / HELPERS / "__init__.py", package=True)
    verifier = Path(settings["verifier"])
    sys.path.insert(0, str(verifier.parent))
    response_file = HERE / "response.json"
    has_response = response_file.is_file()
    response = json.loads(response_file.read_text(encoding="utf-8")) if has_response else None
    available = {
        "workspace": workspace,
        "task_data": _task_data(dict(settings.get("task_data") or {})),
        "response": response,
        "state": {"workspace": workspace},
    }
    module = _load("verifier", verifier)
    verify = getattr(module, "verify", None)
    if not callable(verify):
        raise ContractError(f"{verifier} defines no verify()")
    args, kwargs = _arguments(verify, available, has_response)
    result = verify(*args, **kwargs)
    if inspect.isawaitable(result):
        result = asyncio.run(_awaited(result))
    _write_reward(result)
    print(f"verify() returned {result!r}")


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
    except ContractError as error:
        (LOGS / "contract-error.txt").write_text(f"{error}\n")
        print(f"contract error: {error}", file=sys.stderr)
        sys.exit(3)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
