"""What is installed is what is tested: the wheel and the sdist hold every file of the
package, its data too (the helper image's Dockerfile, the agents' recipes, the scripts
copied into sandboxes), wherever in the package those files are."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "pytest_harbor"
#: What setuptools reads to build, beside the package folder.
BUILD_INPUTS = ("pyproject.toml", "README.md", "MANIFEST.in")


@pytest.fixture(scope="module")
def package_files() -> list[str]:
    """The package's files as a clean clone has them: those git tracks (and the work
    tree still holds, while files move), or outside a git checkout every file of the
    package folder but Python's caches."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", PACKAGE],
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode == 0 and listed.stdout:
        names = [name for name in listed.stdout.split("\0") if name]
    else:
        names = [
            path.relative_to(ROOT).as_posix()
            for path in (ROOT / PACKAGE).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
        ]
    return sorted(name for name in names if (ROOT / name).is_file())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, package_files: list[str]) -> Path:
    """The wheel and the sdist, built from a copy of the build's inputs: a build in the
    checkout would pack whatever an earlier build left in build/lib."""
    work = tmp_path_factory.mktemp("package-build")
    source, out = work / "source", work / "dist"
    for name in [*BUILD_INPUTS, *package_files]:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    # The build backend's own hooks (PEP 517), as pip and `build` call them: no network,
    # no isolated environment, and no front end beyond setuptools itself. (The hooks
    # rewrite sys.argv, so the folder is read first.)
    hooks = (
        "import sys; from setuptools import build_meta as backend; out = sys.argv[1]; "
        "backend.build_wheel(out); backend.build_sdist(out)"
    )
    done = subprocess.run(
        [sys.executable, "-c", hooks, str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def test_the_wheel_holds_every_file_of_the_package(built: Path, package_files: list[str]) -> None:
    (wheel,) = built.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    missing = [name for name in package_files if name not in shipped]
    assert not missing, f"{wheel.name} lacks {missing}"


def test_the_sdist_holds_every_file_of_the_package(built: Path, package_files: list[str]) -> None:
    (sdist,) = built.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        # Each member is under the sdist's own top folder (name-version/).
        shipped = {member.name.partition("/")[2] for member in archive.getmembers()}
    missing = [name for name in package_files if name not in shipped]
    assert not missing, f"{sdist.name} lacks {missing}"


def test_the_package_is_found_in_both(package_files: list[str]) -> None:
    # The comparison above means something only if there is a package to compare.
    assert f"{PACKAGE}/__init__.py" in package_files
    assert len(package_files) > 10


def test_the_package_holds_no_leftover_of_an_edit(package_files: list[str]) -> None:
    """Everything under the package folder ships (MANIFEST.in takes it whole), so a
    patch's backup or an editor's copy committed there would ship too."""
    leftovers = [
        name for name in package_files if name.endswith((".orig", ".rej", "~", ".bak", ".swp"))
    ]
    assert leftovers == []
