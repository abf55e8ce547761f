"""The command line execd runs for each of the engine's commands, and the reading of
what it sends back: the wrapper that relays a command's stdout and stderr in base64,
keeps a copy of both, and ends with a status line of its own mark."""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Iterable, Iterator, Sequence

from pytest_harbor.sandboxes import output
from pytest_harbor.sandboxes.base import SEALED_BUSYBOX, ExecResult
from pytest_harbor.sandboxes.opensandbox.execd import CommandEnd
from pytest_harbor.sandboxes.output import EXEC_OUTPUT_CAP, CappedOutput

__all__ = ["JOINED", "SETTING", "SPAWN", "CommandOutput", "command_line", "copy_lines"]

#: The base64 line width of the relays (execd sends a line per event).
_LINE = 3072
#: `run COMMAND ARGS...`: the command found on PATH as the engine's exec finds it (a bare
#: name would otherwise run busybox's applet of that name).
_RUN = """run() {
  command=$1; shift
  case $command in */*) exec "$command" "$@" ;; esac
  IFS=:
  for d in $PATH; do
    if [ -f "$d/$command" ] && [ -x "$d/$command" ]; then exec "$d/$command" "$@"; fi
  done
  echo "$command: command not found" >&2
  exit 127
}
"""
#: The variables a command's wrapper takes its settings from (the request's environment,
#: which a process of another user cannot read, where its arguments anyone can).
SETTING = "PYTEST_HARBOR_EXEC_"
#: The wrapper every command runs in, by the sealed busybox (no process may read its
#: memory, environment or files, not even one of the same user) as the command's user.
#: Its settings: DIR the folder (empty: execd's), HOME to set (empty: keep), INPUT stdin
#: (a file; empty: none) or INDATA (stdin itself, in base64: a small one travels with
#: the command), PRE the engine's own work to do first (a script, as root only; PUTS
#: names the variables holding archives it unpacks, unset once it ran),
#: NONCE the mark of its own lines, KEEP where its copies go (KEEP.1 and KEEP.2; empty:
#: none), DROP earlier copies of its user's to remove. stdout and stderr each go through
#: a sealed relay that writes base64 lines, to execd and to its copy; the last line on
#: stdout is `!NONCE STATUS` (`!NONCE pre` when the engine's work failed, what it said on
#: stderr).
_WRAPPER = f"""S=${SETTING}SHELL
mark=${SETTING}NONCE dir=${SETTING}DIR home=${SETTING}HOME
input=${{{SETTING}INPUT:-/dev/null}} indata=${SETTING}INDATA pre=${SETTING}PRE
keep=${SETTING}KEEP drop=${SETTING}DROP puts=${SETTING}PUTS
unset {SETTING}SHELL {SETTING}NONCE {SETTING}DIR {SETTING}HOME {SETTING}INPUT \\
  {SETTING}INDATA {SETTING}PRE {SETTING}KEEP {SETTING}DROP {SETTING}PUTS
unset EXECD EXECD_ENVS EXECD_ACCESS_TOKEN
[ -z "$drop" ] || $S rm -f -- $drop 2>/dev/null
o=/dev/null e=/dev/null
[ -z "$keep" ] || {{ o=$keep.1 e=$keep.2; (umask 077; : >"$o"; : >"$e") 2>/dev/null; }}
to1() {{ $S tee -a -- "$o" 2>/dev/null || :; }}
to2() {{ $S tee -a -- "$e" >&2 2>/dev/null || :; }}
if [ -n "$pre" ]; then
  if ! said=$($S sh -c "$pre" 2>&1); then
    printf '%s\n' "$said" | $S base64 | to2; echo "!$mark pre" | to1; exit 0
  fi
fi
for v in $puts; do unset "$v"; done
[ -n "$home" ] && export HOME="$home"
if [ -n "$dir" ] && ! cd -- "$dir" 2>/dev/null; then
  echo "cannot enter the folder $dir" | $S base64 | to2; echo "!$mark 126" | to1; exit 0
fi
{_RUN}set -o pipefail
exec 3>&1
if [ -n "$indata" ]; then
  {{ {{ printf '%s' "$indata" | $S base64 -d 2>/dev/null || :; }} \\
      | run "$@" 2>&4 4>&- 3>&- | $S base64 -w {_LINE} | to1 >&3; }} 4>&1 \\
    | $S base64 -w {_LINE} | to2
else
  {{ run "$@" < "$input" 2>&4 4>&- 3>&- | $S base64 -w {_LINE} | to1 >&3; }} 4>&1 \\
    | $S base64 -w {_LINE} | to2
fi
echo "!$mark $?" | to1
"""


#: A command started in the background (the image's ENTRYPOINT): $1 its folder, then the
#: command, found on PATH, without execd's variables.
SPAWN = (
    _RUN
    + """unset EXECD EXECD_ENVS EXECD_ACCESS_TOKEN
[ -z "$1" ] || cd -- "$1" || exit 126
shift
run "$@"
"""
)


#: A command whose input and output are joined to the engine (terminal.py): $1 its
#: folder (empty: execd's), $2 the folder of its FIFOs, then the command, found on PATH.
JOINED = (
    _RUN
    + """unset EXECD EXECD_ENVS EXECD_ACCESS_TOKEN
[ -z "$1" ] || cd -- "$1" || exit 126
f=$2
shift 2
run "$@" <"$f/in" >"$f/out" 2>"$f/err"
"""
)


def command_line(argv: Sequence[str], script: str = _WRAPPER, shell: str = SEALED_BUSYBOX) -> str:
    """The shell command line execd gets: the image's shell execs the sealed busybox
    (`shell`) at once, with the wrapper and `argv` quoted."""
    return " ".join(shlex.quote(part) for part in (shell, "sh", "-c", script, "sh", *argv))


class _Decoded:
    """One stream's base64 lines, decoded as they come into a CappedOutput."""

    def __init__(self) -> None:
        self.output = CappedOutput(EXEC_OUTPUT_CAP)
        self._pending = ""

    def feed(self, line: str) -> None:
        text = self._pending + "".join(line.split())
        whole = len(text) - len(text) % 4
        self._pending = text[whole:]
        try:
            self.output.append(base64.b64decode(text[:whole], validate=False))
        except ValueError:
            self._pending = ""  # not the relay's: nothing of the command's


class CommandOutput:
    """A command's output as its events bring it: stdout and stderr decoded, the wrapper's
    own lines (those with its mark) read, and the reading stopped past EXEC_READ_CAP."""

    def __init__(self, mark: str) -> None:
        self._mark = f"!{mark} "
        self.stdout = _Decoded()
        self.stderr = _Decoded()
        self.status: int | None = None
        self.pre_failed = False
        self.read = 0
        self.capped = False
        #: Said after the output when it could not be read back whole.
        self.note = ""

    def take(self, kind: str, text: str) -> bool:
        self.read += len(text)
        if self.read > output.EXEC_READ_CAP:
            self.capped = True
            return False
        if kind == "stderr":
            self.stderr.feed(text)
        elif text.startswith(self._mark):
            said = text[len(self._mark) :].strip()
            self.pre_failed = said == "pre"
            if re.fullmatch(r"[0-9]{1,3}", said):
                self.status = int(said)
        else:
            self.stdout.feed(text)
        return True

    def result(self, end: CommandEnd, timed_out: bool) -> ExecResult:
        stdout, stderr = self.stdout.output.value(), self.stderr.output.value()
        if self.capped:
            stdout += (
                f"\n[... output not read past {output.EXEC_READ_CAP} bytes: "
                "the command was ended ...]\n"
            ).encode()
        if end.start_error:
            stderr += f"execd could not start the command: {end.start_error}\n".encode()
        if self.note:
            stderr += f"[{self.note}]\n".encode()
        status = self.status
        if status is None:
            status = end.exit_code if end.exit_code is not None else 137
        return ExecResult(
            exit_code=status, stdout_bytes=stdout, stderr_bytes=stderr, timed_out=timed_out
        )


def copy_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of a copy as they come (the relays write ASCII)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            yield line.decode("ascii", "replace")
    if pending:
        yield pending.decode("ascii", "replace")
