"""The engine's own scripts, run in a sandbox by the trusted busybox (TRUSTED_BUSYBOX: a
static busybox mounted read-only), never by a tool of the image's, which an agent could
have replaced. Each one tells the engine how it went on stderr, in marked lines."""

from __future__ import annotations

from pytest_harbor.redaction import clip_tail
from pytest_harbor.sandboxes.base import TRUSTED_BUSYBOX, ExecResult, SandboxError

__all__ = [
    "BROKEN",
    "DONE",
    "END_PROCESSES",
    "HAND_WORKDIR",
    "PREPARE",
    "RENEW",
    "RESOLVE_USERS",
    "RUN_TEST",
    "SURVEY",
    "TAMPERED",
    "Tampered",
    "check",
    "marked",
    "trusted",
]

TESTS_DIR = "/tests"
VERIFIER_LOGS = "/logs/verifier"
#: Where the verifier finds the agent's transcript (ATIF), written just before it runs.
TRAJECTORY = "/logs/agent/trajectory.json"

#: A line saying the sandbox was changed where the engine needs it: the episode scores 0.
TAMPERED = "pytest-harbor-tampered:"
#: A line saying an engine step failed for another reason.
BROKEN = "pytest-harbor-error:"
#: The line a script that must finish prints when it has (so that a script that never
#: ran, or was cut off, cannot pass for one that found nothing wrong).
DONE = "pytest-harbor-done"

#: The exit codes of a script that stopped because the sandbox was changed where the
#: engine needs it, or because a step failed: they say so when the output is lost.
EXIT_TAMPERED = 97
EXIT_BROKEN = 98
#: What an exec whose command never started exits with (not found, cannot run, no
#: process could be made).
_NOT_STARTED = (-1, 126, 127)

#: Shell functions every engine script starts with ($B is the trusted busybox).
_PRELUDE = f"""
B={TRUSTED_BUSYBOX}
tampered() {{ echo "{TAMPERED} $*" >&2; exit {EXIT_TAMPERED}; }}
broken() {{ echo "{BROKEN} $*" >&2; exit {EXIT_BROKEN}; }}
done_() {{ echo "{DONE}" >&2; }}
"""

#: What the sandbox is at the end of the seed, before any agent: the image's bash and
#: timeout on its PATH (else in the usual folders), and every process with its start time
#: (which no later process can have: the kernel sets it).
SURVEY = """
echo "path:$PATH"
locate() {
  found=""
  old_ifs=$IFS; IFS=:
  for dir in $PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; do
    if [ -f "$dir/$1" ] && [ -x "$dir/$1" ]; then found="$dir/$1"; break; fi
  done
  IFS=$old_ifs
  echo "$1:$found"
}
locate bash
locate timeout
# (In a function: its `set --` leaves the script's arguments to RESOLVE_USERS.)
list_processes() {
  for p in /proc/[0-9]*; do
    read -r stat 2>/dev/null < "$p/stat" || continue
    rest=${stat##*) }
    set -- $rest
    echo "proc:${p#/proc/}:${20}"
  done
}
list_processes
"""

#: Follows SURVEY: each user named in its arguments (a name, a uid, with a group or not)
#: as numbers, read from the image's own files before any agent could change them.
#: Prints `user:<as named>:<uid>:<gid>`, either number empty when unknown.
RESOLVE_USERS = """
for spec in "$@"; do
  name=${spec%%:*}
  case $spec in *:*) group=${spec#*:} ;; *) group="" ;; esac
  case $name in
    ""|*[!0-9]*) uid=$($B id -u "$name" 2>/dev/null) || uid="" ;;
    *) uid=$name ;;
  esac
  gid=""
  if [ -n "$group" ]; then
    case $group in
      *[!0-9]*) gid=$($B awk -F: -v g="$group" '$1 == g { print $3; exit }' /etc/group) ;;
      *) gid=$group ;;
    esac
  elif [ -n "$uid" ]; then
    gid=$($B awk -F: -v u="$uid" '$3 == u { print $4; exit }' /etc/passwd)
  fi
  echo "user:$spec:$uid:$gid"
done
"""

#: `end_processes UID KEEP`: as root, end every process of the user UID (a number: any of
#: its real, effective, saved or file-system uid), or with UID empty every process not in
#: KEEP ("pid:start" of the processes to keep). Each round first stops every process but
#: this shell and the sandbox's first (kill -STOP -1: the kernel signals them all in one
#: pass, and a process with a signal pending cannot fork), so nothing can start another
#: while the round looks through /proc and kills; then the rest go on (SIGCONT). Rounds
#: repeat until one finds nothing to kill; returns 1 when 20 rounds did not get there.
#: Nothing here forks: a sandbox at its pids cap cannot stop it.
END_PROCESSES = """
end_processes() {
  target=$1 keep=" $2 " round=0
  while [ $round -lt 20 ]; do
    round=$((round + 1))
    kill -STOP -1 2>/dev/null
    found=""
    for p in /proc/[0-9]*; do
      pid=${p#/proc/}
      [ "$pid" = "$$" ] && continue
      read -r stat 2>/dev/null < "$p/stat" || continue
      rest=${stat##*) }
      set -- $rest
      # A zombie is dead already: kill cannot end it (the keep-alive reaps orphans).
      [ "$1" = Z ] && continue
      if [ -n "$target" ]; then
        match=""
        { while read -r key real effective saved filesystem rest; do
            if [ "$key" = "Uid:" ]; then
              case " $real $effective $saved $filesystem " in *" $target "*) match=1 ;; esac
              break
            fi
          done < "$p/status"; } 2>/dev/null
        [ -n "$match" ] || continue
      else
        case "$keep" in *" $pid:${20} "*) continue ;; esac
      fi
      kill -9 "$pid" 2>/dev/null
      found="$found $pid"
    done
    kill -CONT -1 2>/dev/null
    [ -z "$found" ] && return 0
  done
  return 1
}
"""

#: `renew DIR NAME`: DIR emptied as a fresh folder, owned by root, mode 755: the old one
#: is set aside, whole, into $trash/NAME (a rename: nothing to walk through, so neither a
#: tree deeper than PATH_MAX nor a million files can make it fail). A folder the image
#: itself has cannot be renamed on overlayfs; its entries are set aside one by one.
RENEW = """
trash=$($B mktemp -d /.pytest-harbor-trash.XXXXXX) \\
  || broken "cannot make a folder to set old files aside in"
renew() {
  if $B mv -f "$1" "$trash/$2" 2>/dev/null; then
    $B mkdir -m 755 "$1" || broken "cannot make $1 anew"
    return 0
  fi
  # (A failed mv may have left part of a copy at $trash/$2.)
  $B mkdir "$trash/$2.entries" || broken "cannot make a folder to set old files aside in"
  for entry in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    [ -e "$entry" ] || [ -L "$entry" ] || continue
    $B mv -f "$entry" "$trash/$2.entries/" 2>/dev/null || $B rm -rf "$entry" 2>/dev/null \\
      || tampered "cannot clear $entry out of $1"
  done
  $B chown 0:0 "$1" && $B chmod 755 "$1" || broken "cannot take $1"
}
set_aside() {
  if [ -e "$1" ] || [ -L "$1" ]; then
    $B mv -f "$1" "$trash/$2" 2>/dev/null || tampered "cannot clear $1 out of the way"
  fi
}
forget_trash() {
  ( $B rm -rf "$trash" > /dev/null 2>&1 & )
}
"""

#: As root: the folders must still be folders and the image's bash still there; no process
#: of the agent's user may be left (it was ended after the agent's turn: one now is one
#: the agent had some other way to start); /tests and /logs/verifier are made anew (the
#: latter handed to the verifier), the transcript's place is cleared, and the tests and
#: the transcript are unpacked from stdin. Arguments: bash, whether to empty /tests, the
#: verifier's user (uid[:gid], or ""), the agent's uid whose processes end (or "").
PREPARE = (
    END_PROCESSES
    + RENEW
    + f"""
bash=$1 upload=$2 verifier_user=$3 agent_uid=$4
for dir in /logs /tests {VERIFIER_LOGS}; do
  if [ -L "$dir" ] || [ ! -d "$dir" ]; then tampered "$dir is no longer a folder"; fi
done
if [ ! -f "$bash" ] || [ ! -x "$bash" ]; then
  tampered "$bash, which runs the verifier, is gone"
fi
if [ -n "$agent_uid" ]; then
  end_processes "$agent_uid" "" \\
    || tampered "processes of the agent's user (uid $agent_uid) survived 20 rounds of kills"
fi
if [ "$upload" = 1 ]; then renew {TESTS_DIR} tests; fi
renew {VERIFIER_LOGS} verifier
$B chown "${{verifier_user:-0}}" {VERIFIER_LOGS} \\
  || broken "cannot hand {VERIFIER_LOGS} to ${{verifier_user:-root}}"
if [ -L /logs/agent ] || [ ! -d /logs/agent ]; then
  set_aside /logs/agent agent
  $B mkdir -m 777 /logs/agent && $B chmod 777 /logs/agent || broken "cannot make /logs/agent"
fi
set_aside {TRAJECTORY} trajectory.json
$B tar -x -f - -C / || broken "cannot unpack the tests"
forget_trash
done_
"""
)

#: Runs test.sh with the image's bash under the trusted timeout, from the working
#: directory (`exec`: the shell would add its own word on a killed test.sh to the output).
#: Arguments: bash, budget, grace.
RUN_TEST = f"""
exec $B timeout -s TERM -k "$3" "$2" "$1" {TESTS_DIR}/test.sh \
  > {VERIFIER_LOGS}/test-stdout.txt 2>&1
"""

#: Before a later turn, as root: the previous turn's tests, reward files and transcript go
#: (set aside, then removed in the background); the agent's own files under /logs/agent
#: stay.
CLEAR = (
    RENEW
    + f"""
for dir in {TESTS_DIR} {VERIFIER_LOGS}; do
  if [ -d "$dir" ] && [ ! -L "$dir" ]; then renew "$dir" "${{dir##*/}}"; fi
done
set_aside {TRAJECTORY} trajectory.json
forget_trash
done_
"""
)

#: As root, before a turn: the working directory $2 given to the user $1. $3 is 1 for the
#: first turn: a working directory that is a link then is the image's; one that became a
#: link later is the agent's doing (handing it over would hand over whatever it names).
HAND_WORKDIR = """
if [ -L "$2" ] && [ "$3" != 1 ]; then tampered "the working directory $2 was replaced by a link"; fi
$B chown "$1" "$2" || broken "cannot hand $2 to $1"
done_
"""


def trusted(script: str, *arguments: str) -> list[str]:
    """The command that runs `script` with the trusted shell (and its helper functions)."""
    return [TRUSTED_BUSYBOX, "sh", "-c", _PRELUDE + script, "sh", *arguments]


class Tampered(SandboxError):
    """The sandbox was changed where the engine needs it: the episode scores 0."""


def check(result: ExecResult, what: str, *, then_ran: bool = False) -> None:
    """Raise Tampered or SandboxError unless the engine script `result` is of went
    through. Its marked lines say how it went; when they are missing (its output lost on
    its way, or it never started) its exit code does. With `then_ran`, the script ended
    by handing its process to another program (test.sh), whose exit code that is."""
    tampered = marked(result.stderr, TAMPERED)
    if tampered is not None:
        raise Tampered(tampered)
    problem = marked(result.stderr, BROKEN)
    if problem is not None:
        raise SandboxError(f"{what}: {problem}")
    if DONE in result.stderr:
        return
    code = result.exit_code
    if result.timed_out:
        raise SandboxError(f"{what} did not finish in time")
    if code == EXIT_TAMPERED:
        raise Tampered(f"{what}: the sandbox was changed where the engine needs it")
    if code == EXIT_BROKEN or code in _NOT_STARTED or (code != 0 and not then_ran):
        detail = clip_tail(result.stderr.strip(), 300)
        raise SandboxError(f"{what} did not go through (exit code {code}): {detail}")


def marked(stderr: str, marker: str) -> str | None:
    """The text after `marker` on the first stderr line that carries it."""
    for line in stderr.splitlines():
        if line.startswith(marker):
            return line[len(marker) :].strip()
    return None
