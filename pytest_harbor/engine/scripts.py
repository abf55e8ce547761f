"""The engine's own scripts, run in a sandbox by the trusted busybox (TRUSTED_BUSYBOX: a
static busybox mounted read-only), never by a tool of the image's, which an agent could
have replaced. Each one tells the engine how it went on stderr, in marked lines."""

from __future__ import annotations

from pytest_harbor.redaction import clip_tail
from pytest_harbor.sandboxes.base import (
    SEALED_BUSYBOX,
    TRUSTED_BUSYBOX,
    ExecResult,
    SandboxError,
)

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
#: The folder any process may publish files in; kept as each turn's artifacts.
ARTIFACTS = "/logs/artifacts"

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

#: Shell functions that read what the kernel alone writes about a process (its threads'
#: memory, its start time), never text the process can set. The start time is the 20th
#: field after the last ") " of /proc/PID/stat: the process's name, the one thing in that
#: file a process sets (up to 15 bytes, newlines and parentheses allowed), comes before
#: it, and the fields after it are numbers and a state letter, with no ")" among them; so
#: the last line of the file, cut after its last ") ", is the kernel's, whatever the name.
#: `alive PID`: some thread of the process still has memory mapped (a zombie, or a thread
#: group whose every thread has ended, has none; a zombie leader whose other threads run
#: is alive). Neither forks.
_ALIVE = """
alive() {
  for task in /proc/$1/task/[0-9]*; do
    read -r size _ 2>/dev/null < "$task/statm" || continue
    [ "$size" != 0 ] && return 0
  done
  return 1
}
"""
_STARTED_AT = """
started_at() {
  start="" last=""
  { while IFS= read -r line || [ -n "$line" ]; do last=$line; done < "/proc/$1/stat"; } 2>/dev/null
  case $last in *") "*) ;; *) return 1 ;; esac
  set -- ${last##*) }
  start=${20}
  [ -n "$start" ]
}
"""
PROCESS_FACTS = _ALIVE + _STARTED_AT

#: What the sandbox is at the end of the seed, before any agent: the image's bash and
#: timeout on its PATH (else in the usual folders), and every process with its start time
#: (which no later process can have: the kernel sets it).
SURVEY = (
    PROCESS_FACTS
    + """
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
    started_at "${p#/proc/}" && echo "proc:${p#/proc/}:$start"
  done
}
list_processes
"""
)

#: Follows SURVEY: each user named in its arguments (a name, a uid, with a group or not)
#: as numbers, read from the image's own files before any agent could change them, by
#: the one rule the engine holds to: a name is the first /etc/passwd line with that name
#: (its third and fourth fields), a uid is itself (its group from the first line with
#: that uid); a group is the first /etc/group line with that name, a gid is itself.
#: Agents and verifiers run as these numbers (engine/users.py), so no other reader of
#: the file (the engine's exec, an image's own `id`) can make them run as someone else.
#: Prints `user:<as named>:<uid>:<gid>`, either number empty when unknown.
RESOLVE_USERS = """
for spec in "$@"; do
  name=${spec%%:*}
  case $spec in *:*) group=${spec#*:} ;; *) group="" ;; esac
  uid="" gid=""
  case $name in
    ""|*[!0-9]*)
      line=$($B awk -F: -v n="$name" '$1 == n { print $3 ":" $4; exit }' /etc/passwd)
      uid=${line%%:*} gid=${line#*:} ;;
    *)
      uid=$name
      gid=$($B awk -F: -v u="$uid" '$3 == u { print $4; exit }' /etc/passwd) ;;
  esac
  case $uid in ""|*[!0-9]*) uid="" gid="" ;; esac
  if [ -n "$group" ]; then
    case $group in
      *[!0-9]*) gid=$($B awk -F: -v g="$group" '$1 == g { print $3; exit }' /etc/group) ;;
      *) gid=$group ;;
    esac
  fi
  case $gid in *[!0-9]*) gid="" ;; esac
  echo "user:$spec:$uid:$gid"
done
"""

#: The pauses between rounds of kills, in microseconds (a killed process with much memory
#: takes a while to give it back, and thousands of them on a busy machine take seconds to
#: be scheduled to die): about 10 s in all before a survivor is reported. Only a round
#: that finds a survivor pauses, so an ordinary end costs none of it.
_PAUSES_US = " ".join(str(min(1000 * 2**n, 500_000)) for n in range(28))

#: Run as the agent's own uid by `end_user` (below), from the sealed busybox: `kill -9 -1`
#: signals every process this uid may signal (the kernel decides: those whose real or
#: saved uid is the agent's), in one pass that no fork escapes, then `kill -0` on every
#: pid finds the ones this uid may still signal, and `alive` keeps those with a thread
#: left. Rounds repeat until none is; exits 1 naming the survivors otherwise.
KILL_AS_USER = (
    _ALIVE
    + f"""
for pause in {_PAUSES_US} 0; do
  kill -9 -1 2>/dev/null
  left=""
  for p in /proc/[0-9]*; do
    pid=${{p#/proc/}}
    [ "$pid" = "$$" ] && continue
    kill -0 "$pid" 2>/dev/null || continue
    alive "$pid" && left="$left $pid"
  done
  [ -z "$left" ] && exit 0
  [ "$pause" = 0 ] || {TRUSTED_BUSYBOX} usleep "$pause"
done
echo "left:$left" >&2
exit 1
"""
)

#: `end_user UID GID` (as root): end every process the user UID may signal, which are the
#: agent's own by the kernel's rule. First every process but this shell and the sandbox's
#: first is stopped (`kill -STOP -1`, one pass, no fork escapes it), so that none of the
#: agent's can signal the killer, which runs as the agent's uid (`nsenter -S -G` sets every
#: uid and gid and drops the groups and capabilities) from the sealed busybox (no process
#: may trace it or read its memory); then the rest go on. Returns 1 when some survived.
#:
#: `end_processes_since KEEP` (as root): end every process not in KEEP ("pid:start" of the
#: processes to keep), whoever runs it. Each round stops every process at once, kills the
#: live ones not kept (a zombie leader too: the signal ends its thread group), lets the
#: rest go on; rounds repeat until one finds none. Returns 1 after the last pause.
END_PROCESSES = (
    PROCESS_FACTS
    + f"""
kill_as_user='{KILL_AS_USER}'
end_user() {{
  case $2 in ""|*[!0-9]*) set -- "$1" "$1" ;; esac
  case $1:$2 in
    :*|*[!0-9:]*|0:*) echo "not a user to end: $1:$2" >&2; return 1 ;;
  esac
  kill -STOP -1 2>/dev/null
  {SEALED_BUSYBOX} nsenter -F -S "$1" -G "$2" {SEALED_BUSYBOX} sh -c "$kill_as_user" sh
  ended=$?
  kill -CONT -1 2>/dev/null
  return $ended
}}
end_processes_since() {{
  keep=" $1 "
  for pause in {_PAUSES_US} 0; do
    kill -STOP -1 2>/dev/null
    found=""
    for p in /proc/[0-9]*; do
      pid=${{p#/proc/}}
      [ "$pid" = "$$" ] || [ "$pid" = 1 ] && continue
      started_at "$pid" || continue
      case "$keep" in *" $pid:$start "*) continue ;; esac
      alive "$pid" || continue
      kill -9 "$pid" 2>/dev/null
      found="$found $pid"
    done
    kill -CONT -1 2>/dev/null
    [ -z "$found" ] && return 0
    [ "$pause" = 0 ] || $B usleep "$pause"
  done
  return 1
}}
"""
)

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
#: verifier's user (uid[:gid], or ""), the agent's user whose processes end (uid:gid, or "").
PREPARE = (
    END_PROCESSES
    + RENEW
    + f"""
bash=$1 upload=$2 verifier_user=$3 agent=$4
for dir in /logs /tests {VERIFIER_LOGS}; do
  if [ -L "$dir" ] || [ ! -d "$dir" ]; then tampered "$dir is no longer a folder"; fi
done
if [ ! -f "$bash" ] || [ ! -x "$bash" ]; then
  tampered "$bash, which runs the verifier, is gone"
fi
if [ -n "$agent" ]; then
  end_user "${{agent%%:*}}" "${{agent#*:}}" \\
    || tampered "processes of the agent's user (uid ${{agent%%:*}}) survived every round of kills"
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

#: Before a later turn, as root: the previous turn's tests, reward files, transcript and
#: published artifacts (kept with that turn's results) go (set aside, then removed in the
#: background); the agent's own files under /logs/agent stay.
CLEAR = (
    RENEW
    + f"""
for dir in {TESTS_DIR} {VERIFIER_LOGS}; do
  if [ -d "$dir" ] && [ ! -L "$dir" ]; then renew "$dir" "${{dir##*/}}"; fi
done
if [ -d {ARTIFACTS} ] && [ ! -L {ARTIFACTS} ]; then
  renew {ARTIFACTS} artifacts && $B chmod 777 {ARTIFACTS}
fi
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
    return [TRUSTED_BUSYBOX, "sh", "-c", with_helpers(script), "sh", *arguments]


def with_helpers(script: str) -> str:
    """`script` with the helper functions every engine script may call."""
    return _PRELUDE + script


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
