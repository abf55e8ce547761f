"""execd's file routes: file info, deletion, directories, permissions, upload and
download, with the reading of /etc/passwd and Range headers they need."""

from __future__ import annotations

import io
import json
import posixpath
import re
import tarfile
import time
from collections.abc import Iterator
from email.utils import formatdate
from typing import Any

import docker.errors

from tests.opensandbox_fake.docker_exec import _DockerExec
from tests.opensandbox_fake.faults import Fault, cut
from tests.opensandbox_fake.records import _Sandbox
from tests.opensandbox_fake.wire import (
    _error,
    _go_json,
    _Handler,
    _HttpError,
    _invalid_body,
    _parse_multipart,
    _stat_time,
)

#: One line per path: "-" when missing, else mode (hex), size, mtime, ctime, uid, gid.
_INFO_SCRIPT = """\
for p in "$@"; do
  if [ -e "$p" ] || [ -L "$p" ]; then stat -c '%f|%s|%y|%z|%u|%g' -- "$p" || echo '?'
  else echo '-'; fi
done
echo '=== passwd'; cat /etc/passwd 2>/dev/null; echo '=== group'; cat /etc/group 2>/dev/null
"""
#: Creates the parent ($1) and tells what the target ($2) is: "dir", "new", or
#: "old MODE UID GID" for a file (through a symlink); then /etc/passwd and /etc/group.
_UPLOAD_SCRIPT = """\
mkdir -p -- "$1" 2>&1 || { echo 'mkdir-failed'; exit 0; }
if [ -d "$2" ]; then echo dir
elif [ -e "$2" ]; then stat -L -c 'old %f %u %g' -- "$2"; readlink -f -- "$2"
else echo new; fi
echo '=== passwd'; cat /etc/passwd 2>/dev/null; echo '=== group'; cat /etc/group 2>/dev/null
"""


def _octal_mode(mode: int) -> int:
    """The upload's mode: decimal digits read as octal (755 → 0o755); Go keeps only the
    permission bits. Digits 8 or 9, or a sign, raise ValueError."""
    text = str(mode)
    if not re.fullmatch(r"[0-7]+", text):
        raise ValueError(f'strconv.ParseUint: parsing "{text}": invalid syntax')
    return int(text, 8) & 0o777


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (the engine's archive stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._chunk = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._chunk:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._chunk = memoryview(chunk)
        size = min(len(buffer), len(self._chunk))
        buffer[:size] = self._chunk[:size]
        self._chunk = self._chunk[size:]
        return size


class _Files(_DockerExec):
    """execd's file routes."""

    # -- execd: files ------------------------------------------------------------------------

    def _files_info(self, sandbox: _Sandbox, query: list[tuple[str, str]]) -> bytes:
        paths = [value for key, value in query if key == "path"]
        if not paths:
            return b"{}"
        resolved = []
        for path in paths:
            try:
                resolved.append(self._resolve(sandbox, path))
            except ValueError as error:
                message = f"error accessing file: invalid path {path}: {error}"
                raise _error(500, "RUNTIME_ERROR", message) from None
        _, out, _ = self._shell(sandbox, _INFO_SCRIPT, *resolved)
        lines, users, groups = _split_with_ids(out.decode(errors="replace"))
        answer: dict[str, object] = {}
        for path, absolute, line in zip(paths, resolved, lines, strict=False):
            fields = line.split("|")
            if len(fields) != 6:
                raise _error(
                    404,
                    "FILE_NOT_FOUND",
                    f"file not found. file not found: {path}: lstat {absolute}: "
                    "no such file or directory",
                )
            raw_mode = int(fields[0], 16)
            kind = {0o120000: "symlink", 0o040000: "directory", 0o100000: "file"}
            answer[path] = {
                "path": absolute,
                "type": kind.get(raw_mode & 0o170000, "other"),
                "size": int(fields[1]),
                "modified_at": _stat_time(fields[2]),
                "created_at": _stat_time(fields[3]),
                "owner": users.get(fields[4], fields[4]),
                "group": groups.get(fields[5], fields[5]),
                "mode": int(oct(raw_mode & 0o777)[2:]),
            }
        return _go_json(dict(sorted(answer.items())))

    def _delete_files(self, sandbox: _Sandbox, query: list[tuple[str, str]]) -> None:
        for path in (value for key, value in query if key == "path"):
            try:
                target = self._resolve(sandbox, path)
            except ValueError as error:
                message = f"error removing file {path}. invalid path: {error}"
                raise _error(500, "RUNTIME_ERROR", message) from None
            script = 'if [ -d "$1" ]; then echo dir; elif [ -e "$1" ]; then rm -f -- "$1" 2>&1; fi'
            _, out, _ = self._shell(sandbox, script, target)
            if out.strip() == b"dir":
                message = f"error removing file {path}. path is a directory: {path}"
                raise _error(500, "RUNTIME_ERROR", message)
            if out.strip():
                message = (
                    f"error removing file {path}. failed to remove file: {out.decode().strip()}"
                )
                raise _error(500, "RUNTIME_ERROR", message)

    def _make_directories(self, sandbox: _Sandbox, body: bytes) -> None:
        try:
            request = json.loads(body or b"null")
            if not isinstance(request, dict) or not all(
                isinstance(item, dict) for item in request.values()
            ):
                raise ValueError("want an object of objects")
        except ValueError as error:
            message = f"error parsing request, MAYBE invalid body format. {error}"
            raise _invalid_body(message) from None
        for path, permission in request.items():
            try:
                target = self._resolve(sandbox, path)
            except ValueError as error:
                raise _error(500, "RUNTIME_ERROR", f"error accessing file: {error}") from None
            script = (
                'if [ -d "$1" ]; then echo existed; elif [ -e "$1" ]; then echo notdir; '
                'else mkdir -p -- "$1" 2>&1 && echo created; fi'
            )
            _, out, _ = self._shell(sandbox, script, target)
            result = out.decode(errors="replace").strip()
            if result == "notdir":
                message = f"error accessing file: mkdir {target}: not a directory"
                raise _error(500, "RUNTIME_ERROR", message)
            if result.endswith("created"):
                self._apply_permission(sandbox, target, permission, None)
            elif result != "existed":
                raise _error(500, "RUNTIME_ERROR", f"error accessing file: {result}")

    def _delete_directories(self, sandbox: _Sandbox, query: list[tuple[str, str]]) -> None:
        for path in (value for key, value in query if key == "path"):
            try:
                target = self._resolve(sandbox, path)
            except ValueError as error:
                message = f"error resolving directory {path}. {error}"
                raise _error(500, "RUNTIME_ERROR", message) from None
            code, out, _ = self._shell(sandbox, 'rm -rf -- "$1" 2>&1', target)
            if code != 0:
                message = f"error removing directory {path}. {out.decode(errors='replace').strip()}"
                raise _error(500, "RUNTIME_ERROR", message)

    def _apply_permission(
        self,
        sandbox: _Sandbox,
        target: str,
        permission: dict[str, Any],
        ids: tuple[dict[str, str], dict[str, str]] | None,
    ) -> None:
        """execd's ChmodFile: the mode (digits read as octal) if not 0, then the owner and
        group, which are names looked up in the container's /etc/passwd and /etc/group."""
        mode = permission.get("mode") or 0
        owner = permission.get("owner") or ""
        group = permission.get("group") or ""
        if mode:
            try:
                bits = _octal_mode(int(mode))
            except ValueError as error:
                raise _error(500, "RUNTIME_ERROR", f"error accessing file: {error}") from None
            self._shell(sandbox, f'chmod {bits:o} -- "$1"', target)
        if not owner and not group:
            return
        if ids is None:
            _, out, _ = self._shell(
                sandbox, "echo '=== passwd'; cat /etc/passwd; echo '=== group'; cat /etc/group"
            )
            _, users, groups = _split_with_ids(out.decode(errors="replace"), by_name=True)
        else:
            users, groups = ids
        uid, gid = _owner_ids(owner, group, users, groups)
        spec = f":{gid}" if uid < 0 else f"{uid}" if gid < 0 else f"{uid}:{gid}"
        self._shell(sandbox, f'chown {spec} -- "$1"', target)

    def _upload(self, sandbox: _Sandbox, handler: _Handler, body: bytes) -> None:
        parts = _parse_multipart(handler.headers.get("Content-Type", ""), body)
        if parts is None:
            raise _error(400, "INVALID_FILE", "multipart form is empty")
        # Go's ReadForm files only parts with a filename; the rest are plain values.
        metas = [part for part in parts if part.name == "metadata" and part.filename]
        files = [part for part in parts if part.name == "file" and part.filename]
        if not metas:
            raise _error(400, "INVALID_FILE_METADATA", "metadata file is missing")
        if not files:
            raise _error(400, "INVALID_FILE_CONTENT", "file is missing")
        if len(metas) != len(files):
            message = f"metadata and file count mismatch: {len(metas)} vs {len(files)}"
            raise _error(400, "INVALID_FILE", message)
        for meta, content in zip(metas, files, strict=True):
            self._upload_one(sandbox, meta.data, content.data)

    def _upload_one(self, sandbox: _Sandbox, meta_bytes: bytes, content: bytes) -> None:
        try:
            meta = json.loads(meta_bytes)
            if not isinstance(meta, dict):
                raise ValueError("want an object")
            for name, kind in (("path", str), ("owner", str), ("group", str), ("mode", int)):
                value = meta.get(name)
                if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
                    raise ValueError(f"cannot unmarshal {name}")
        except ValueError as error:
            message = f"invalid metadata format. {error}"
            raise _error(400, "INVALID_FILE_METADATA", message) from None
        path = meta.get("path") or ""
        if not path:
            raise _error(400, "INVALID_FILE_METADATA", "metadata path is empty")
        try:
            target = self._resolve(sandbox, path)
        except ValueError as error:
            message = f"error resolving target path {path}. {error}"
            raise _error(500, "RUNTIME_ERROR", message) from None
        parent = posixpath.dirname(target)
        _, out, _ = self._shell(sandbox, _UPLOAD_SCRIPT, parent, target)
        lines, users, groups = _split_with_ids(out.decode(errors="replace"), by_name=True)
        first = lines[0] if lines else ""
        if first.startswith("mkdir-failed") or first.startswith("mkdir:"):
            message = f"error creating target directory {parent}. {first}"
            raise _error(500, "RUNTIME_ERROR", message)
        if first == "dir":
            message = f"error opening destination file {target}. open {target}: is a directory"
            raise _error(500, "RUNTIME_ERROR", message)
        # A new file gets 0777 & umask (0755) and root; an old one keeps both (O_TRUNC).
        mode, uid, gid = 0o755, 0, 0
        if first.startswith("old ") and len(lines) > 1:
            _, raw_mode, old_uid, old_gid = first.split()
            mode, uid, gid = int(raw_mode, 16) & 0o7777, int(old_uid), int(old_gid)
            target = lines[1]
        failure: _HttpError | None = None
        try:
            if meta.get("mode"):
                mode = _octal_mode(meta["mode"])
            if meta.get("owner") or meta.get("group"):
                new_uid, new_gid = _owner_ids(
                    meta.get("owner") or "", meta.get("group") or "", users, groups
                )
                uid = uid if new_uid < 0 else new_uid
                gid = gid if new_gid < 0 else new_gid
        except (ValueError, _HttpError) as error:
            detail = error.body if isinstance(error, _HttpError) else str(error)
            if isinstance(detail, dict):
                detail = detail.get("message", "")
            failure = _error(500, "RUNTIME_ERROR", f"error chmoding file {target}. {detail}")
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            entry = tarfile.TarInfo(posixpath.basename(target))
            entry.size, entry.mode, entry.uid, entry.gid = len(content), mode, uid, gid
            entry.mtime = int(time.time())
            tar.addfile(entry, io.BytesIO(content))
        try:
            self._client.api.put_archive(
                sandbox.container_id, posixpath.dirname(target), archive.getvalue()
            )
        except docker.errors.APIError as error:
            message = f"error opening destination file {target}. {error}"
            raise _error(500, "RUNTIME_ERROR", message) from None
        if failure is not None:
            raise failure

    def _download(self, handler: _Handler, sandbox: _Sandbox, query: list[tuple[str, str]]) -> None:
        path = dict(query).get("path", "")
        if not path:
            raise _error(400, "MISSING_QUERY", "missing query parameter 'path'")
        try:
            target = self._resolve(sandbox, path)
        except ValueError as error:
            message = f"error resolving file path: {path}. {error}"
            raise _error(500, "RUNTIME_ERROR", message) from None
        script = (
            'if [ -e "$1" ]; then readlink -f -- "$1"; '
            'if [ -d "$1" ]; then echo dir; else echo file; fi; else echo missing; fi'
        )
        _, out, _ = self._shell(sandbox, script, target)
        lines = out.decode(errors="replace").splitlines()
        if not lines or lines[0] == "missing":
            message = f"file not found. open {target}: no such file or directory"
            raise _error(404, "FILE_NOT_FOUND", message)
        real_path, kind = lines[0], lines[-1]
        name = posixpath.basename(target)
        headers = {
            "Content-Disposition": f'attachment; filename="{name}"',
            "Accept-Ranges": "bytes",
        }
        if kind == "dir":
            # execd opens a directory, announces its size and fails while copying it.
            handler.send_response(200)
            handler.send_header("Content-Type", "application/octet-stream")
            handler.send_header("Content-Length", "4096")
            handler.end_headers()
            handler.close_connection = True
            return
        chunks, _ = self._client.api.get_archive(sandbox.container_id, real_path)
        with tarfile.open(fileobj=_ChunkReader(iter(chunks)), mode="r|") as archive:
            member = archive.next()
            source = archive.extractfile(member) if member is not None else None
            if member is None or source is None:
                raise _error(500, "RUNTIME_ERROR", f"error reading {target}")
            size = member.size
            start, length, status = 0, size, 200
            wanted = handler.headers.get("Range")
            if wanted:
                span = _byte_range(wanted, size)
                if span is None:
                    raise _HttpError(416, {"code": "UNKNOWN"})
                start, length, status = span[0], span[1], 206
                headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{size}"
            handler.send_response(status)
            handler.send_header("Content-Type", "application/octet-stream")
            handler.send_header("Content-Length", str(length))
            handler.send_header("Last-Modified", formatdate(member.mtime, usegmt=True))
            for header, value in headers.items():
                handler.send_header(header, value)
            handler.end_headers()
            skip = start
            while skip:
                skip -= len(source.read(min(skip, 1 << 16)))
            remaining, sent = length, 0
            fault = self.faults.take("download", real_path)
            try:
                while remaining:
                    block = source.read(min(remaining, 1 << 16))
                    if not block:
                        break
                    if fault is not None and sent + len(block) > fault.after:
                        head = fault.after - sent
                        _serve_fault(handler, fault, block[:head])
                        if fault.action == "cut":
                            return
                        block, sent, remaining = block[head:], sent + head, remaining - head
                        fault = None
                    handler.wfile.write(block)
                    sent += len(block)
                    remaining -= len(block)
            except OSError:
                handler.close_connection = True
            if remaining:
                handler.close_connection = True


def _serve_fault(handler: _Handler, fault: Fault, first: bytes) -> None:
    """`first` (the bytes before the fault) sent, then the stall or the cut."""
    handler.wfile.write(first)
    handler.wfile.flush()
    if fault.action == "cut":
        cut(handler.connection)
        handler.close_connection = True
    else:
        time.sleep(fault.seconds)


def _split_with_ids(
    text: str, *, by_name: bool = False
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """A script's own lines, then the users and groups of its /etc/passwd and /etc/group
    tails: id → name, or name → id with `by_name` (the first entry wins, as in Go)."""
    own, _, rest = text.partition("=== passwd\n")
    passwd, _, group = rest.partition("=== group\n")
    tables: list[dict[str, str]] = []
    for table in (passwd, group):
        entries: dict[str, str] = {}
        for line in table.splitlines():
            fields = line.split(":")
            if len(fields) >= 3 and fields[2].isdigit():
                key, value = (fields[0], fields[2]) if by_name else (fields[2], fields[0])
                entries.setdefault(key, value)
        tables.append(entries)
    return own.splitlines(), tables[0], tables[1]


def _owner_ids(
    owner: str, group: str, users: dict[str, str], groups: dict[str, str]
) -> tuple[int, int]:
    """Names to ids (-1: unchanged), as Go's user.Lookup and LookupGroup: a number that is
    not a name is unknown."""
    uid = gid = -1
    if owner:
        if owner not in users:
            message = f"failed to lookup user {owner}: user: unknown user {owner}"
            raise _error(500, "RUNTIME_ERROR", message)
        uid = int(users[owner])
    if group:
        if group not in groups:
            message = f"failed to lookup group {group}: group: unknown group {group}"
            raise _error(500, "RUNTIME_ERROR", message)
        gid = int(groups[group])
    return uid, gid


def _byte_range(header: str, size: int) -> tuple[int, int] | None:
    """The first range of a Range header as (start, length); None when it cannot be met."""
    match = re.fullmatch(r"\s*bytes=\s*(\d*)\s*-\s*(\d*)\s*(?:,.*)?", header)
    if not match or (not match[1] and not match[2]):
        return None
    if not match[1]:
        length = min(int(match[2]), size)
        return (size - length, length) if length else None
    start = int(match[1])
    if start >= size:
        return None
    end = min(int(match[2]), size - 1) if match[2] else size - 1
    return (start, end - start + 1) if end >= start else None
