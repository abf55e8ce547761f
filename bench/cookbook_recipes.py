"""Two recipes of Harbor's cookbook, `mcp-tools` and `simulated-user`, run by pytest-harbor
on this machine: each recipe's oracle (`solution/solve.sh`), then the built-in shell-agent
with the task's MCP servers granted (`task_mcp_grants=required`), driven by a scripted
Chat Completions model on 127.0.0.1 that calls the recipe's MCP tools (mcp-tools:
`get_secret` and `get_timestamp`, then writes the two files with the values the tools
returned; simulated-user: `ask_user`, then writes /app/convert.py as the answers say).
Prints the reward and the times of each run.

    .venv/bin/python bench/cookbook_recipes.py \\
        --cookbook PATH/TO/harbor-cookbook \\
        [--keep-images] [--pin-mcp-client]

`--cookbook` is a checkout of harbor-cookbook or its git directory; the recipes are
extracted to a temporary folder for the run, never into this repository.

What cannot run here unchanged, and what stands in for it (nothing else is changed):

- **Base images** (no registry answers here): each is used if the engine has it, else
  pulled, else made here, labelled `pytest-harbor.run=cookbook-bench`, trusting this
  machine's extra CA certificates (`SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE` and `PIP_CERT` set
  to the system bundle), and removed at the end unless `--keep-images`:
  `ubuntu:24.04` is a minimal Ubuntu noble made by debootstrap from the Ubuntu archive (its
  Release file checked against the archive's signing key, whose fingerprint is pinned
  below); `python:3.12-slim` is `debian:bookworm-slim` (made by .ci/setup) with this
  machine's Python 3.12 (pyenv's) in /usr/local and pip from its ensurepip;
  `ghcr.io/astral-sh/uv:latest` holds `/uv` and `/uvx` of `pip install uv`.
- **uv's installer** (`curl -LsSf https://astral.sh/uv/[VERSION/]install.sh | sh`, in
  mcp-tools' solve.sh and both test.sh): astral.sh cannot be reached, so in the extracted
  copies each such line becomes an install of the same uv version from PyPI into
  `$HOME/.local/bin`, writing `$HOME/.local/bin/env` as the installer does; the rest of
  each script runs as written.
- **Anthropic's Messages API** (simulated-user's `user-server` asks it for the persona's
  answers): the run's `compose_overlay` setting adds a service to the project,
  `anthropic-messages`, a scripted Messages API (bench/cookbook_messages.py, in an image
  made from `python:3.12-slim`), and sets `ANTHROPIC_BASE_URL` on `user-server` to it;
  `compose_variables` gives the task's `${ANTHROPIC_API_KEY}` a dummy key, which the
  stand-in checks.

What fails everywhere today, not only here: mcp-tools' solve.sh runs `uv run --with mcp`,
unpinned, and imports `streamablehttp_client`, which mcp 2.0 (released 2026-07-28, after
the recipe) no longer has, so its oracle scores 0. `--pin-mcp-client`, a fix of the recipe
and not a stand-in (off by default, and printed when on), makes it `--with 'mcp<2'`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_harbor.labels import RUN_LABEL  # noqa: E402
from tests.model_server import ChatRequest, Reply, ScriptedModel, answer, tool_call  # noqa: E402

RECIPES_DIR = "harbor_cookbook/recipes"
RECIPES = ("mcp-tools", "simulated-user")

#: On every image made here: `docker images --filter label=pytest-harbor.run=cookbook-bench`
#: lists what --keep-images kept.
BENCH_LABEL = f"{RUN_LABEL}=cookbook-bench"
BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
HOST_CAS = Path("/usr/local/share/ca-certificates")

UBUNTU = "ubuntu:24.04"
PYTHON = "python:3.12-slim"
UV = "ghcr.io/astral-sh/uv:latest"
DEBIAN = "debian:bookworm-slim"
MESSAGES = "cookbook-bench/anthropic-messages:latest"

UBUNTU_MIRROR = "http://archive.ubuntu.com/ubuntu"
#: The Ubuntu Archive Automatic Signing Key (2018), which signs noble's Release files. A
#: Debian host has no Ubuntu keyring, so the key comes from noble's ubuntu-keyring package
#: and is trusted only if it is this key.
UBUNTU_ARCHIVE_KEY = "F6ECB3762474EDA9D21B7022871920D1991BC93C"
UBUNTU_KEYRING_DEB = "pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb"
UBUNTU_KEY_FILE = "etc/apt/trusted.gpg.d/ubuntu-keyring-2018-archive.gpg"

#: What the stand-in for python:3.12-slim installs beside Python: the libraries its
#: extension modules load (ssl, sqlite3, ctypes, lzma, bz2, readline, ...), as the real
#: image has them.
PYTHON_RUNTIME = (
    "ca-certificates netbase tzdata libbz2-1.0 libexpat1 libffi8 liblzma5 libncursesw6 "
    "libnsl2 libreadline8 libsqlite3-0 libssl3 libuuid1 zlib1g"
)

#: A line of a recipe's script that runs uv's installer from astral.sh.
UV_INSTALLER = re.compile(
    r"^\s*curl\s+-LsSf\s+https://astral\.sh/uv/(?:(?P<version>[0-9][^/\s]*)/)?install\.sh"
    r"\s*\|\s*sh\s*$"
)

#: What replaces that line: uv (the same version, or the newest) from PyPI's simple index
#: (PEP 691; its file URLs may be relative), the wheel's SHA-256 checked against the
#: index's, its `uv` and `uvx` put where the installer puts them, and the installer's `env`
#: file, which adds that folder to PATH once.
UV_FROM_PYPI = """\
# cookbook bench: uv {shown} from PyPI in place of astral.sh's installer (not reachable)
python3 - {version} <<'COOKBOOK_BENCH_UV'
import hashlib, io, json, os, platform, sys, urllib.parse, urllib.request, zipfile
def get(url, kind="application/json"):
    with urllib.request.urlopen(urllib.request.Request(url, headers={{"Accept": kind}})) as got:
        return got.read()
version = sys.argv[1] if len(sys.argv) > 1 else ""
if not version:
    version = json.loads(get("https://pypi.org/pypi/uv/json"))["info"]["version"]
index = "https://pypi.org/simple/uv/"
files = json.loads(get(index, "application/vnd.pypi.simple.v1+json"))["files"]
suffix = "_" + platform.machine() + ".whl"
wheel = next(
    f for f in files
    if f["filename"].startswith("uv-" + version + "-")
    and f["filename"].endswith(suffix) and "manylinux" in f["filename"]
)
data = get(urllib.parse.urljoin(index, wheel["url"]), "*/*")
assert hashlib.sha256(data).hexdigest() == wheel["hashes"]["sha256"], wheel["filename"]
folder = os.path.join(os.environ["HOME"], ".local", "bin")
os.makedirs(folder, exist_ok=True)
with zipfile.ZipFile(io.BytesIO(data)) as archive:
    for name in archive.namelist():
        if "/scripts/" in name and name.rsplit("/", 1)[1] in ("uv", "uvx"):
            path = os.path.join(folder, name.rsplit("/", 1)[1])
            with open(path, "wb") as out:
                out.write(archive.read(name))
            os.chmod(path, 0o755)
print("installing to " + folder + ": uv " + version + " from PyPI")
COOKBOOK_BENCH_UV
cat > "$HOME/.local/bin/env" <<'COOKBOOK_BENCH_ENV'
#!/bin/sh
# add uv's folder to PATH, once
case ":${{PATH}}:" in
    *:"$HOME/.local/bin":*) ;;
    *) export PATH="$HOME/.local/bin:$PATH" ;;
esac
COOKBOOK_BENCH_ENV
"""

#: mcp-tools' solve.sh asks uv for `--with mcp`, unpinned, and imports
#: `streamablehttp_client`, which mcp 2.0 (2026-07-28, after the recipe) no longer has: its
#: oracle fails everywhere today, not only here. Not a stand-in for this machine but a fix
#: of the recipe, so only with --pin-mcp-client: the SDK the recipe was written for (1.x).
MCP_UNPINNED = re.compile(r"--with mcp(?=\s)")
MCP_PINNED = "--with 'mcp<2'"

#: The Compose file of the job-level overlay for simulated-user: the scripted Messages API
#: beside the recipe's services, and user-server pointed at it.
MESSAGES_OVERLAY = f"""\
services:
  user-server:
    environment:
      ANTHROPIC_BASE_URL: http://anthropic-messages:8000
    depends_on:
      anthropic-messages:
        condition: service_healthy
  anthropic-messages:
    image: {MESSAGES}
    environment:
      ANTHROPIC_API_KEY: ${{ANTHROPIC_API_KEY}}
    healthcheck:
      test:
        - CMD
        - python3
        - -c
        - import socket; socket.create_connection(('localhost', 8000), 2)
      interval: 1s
      retries: 30
"""
DUMMY_ANTHROPIC_KEY = "sk-ant-cookbook-bench-dummy"


def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """`command`, its output kept; a failure stops the bench with its last lines."""
    done = subprocess.run(command, capture_output=True, **{"text": True, **kwargs})
    if done.returncode != 0:
        output = done.stdout + done.stderr
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
        tail = "\n".join(output.strip().splitlines()[-30:])
        sys.exit(f"failed ({done.returncode}): {shlex.join(command)}\n{tail}")
    return done


def has_image(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def host_cas(folder: Path) -> None:
    """This machine's extra CA certificates into `folder`, for an image to trust."""
    folder.mkdir(parents=True, exist_ok=True)
    for certificate in HOST_CAS.glob("*.crt"):
        shutil.copy(certificate, folder / certificate.name)


def docker_build(name: str, context: Path, dockerfile: str) -> None:
    (context / "Dockerfile").write_text(dockerfile)
    run(["docker", "build", "-q", "--label", BENCH_LABEL, "-t", name, str(context)])


def make_ubuntu(work: Path) -> None:
    """Ubuntu noble, minimal, by debootstrap from the Ubuntu archive."""
    keyring = work / "keyring"
    deb = work / "ubuntu-keyring.deb"
    with urllib.request.urlopen(f"{UBUNTU_MIRROR}/{UBUNTU_KEYRING_DEB}", timeout=60) as got:
        deb.write_bytes(got.read())
    run(["dpkg", "-x", str(deb), str(keyring)])
    key = keyring / UBUNTU_KEY_FILE
    listed = run(["gpg", "--show-keys", "--with-colons", str(key)]).stdout
    prints = [line.split(":")[9] for line in listed.splitlines() if line.startswith("fpr:")]
    if prints != [UBUNTU_ARCHIVE_KEY]:
        sys.exit(f"{UBUNTU_KEYRING_DEB}: {key.name} holds {prints}, not {UBUNTU_ARCHIVE_KEY}")
    if shutil.which("debootstrap") is None:
        run(["apt-get", "install", "-y", "-qq", "debootstrap"])
    scripts = Path("/usr/share/debootstrap/scripts")
    # Older debootstraps (bookworm's) know noble only as another Ubuntu suite.
    script = [] if (scripts / "noble").exists() else [str(scripts / "gutsy")]
    rootfs = work / "rootfs"
    run(
        [
            "debootstrap", "--variant=minbase", "--include=ca-certificates",
            f"--keyring={key}", "noble", str(rootfs), UBUNTU_MIRROR, *script,
        ]
    )  # fmt: skip
    host_cas(rootfs / HOST_CAS.relative_to("/"))
    run(["chroot", str(rootfs), "update-ca-certificates"])
    # The suites and components the real image lists (python3-pip is in universe).
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    (rootfs / "etc/apt/sources.list.d/ubuntu.sources").write_text(
        f"Types: deb\nURIs: {UBUNTU_MIRROR}\n"
        "Suites: noble noble-updates noble-backports noble-security\n"
        "Components: main restricted universe multiverse\n"
        "Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n"
    )
    for leftover in [
        *(rootfs / "var/cache/apt/archives").glob("*.deb"),
        *(rootfs / "var/lib/apt/lists").glob("*_*"),
    ]:
        leftover.unlink()
    changes = [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"ENV SSL_CERT_FILE={BUNDLE}",
        f"ENV REQUESTS_CA_BUNDLE={BUNDLE}",
        f"ENV PIP_CERT={BUNDLE}",
        f"LABEL {BENCH_LABEL}",
        'CMD ["/bin/bash"]',
    ]
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    run(
        ["docker", "import", *(f"--change={change}" for change in changes), "-", UBUNTU],
        stdin=tar.stdout,
    )
    tar.wait()
    shutil.rmtree(rootfs)


def python312() -> Path:
    """This machine's Python 3.12 (pyenv's newest)."""
    found = sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))
    if not found:
        sys.exit("no Python 3.12 under ~/.pyenv/versions: the python:3.12-slim stand-in needs one")
    return found[-1].parent.parent


def make_python(work: Path) -> None:
    """debian:bookworm-slim with Python 3.12 in /usr/local, as the real image has it."""
    if not has_image(DEBIAN):
        sys.exit(f"{DEBIAN} is not on the engine: run .ci/setup first")
    home = python312()
    version = home.name
    context = work / "python-context"
    target = context / "python"
    (target / "bin").mkdir(parents=True)
    for name in ("python3.12", "python3", "python"):
        source = home / "bin" / name
        if source.is_symlink():
            (target / "bin" / name).symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target / "bin" / name)
    (target / "lib").mkdir()
    for library in (home / "lib").glob("libpython3*.so*"):
        shutil.copy2(library, target / "lib" / library.name, follow_symlinks=False)

    def leave_out(folder: str, names: list[str]) -> set[str]:
        # The test suite, the static library, and what was installed into this machine's
        # copy (pip comes back from ensurepip).
        if folder == str(home / "lib/python3.12"):
            return {"test", "site-packages"}
        return {name for name in names if name.endswith(".a")}

    shutil.copytree(
        home / "lib/python3.12", target / "lib/python3.12", symlinks=True, ignore=leave_out
    )
    (target / "lib/python3.12/site-packages").mkdir()
    shutil.copytree(home / "include", target / "include", symlinks=True)
    host_cas(context / "ca")
    docker_build(
        PYTHON,
        context,
        f"FROM {DEBIAN}\n"
        "RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        f"--no-install-recommends {PYTHON_RUNTIME} >/dev/null && rm -rf /var/lib/apt/lists/*\n"
        "COPY ca/ /usr/local/share/ca-certificates/\n"
        "COPY python/ /usr/local/\n"
        "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "
        f"PYTHON_VERSION={version} SSL_CERT_FILE={BUNDLE} REQUESTS_CA_BUNDLE={BUNDLE} "
        f"PIP_CERT={BUNDLE}\n"
        "RUN update-ca-certificates >/dev/null && ldconfig "
        "&& python3 -m ensurepip --default-pip >/dev/null "
        "&& python3 -c 'import bz2, ctypes, lzma, readline, sqlite3, ssl, uuid, zlib'\n"
        'CMD ["python3"]\n',
    )


def make_uv(work: Path) -> None:
    """An image holding `/uv` and `/uvx`, as astral's does."""
    context = work / "uv-context"
    context.mkdir()
    docker_build(
        UV,
        context,
        f"FROM {PYTHON}\n"
        "RUN pip install --no-cache-dir -q uv && cp /usr/local/bin/uv /usr/local/bin/uvx /\n"
        'ENTRYPOINT ["/uv"]\n',
    )


def make_messages(work: Path) -> None:
    """The scripted Messages API of bench/cookbook_messages.py, in an image."""
    context = work / "messages-context"
    context.mkdir()
    shutil.copy(ROOT / "bench" / "cookbook_messages.py", context)
    docker_build(
        MESSAGES,
        context,
        f"FROM {PYTHON}\nCOPY cookbook_messages.py /srv/\n"
        'CMD ["python3", "/srv/cookbook_messages.py", "8000"]\n',
    )


class Images:
    """The images the recipes need that the engine lacks, made (or pulled) here; at the
    end, those and every image the bench's pytest runs built (labelled with their run ids:
    other runs on the same engine keep theirs) are removed, unless kept."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.made: list[str] = []
        self.runs: list[str] = []

    def ensure(self, name: str, make: Callable[[Path], None], what: str) -> None:
        if has_image(name):
            print(f"  {name}: on the engine already, used as it is")
            return
        if subprocess.run(["docker", "pull", "-q", name], capture_output=True).returncode == 0:
            print(f"  {name}: pulled")
            self.made.append(name)
            return
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="cookbook-bench-image-") as work:
            make(Path(work))
        self.made.append(name)
        print(
            f"  {name}: cannot be pulled; made here in {time.monotonic() - started:.0f} s: {what}"
        )

    def built(self) -> list[str]:
        """The images the bench's runs built, by name."""
        names = []
        for run_id in self.runs:
            listed = run(
                [
                    "docker", "images", "--filter", f"label={RUN_LABEL}={run_id}",
                    "--format", "{{.Repository}}:{{.Tag}}",
                ]
            )  # fmt: skip
            names += [name for name in listed.stdout.split() if name not in names]
        return names

    def remove(self) -> None:
        names = [*self.built(), *reversed(self.made)]
        if self.keep:
            print(f"kept (--keep-images): {', '.join(names) or 'nothing'}")
            return
        for name in names:
            removed = subprocess.run(["docker", "rmi", name], capture_output=True, text=True)
            print(f"removed {name}" if removed.returncode == 0 else removed.stderr.strip())


def extract(cookbook: Path, into: Path) -> dict[str, Path]:
    """The recipes, from a checkout or from a git directory (HEAD), into `into`."""
    into.mkdir(parents=True)
    if (cookbook / RECIPES_DIR).is_dir():
        for name in RECIPES:
            shutil.copytree(cookbook / RECIPES_DIR / name, into / name, symlinks=True)
    else:
        paths = [f"{RECIPES_DIR}/{name}" for name in RECIPES]
        archive = run(["git", f"--git-dir={cookbook}", "archive", "HEAD", *paths], text=False)
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
        for name in RECIPES:
            (into / RECIPES_DIR / name).rename(into / name)
        shutil.rmtree(into / RECIPES_DIR.split("/")[0])
    return {name: into / name for name in RECIPES}


def rewrite_scripts(recipe: Path, change: Callable[[str], str | None]) -> list[str]:
    """Each line of the recipe's shell scripts that `change` gives a replacement for,
    replaced; the lines replaced, by file and number."""
    replaced = []
    for script in sorted(recipe.rglob("*.sh")):
        lines = script.read_text().splitlines(keepends=True)
        for number, line in enumerate(lines):
            new = change(line)
            if new is not None:
                lines[number] = new
                replaced.append(f"{script.relative_to(recipe.parent)}:{number + 1}: {line.strip()}")
        script.write_text("".join(lines))
    return replaced


def uv_from_pypi(line: str) -> str | None:
    found = UV_INSTALLER.match(line)
    if found is None:
        return None
    version = found["version"] or ""
    return UV_FROM_PYPI.format(version=version, shown=version or "(newest)")


def mcp_below_2(line: str) -> str | None:
    return MCP_UNPINNED.sub(MCP_PINNED, line) if MCP_UNPINNED.search(line) else None


# The scripted model. It reads what it needs from the request: the tools it is offered and
# the answers of its earlier calls.


def offered(request: ChatRequest, suffix: str) -> str | None:
    """The name of the offered tool ending in `suffix` (`__get_secret`)."""
    names = [tool["function"]["name"] for tool in request.body.get("tools") or []]
    return next((name for name in names if name.endswith(suffix)), None)


def results_of(request: ChatRequest) -> list[tuple[str, dict[str, Any], str]]:
    """Each tool call of the conversation so far: its name, arguments and answer."""
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    answered = []
    for message in request.messages:
        for call in message.get("tool_calls") or []:
            function = call["function"]
            calls[call["id"]] = (function["name"], json.loads(function["arguments"] or "{}"))
        if message.get("role") == "tool":
            name, arguments = calls[message["tool_call_id"]]
            answered.append((name, arguments, str(message["content"])))
    return answered


def call(name: str, arguments: dict[str, Any], number: int) -> Reply:
    return tool_call(
        calls=[
            {
                "id": f"call_{number}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ]
    )


def mcp_tools_model(request: ChatRequest) -> Reply:
    """get_secret, get_timestamp, then the two files written with their answers."""
    done = results_of(request)
    answers = {name: text for name, _, text in done}
    for suffix in ("__get_secret", "__get_timestamp"):
        tool = offered(request, suffix)
        if tool is None:
            return answer(f"No tool ending in {suffix} was offered: I cannot do the task.")
        if tool not in answers:
            return call(tool, {}, len(done))
    if "bash" not in answers:
        secret = answers[offered(request, "__get_secret") or ""]
        stamp = answers[offered(request, "__get_timestamp") or ""]
        command = (
            f"printf %s {shlex.quote(secret)} > /app/secret.txt && "
            f"printf %s {shlex.quote(stamp)} > /app/timestamp.txt && "
            "cat /app/secret.txt && echo && cat /app/timestamp.txt"
        )
        return call("bash", {"command": command}, len(done))
    return answer("Wrote the secret to /app/secret.txt and the timestamp to /app/timestamp.txt.")


QUESTIONS = (
    "Where should the script read the CSV from, and where should it write the JSON?",
    "What should the JSON look like?",
)
CONVERTER = """\
import csv
import json
import sys

json.dump(list(csv.DictReader(sys.stdin)), sys.stdout)
print()
"""


def simulated_user_model(request: ChatRequest) -> Reply:
    """ask_user each question, then /app/convert.py as the answers say."""
    done = results_of(request)
    tool = offered(request, "__ask_user")
    if tool is None:
        return answer("No ask_user tool was offered: I cannot ask the user anything.")
    replies = [text for name, _, text in done if name == tool]
    if len(replies) < len(QUESTIONS):
        return call(tool, {"question": QUESTIONS[len(replies)]}, len(done))
    said = " ".join(replies).lower()
    if not ("stdin" in said and "stdout" in said and "array of objects" in said):
        return answer(f"The user's answers do not say what to build: {replies}")
    if not any(name == "bash" for name, _, _ in done):
        command = (
            f"cat > /app/convert.py <<'EOF'\n{CONVERTER}EOF\n"
            "printf 'name,age\\nAlice,30\\n' | python3 /app/convert.py"
        )
        return call("bash", {"command": command}, len(done))
    return answer("/app/convert.py reads CSV from stdin and writes a JSON array of objects.")


@dataclass(frozen=True)
class Outcome:
    """One pytest run of one recipe."""

    recipe: str
    agent: str
    wall_s: float
    row: dict[str, Any] | None
    summary: str

    def line(self) -> str:
        if self.row is None:
            return f"  {self.agent:<12} no result ({self.wall_s:.1f} s): {self.summary}"
        times = self.row["timings"]
        phases = ", ".join(
            f"{phase.removesuffix('_s')} {times[phase]:.1f} s"
            for phase in ("build_s", "start_s", "seed_s", "agent_s", "verify_s")
            if times.get(phase) is not None
        )
        failure = f", {self.row['failure_kind']}" if self.row.get("failure_kind") else ""
        usage = self.row.get("usage") or {}
        calls = (
            f"   {usage.get('requests', 0)} model requests, "
            f"{usage.get('tool_calls', 0)} MCP tool calls"
            if usage
            else ""
        )
        return (
            f"  {self.agent:<12} reward {self.row['reward']:.1f}{failure}   "
            f"pytest {self.wall_s:.1f} s   ({phases}){calls}"
        )


def pytest_run(
    recipe: Path,
    results: Path,
    agent: str,
    options: list[str],
    env: dict[str, str],
    runs: list[str],
) -> Outcome:
    """One pytest run of `recipe`; its run id is added to `runs` (what it built is
    removed by it)."""
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
        f"--harbor-dataset={recipe}", f"--harbor-results-dir={results}",
        "--harbor-report=none", *options,
    ]  # fmt: skip
    print(f"$ {shlex.join(command[2:])}", flush=True)
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=results.parent, env=env)
    wall = time.monotonic() - started
    runs += [
        json.loads(manifest.read_text())["run_id"]
        for manifest in results.rglob("rollouts_manifest.json")
    ]
    rows = [
        json.loads(line)
        for found in results.rglob("rollouts.jsonl")
        for line in found.read_text().splitlines()
    ]
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else done.stderr.strip()[-500:]
    if not rows or rows[0]["reward"] != 1.0:
        print("\n".join(lines[-40:]), done.stderr[-2000:], sep="\n")
        for failures in results.rglob("rollouts_failures.jsonl"):
            print(failures.read_text()[-3000:])
    return Outcome(recipe.name, agent, wall, rows[0] if rows else None, summary)


def run_recipe(recipe: Path, scratch: Path, runs: list[str]) -> list[Outcome]:
    """The recipe's oracle, then shell-agent with its MCP servers and the scripted model."""
    options: list[str] = []
    model = mcp_tools_model
    if recipe.name == "simulated-user":
        model = simulated_user_model
        overlay = scratch / "anthropic-messages.yaml"
        overlay.write_text(MESSAGES_OVERLAY)
        settings = scratch / "simulated-user-settings.yaml"
        settings.write_text(
            "harbor_environment_server:\n  environment_servers:\n    harbor:\n"
            f"      compose_overlay:\n        files: [{overlay}]\n"
            f"      compose_variables:\n        ANTHROPIC_API_KEY: {DUMMY_ANTHROPIC_KEY}\n"
        )
        options.append(f"--harbor-config={settings}")
    oracle = scratch / f"results-{recipe.name}-oracle"
    outcomes = [pytest_run(recipe, oracle, "oracle", options, dict(os.environ), runs)]
    with ScriptedModel(model) as server:
        agent_options = server.options("--harbor-set=task_mcp_grants=required", *options)
        env = {**os.environ, "HARBOR_MODEL_API_KEY": server.api_key}
        results = scratch / f"results-{recipe.name}-agent"
        outcome = pytest_run(recipe, results, "shell-agent", agent_options, env, runs)
        calls = results_of(server.requests[-1]) if server.requests else []
    outcomes.append(outcome)
    print(f"  {recipe.name}: the scripted model's {len(server.requests)} requests; its calls:")
    for name, arguments, text in calls:
        shown = json.dumps(arguments) if name != "bash" else "(the files, see above)"
        print(f"    {name} {shown} -> {text.strip()[:160]!r}")
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cookbook",
        type=Path,
        required=True,
        help="a checkout of harbor-cookbook, or its git directory",
    )
    parser.add_argument(
        "--keep-images",
        action="store_true",
        help="keep the images made here (stand-ins and the recipes' builds) for the next run",
    )
    parser.add_argument(
        "--pin-mcp-client",
        action="store_true",
        help="a fix of the recipe, not a stand-in: mcp-tools' solve.sh gets mcp<2 (mcp 2.0 "
        "removed the streamablehttp_client it imports)",
    )
    args = parser.parse_args()
    started = time.monotonic()
    images = Images(keep=args.keep_images)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="cookbook-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        try:
            recipes = extract(args.cookbook.resolve(), scratch / "recipes")
            print(f"recipes of {args.cookbook} extracted to {scratch / 'recipes'}")
            print("substitutions:")
            print("  uv's installer from astral.sh replaced by uv from PyPI in:")
            for recipe in recipes.values():
                for replaced in rewrite_scripts(recipe, uv_from_pypi):
                    print(f"    {replaced}")
            if args.pin_mcp_client:
                print("  --pin-mcp-client: `--with mcp` becomes `--with 'mcp<2'` in:")
                for recipe in recipes.values():
                    for pinned in rewrite_scripts(recipe, mcp_below_2):
                        print(f"    {pinned}")
            print(
                "  Anthropic's Messages API: simulated-user's user-server gets "
                f"ANTHROPIC_BASE_URL=http://anthropic-messages:8000 (a scripted {MESSAGES} "
                "added by compose_overlay) and ANTHROPIC_API_KEY=<dummy> (compose_variables)"
            )
            print("  base images:")
            images.ensure(
                UBUNTU, make_ubuntu, "debootstrap noble (minbase) from the Ubuntu archive"
            )
            images.ensure(PYTHON, make_python, f"{DEBIAN} with pyenv's Python 3.12 in /usr/local")
            images.ensure(UV, make_uv, "/uv and /uvx of `pip install uv`")
            images.ensure(MESSAGES, make_messages, "bench/cookbook_messages.py")
            for recipe in recipes.values():
                outcomes += run_recipe(recipe, scratch, images.runs)
        finally:
            images.remove()
    elapsed = time.monotonic() - started
    print(f"\nHarbor cookbook recipes under pytest-harbor ({elapsed:.0f} s in all):")
    for name in RECIPES:
        print(name)
        for outcome in outcomes:
            if outcome.recipe == name:
                print(outcome.line())
    if len(outcomes) != 2 * len(RECIPES) or any(
        outcome.row is None or outcome.row["reward"] != 1.0 for outcome in outcomes
    ):
        sys.exit(1)


if __name__ == "__main__":
    main()
