"""The command channel: one long-lived shell of the engine's in a sandbox, started from the
sealed busybox as root, that runs commands sent to it one after another over the stream
it was started with. Provider-neutral: the script, the request a command becomes, and the
reader of the reply; a provider carries the bytes (sandboxes/docker/channel.py).

Why a reply cannot be forged: each command's reply ends with a random nonce the engine
chose for it, which travels only on the channel's input; the shell that holds it runs
from the sealed busybox (no process may trace it or read its memory, root included) and
passes it to no command. A command's output reaches the stream through two relays of its
own (sealed too), which end when the command's pipes close, so nothing it leaves behind
can write into a later command's reply."""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_harbor.sandboxes import output
from pytest_harbor.sandboxes.base import SEALED_BUSYBOX
from pytest_harbor.sandboxes.output import CappedOutput

__all__ = [
    "CHANNEL_SCRIPT",
    "STDIN_CAP",
    "ChannelReply",
    "channel_arguments",
    "channel_request",
    "quote",
]

#: A command's input travels inside its request (base64); past this, plain exec carries it.
STDIN_CAP = 64 * 1024
#: The first line the channel prints: this, then its pid.
READY = "pytest-harbor-channel"
#: What a request ends with in place of an exit status when the channel leaves the command
#: to plain exec (a user it cannot resolve as the engine would, a folder it cannot enter).
UNSUPPORTED = "u"
#: The exit status of the command's own shell when it could not enter the working folder
#: (before it said its pid: nothing of the command ran).
NO_WORKDIR = 254
#: Lines of /etc/passwd or /etc/group the channel reads before it gives a user up.
_LINES_CAP = 100_000

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: The channel. $1 says whether the sandbox's environment sets HOME (1: commands keep it;
#: else each gets its user's home, as the engine's exec does); $2 is OLDPWD as the
#: sandbox's environment has it ("=value", or "" for none), which the shell's `cd`
#: changes. A command gets PWD (its folder) and SHLVL (one up) as a command with a
#: deadline always has from plain exec, whose wrapper is this busybox's shell too.
#:
#: A request is one line, `r NONCE USER WORKDIR STDIN NENV ENV... ARGV...`, each word
#: quoted by the engine. Its reply: on stderr the command's pid (it leads a session of its
#: own, so a deadline can end its process group), then its stderr, then `NONCE`; on stdout
#: its stdout, then `NONCE:STATUS`. No pid line: the command did not start.
CHANNEL_SCRIPT = f"""S={SEALED_BUSYBOX}
set -o pipefail
home_fixed=$1 oldpwd=$2
nl='
'
here=$PWD
read -r me _ < /proc/self/stat
# resolve SPEC: uid, gid and home as the engine's exec would read them, or 1 when that
# needs what the channel cannot give (supplementary groups, a group named by digits) or
# finds no such user.
resolve() {{
  name=${{1%%:*}}
  case $1 in *:*) group=${{1#*:}} ;; *) group="" ;; esac
  uid="" gid="" home="" user="" lines=0
  # A uid is found by its number alone, a name by its name alone (as the exec does).
  case $name in ""|*[!0-9]*) field=name ;; *) field=uid ;; esac
  [ -f /etc/passwd ] && while IFS=: read -r pn _ pu pg _ ph _; do
    lines=$((lines + 1)); [ $lines -gt {_LINES_CAP} ] && return 1
    case $field in name) key=$pn ;; *) key=$pu ;; esac
    if [ "$key" = "$name" ]; then
      uid=$pu gid=$pg home=$ph user=$pn; break
    fi
  done < /etc/passwd
  if [ -z "$uid" ]; then
    case $name in ""|*[!0-9]*) return 1 ;; esac
    uid=$name gid=0 home=/
  fi
  case $uid:$gid in *[!0-9:]*|:*|*:) return 1 ;; esac
  if [ ! -f /etc/group ]; then
    [ -z "$group" ] && [ -z "$user" ] && return 0
    case $group in ""|*[!0-9]*) return 1 ;; esac
    gid=$group; return 0
  fi
  lines=0 found=""
  while IFS=: read -r gn _ gg members; do
    lines=$((lines + 1)); [ $lines -gt {_LINES_CAP} ] && return 1
    # A group named by digits: the exec takes such a name for a gid too.
    case $gn in ""|*[!0-9]*) ;; *) return 1 ;; esac
    if [ -n "$group" ]; then
      case $group in
        *[!0-9]*) [ -z "$found" ] && [ "$gn" = "$group" ] && found=$gg ;;
      esac
    elif [ -n "$user" ]; then
      case ,$members, in *,"$user",*) return 1 ;; esac
    fi
  done < /etc/group
  [ -z "$group" ] && return 0
  [ -n "$found" ] || case $group in ""|*[!0-9]*) return 1 ;; *) found=$group ;; esac
  case $found in ""|*[!0-9]*) return 1 ;; esac
  gid=$found
}}
# The command's own shell, up to the command: folder, environment, pid line, then the
# command found on its PATH (a bare name would run busybox's applet of that name).
sub() {{
  cd -- "${{1:-$here}}" 2>/dev/null || exit {NO_WORKDIR}
  count=$2; shift 2
  unset OLDPWD
  [ -z "$oldpwd" ] || export "OLDPWD$oldpwd"
  [ "$home_fixed" = 1 ] || export HOME="$home"
  while [ "$count" -gt 0 ]; do export "$1"; shift; count=$((count - 1)); done
  command=$1; shift
  read -r pid _ < /proc/self/stat
  echo "$pid" >&2
  case $command in
    */*) ;;
    *)
      found="" old_ifs=$IFS; IFS=:
      for dir in $PATH; do
        if [ -f "$dir/$command" ] && [ -x "$dir/$command" ]; then found=$dir/$command; break; fi
      done
      IFS=$old_ifs
      [ -n "$found" ] || {{ echo "$command: command not found" >&2; exit 127; }}
      command=$found ;;
  esac
  if [ "$uid:$gid" = 0:0 ]; then exec $S setsid "$command" "$@"; fi
  exec $S setsid $S nsenter -F -S "$uid" -G "$gid" "$command" "$@"
}}
r() {{
  nonce=$1 spec=$2 workdir=$3 input=$4; shift 4
  if [ "$spec" = 0:0 ]; then
    uid=0 gid=0 home=$HOME
  elif ! resolve "$spec"; then
    echo "$nonce:{UNSUPPORTED}"; echo "$nonce" >&2; return
  fi
  # The command's stderr reaches fd 5 (the channel's) through its relay; what the shells
  # between say themselves (a relay's "Killed", say) goes nowhere.
  if [ -n "$input" ]; then
    {{ {{ {{ printf %s "$input" | $S base64 -d || :; }} 2>/dev/null 4>&- 5>&- \
      | sub "$workdir" "$@" 2>&1 1>&4 4>&- 5>&- | $S cat >&5 4>&- 5>&-; }} 4>&1 2>/dev/null \
      | $S cat 5>&-; }} 5>&2
  else
    {{ {{ sub "$workdir" "$@" < /dev/null 2>&1 1>&4 4>&- 5>&- | $S cat >&5 4>&- 5>&-; }} \
      4>&1 2>/dev/null | $S cat 5>&-; }} 5>&2
  fi
  echo "$nonce:$?"; echo "$nonce" >&2
}}
echo "{READY} $me"
while IFS= read -r request; do eval "$request"; done
"""


def quote(value: str) -> str:
    """`value` as one word of the channel's shell, on one line: single quotes, a quote
    inside as '\\'', a newline as "$nl" (the channel reads a request per line)."""
    return "'" + value.replace("'", "'\\''").replace("\n", "'\"$nl\"'") + "'"


def channel_arguments(environment: Sequence[str]) -> list[str]:
    """The channel script's arguments for a sandbox whose environment (`KEY=value` each)
    is `environment`: whether it sets HOME, and its OLDPWD."""
    found: dict[str, str] = {}
    for entry in environment:
        key, sep, value = entry.partition("=")
        if sep:
            found[key] = value
    return ["1" if "HOME" in found else "0", "=" + found["OLDPWD"] if "OLDPWD" in found else ""]


def channel_request(
    nonce: str,
    command: Sequence[str],
    *,
    user: str,
    workdir: str | None,
    env: Mapping[str, str] | None,
    stdin: bytes | None,
) -> bytes | None:
    """The request line for one command, or None when the channel cannot carry it as the
    engine's exec would (a name in `env` the shell cannot export, input over STDIN_CAP,
    no command, a NUL byte or a lone surrogate anywhere): plain exec runs it."""
    words = [*command, user, workdir or "", *(env or {}).keys(), *(env or {}).values()]
    if not command or any("\0" in word for word in words):
        return None
    if stdin is not None and len(stdin) > STDIN_CAP:
        return None
    if any(_NAME.fullmatch(key) is None for key in env or {}):
        return None
    encoded = "" if not stdin else base64.b64encode(stdin).decode("ascii")
    environment = [f"{key}={value}" for key, value in (env or {}).items()]
    parts = [
        "r",
        nonce,
        quote(user),
        quote(workdir or ""),
        quote(encoded),
        str(len(environment)),
        *(quote(entry) for entry in environment),
        *(quote(word) for word in command),
    ]
    try:
        return (" ".join(parts) + "\n").encode()
    except UnicodeEncodeError:  # a lone surrogate: not text the shell can be given
        return None


def new_nonce() -> str:
    return secrets.token_hex(16)


@dataclass
class _Stream:
    """One output stream of a command as it arrives: its bytes up to the nonce, kept within
    the cap; the bytes after the nonce (the status, on stdout)."""

    out: CappedOutput
    pending: bytearray
    done: bool = False
    after: bytes = b""


class ChannelReply:
    """The reply to one request, fed frames as they arrive: the pid line, each stream up to
    its nonce, the status. Byte-exact: nothing is added to or taken from the command's
    output but the channel's own pid line and markers."""

    def __init__(self, nonce: str) -> None:
        self._nonce = nonce.encode()
        self._stdout = _Stream(CappedOutput(), bytearray())
        self._stderr = _Stream(CappedOutput(), bytearray())
        self.pid: int | None = None
        #: The stderr stream began with something other than a pid line.
        self.garbled = False
        self._head = bytearray()
        #: Bytes of output read (both streams).
        self.read = 0

    @property
    def complete(self) -> bool:
        """Both streams reached their nonce, and stdout its status line."""
        return self._stdout.done and self._stderr.done and self._status_line() is not None

    @property
    def capped(self) -> bool:
        return self.read > output.EXEC_READ_CAP

    def feed(self, stdout: bool, data: bytes) -> None:
        self.read += len(data)
        stream = self._stdout if stdout else self._stderr
        if stream.done:
            stream.after += data
            return
        if not stdout and self.pid is None and not self.garbled:
            data = self._take_pid(data)
            if not data:
                return
        stream.pending += data
        at = stream.pending.find(self._nonce)
        if at >= 0:
            stream.out.append(bytes(stream.pending[:at]))
            stream.after = bytes(stream.pending[at + len(self._nonce) :])
            stream.pending.clear()
            stream.done = True
            return
        keep = len(self._nonce) - 1
        if len(stream.pending) > keep:
            cut = len(stream.pending) - keep
            stream.out.append(bytes(stream.pending[:cut]))
            del stream.pending[:cut]

    def _take_pid(self, data: bytes) -> bytes:
        """The pid line at the head of stderr; what follows it."""
        self._head += data
        line, newline, rest = bytes(self._head).partition(b"\n")
        if not newline:
            if len(self._head) > 32 or self._nonce in self._head:
                self.garbled = True
                rest, self._head = bytes(self._head), bytearray()
                return rest
            return b""
        self._head.clear()
        if line.isdigit() and len(line) < 12:
            self.pid = int(line)
            return rest
        self.garbled = True
        return bytes(line + newline + rest)

    def _status_line(self) -> str | None:
        line, newline, _ = self._stdout.after.partition(b"\n")
        if not newline or not line.startswith(b":"):
            return None
        return line[1:].decode("ascii", errors="replace")

    @property
    def unsupported(self) -> bool:
        """The channel left the command to plain exec (nothing of it ran)."""
        return self._status_line() == UNSUPPORTED

    @property
    def started(self) -> bool:
        """The command's shell said its pid: from there on the command may have run."""
        return self.pid is not None

    @property
    def exit_code(self) -> int | None:
        status = self._status_line()
        if status is None or not status.isdigit():
            return None
        return int(status)

    @property
    def trailing(self) -> bool:
        """Bytes after a marker that the protocol does not have: the channel is not the
        engine's to trust any more."""
        status = self._status_line()
        expected = b"" if status is None else b":" + status.encode() + b"\n"
        return self._stdout.after != expected or self._stderr.after not in (b"", b"\n")

    def stdout(self) -> bytes:
        return self._flushed(self._stdout)

    def stderr(self) -> bytes:
        return self._flushed(self._stderr)

    @staticmethod
    def _flushed(stream: _Stream) -> bytes:
        """What the stream holds, its held-back tail included (a reply cut off before its
        nonce keeps every byte that arrived)."""
        if stream.pending:
            stream.out.append(bytes(stream.pending))
            stream.pending.clear()
        return stream.out.value()
