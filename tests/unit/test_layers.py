"""The package's layers: every import goes to its own layer or one below, and the imports
made when a module loads form no cycle (docs/architecture.md draws the layers)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest_harbor

PACKAGE = Path(pytest_harbor.__file__).parent

#: Lowest first. A module's layer is that of its first name below `pytest_harbor`.
LAYERS = [
    {
        "atomic",
        "strict_json",
        "untrusted",
        "threads",
        "ignore",
        "labels",
        "locks",
        "registry",
        "agent_outcomes",
        "display",
        "templates",
        "reach",
    },
    {"tasks"},
    {"datasets"},
    {"settings"},
    {"redaction"},
    {"relay"},
    {"sandboxes"},
    {"harnesses"},
    {"engine"},
    {"run"},
    {"writers"},
    {"report"},
    {"plugin"},
    {""},  # pytest_harbor/__init__.py: the public API
]


#: The floors of `sandboxes/`, lowest first. A module's floor is that of its first name
#: below `pytest_harbor.sandboxes`: the provider contract, then Compose (one room, no
#: provider in it), then the providers side by side, then the face (`__init__.py`).
SANDBOX_FLOORS = [
    {"base", "routes", "checks", "archives", "output", "copies", "images", "pipes"},
    {"compose"},
    {"docker", "opensandbox"},
    {""},
]
#: The providers, which import nothing of each other's but the one exception below.
PROVIDERS = {"docker", "opensandbox"}
#: The one import between providers: the opensandbox provider builds a task's image on
#: this machine's Docker engine, with the docker provider's builder and its engine
#: connection, under its border, before pushing it to the server's registry (a second
#: builder would be a copy of the first).
BETWEEN_PROVIDERS = {
    ("pytest_harbor.sandboxes.opensandbox.images", "pytest_harbor.sandboxes.docker.engine"),
    ("pytest_harbor.sandboxes.opensandbox.images", "pytest_harbor.sandboxes.docker.provider"),
}


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(path): path for path in PACKAGE.rglob("*.py")}


def _layer(module: str) -> int:
    first = module.split(".")[1] if "." in module else ""
    return next(index for index, names in enumerate(LAYERS) if first in names)


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.startswith("pytest_harbor")]
    if not node.module or not node.module.startswith("pytest_harbor"):
        return []
    found = []
    for alias in node.names:
        submodule = f"{node.module}.{alias.name}"
        found.append(submodule if submodule in MODULES else node.module)
    return found


def _imports(body: list[ast.stmt], *, at_load: bool) -> list[str]:
    """The modules `body` imports; at_load: only those imported when the module loads
    (not in functions, not under `if TYPE_CHECKING`)."""
    found: list[str] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found += _targets(node)
        elif isinstance(node, ast.If):
            checking = isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            if not (at_load and checking):
                found += _imports(node.body, at_load=at_load)
            found += _imports(node.orelse, at_load=at_load)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                found += _imports(part, at_load=at_load)
        elif not at_load and isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
        ):
            found += _imports(node.body, at_load=at_load)
        elif not at_load:
            found += [
                target
                for inner in ast.walk(node)
                if isinstance(inner, ast.Import | ast.ImportFrom)
                for target in _targets(inner)
            ]
    return found


def _tree(module: str) -> list[ast.stmt]:
    return ast.parse(MODULES[module].read_text()).body


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = [
        f"{module} -> {target}"
        for module in MODULES
        for target in _imports(_tree(module), at_load=False)
        if _layer(target) > _layer(module)
    ]
    assert upward == []


def _room(module: str) -> str:
    """The first name below `pytest_harbor.sandboxes` ("" for the package itself)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else ""


def _floor(module: str) -> int:
    return next(index for index, rooms in enumerate(SANDBOX_FLOORS) if _room(module) in rooms)


def _sandbox_imports() -> list[tuple[str, str]]:
    return [
        (module, target)
        for module in MODULES
        if module.startswith("pytest_harbor.sandboxes")
        for target in _imports(_tree(module), at_load=False)
        if target.startswith("pytest_harbor.sandboxes")
    ]


def test_no_module_of_sandboxes_imports_from_a_floor_above_its_own() -> None:
    upward = [
        f"{module} -> {target}"
        for module, target in _sandbox_imports()
        if _floor(target) > _floor(module)
    ]
    assert upward == []


def test_no_provider_imports_another_but_the_named_exception() -> None:
    between = {
        (module, target)
        for module, target in _sandbox_imports()
        if _room(module) in PROVIDERS
        and _room(target) in PROVIDERS
        and _room(module) != _room(target)
    }
    assert between == BETWEEN_PROVIDERS


def test_every_module_of_sandboxes_has_a_floor() -> None:
    rooms = {_room(module) for module in MODULES if module.startswith("pytest_harbor.sandboxes")}
    assert rooms <= set().union(*SANDBOX_FLOORS)


def test_the_imports_made_at_load_form_no_cycle() -> None:
    graph = {module: set(_imports(_tree(module), at_load=True)) for module in MODULES}
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append([*path[path.index(module) :], module])
            return
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert cycles == []


def test_no_module_is_over_600_lines() -> None:
    long = {
        name: length
        for name, path in MODULES.items()
        if (length := len(path.read_text().splitlines())) > 600
    }
    assert long == {}


def test_imports_in_functions_count_as_imports_but_not_as_made_at_load() -> None:
    """The reader above sees a lazy import (harnesses load a CLI agent's code only when
    one is asked for) and tells it from one made at load."""
    package = _tree("pytest_harbor.harnesses")
    assert "pytest_harbor.harnesses.cli_agent" in _imports(package, at_load=False)
    assert "pytest_harbor.harnesses.cli_agent" not in _imports(package, at_load=True)
    assert _layer("pytest_harbor.plugin.run") > _layer("pytest_harbor.engine.episode")
