"""The command channel: one long-lived shell of the engine's in a sandbox, started from the
sealed busybox as root, that runs commands sent to it one after another over the stream
it was started with: the script and the request a command becomes; reply.py reads the
reply, pool.py carries the bytes.

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

from pytest_harbor.sandboxes.base import SEALED_BUSYBOX

__all__ = [
    "CHANNEL_SCRIPT",
    "NO_WORKDIR",
    "READY",
    "STDIN_CAP",
    "UNSUPPORTED",
    "channel_arguments",
    "channel_request",
    "new_nonce",
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
    """A fresh nonce to end one command's reply with."""
    return secrets.token_hex(16)
