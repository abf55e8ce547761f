"""Cassettes: every request a grant's harness sent and the answer it got, kept so that a
later run answers the same requests the same way without the endpoint.

A cassette is one file per episode (`<taskset>/<episode>.jsonl` below the folder), a line
per call: its key, its place among the calls of that key, the answer's status, type and
body. The key is a hash of the request as the harness sent it (method, path, body), with
the fields a client fills anew each run left out of the body (`VOLATILE`), so that the same
conversation is the same key; the token is in a header, never in the key or the file.
A replay answers the n-th call of a key with the n-th answer kept for it (the last one
once those run out); a key never kept is a miss.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_harbor.untrusted import load_json

__all__ = ["VOLATILE", "Cassette", "Recorded", "cassette_path", "request_key"]

#: Top-level request fields a client sets anew for each run (ids of its session, of the
#: machine's user, of a prompt cache): left out of the key.
VOLATILE = frozenset({"metadata", "user", "prompt_cache_key", "safety_identifier"})


def request_key(method: str, path: str, body: bytes) -> str:
    """The hash a request is kept and found under."""
    parsed = load_json(body).value if body else None
    if isinstance(parsed, dict):
        kept = {key: value for key, value in parsed.items() if key not in VOLATILE}
        canonical = json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()
    else:
        canonical = body
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path.split("?", 1)[0].encode(), canonical):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:32]


def cassette_path(folder: Path, name: str) -> Path:
    """The cassette `name` (a relative path of safe parts) below `folder`."""
    parts = [part for part in name.split("/") if part not in ("", ".", "..")]
    return folder.joinpath(*parts).with_suffix(".jsonl")


@dataclass(frozen=True)
class Recorded:
    """One kept answer."""

    status: int
    content_type: str
    body: bytes


class Cassette:
    """One episode's cassette: appended to while recording, read once to replay."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._answers: dict[str, list[Recorded]] = {}
        self._served: dict[str, int] = {}
        self._kept: dict[str, int] = {}

    @classmethod
    def read(cls, path: Path) -> Cassette:
        """The cassette at `path` (none kept there: an empty one, every call a miss)."""
        cassette = cls(path)
        try:
            lines = path.read_bytes().splitlines()
        except OSError:
            return cassette
        for line in lines:
            entry = load_json(line).value
            if not isinstance(entry, dict):
                continue
            try:
                recorded = Recorded(
                    status=int(entry["status"]),
                    content_type=str(entry.get("content_type", "application/json")),
                    body=base64.b64decode(entry["body"]),
                )
                cassette._answers.setdefault(str(entry["key"]), []).append(recorded)
            except (KeyError, TypeError, ValueError):
                continue
        return cassette

    def answer(self, key: str) -> Recorded | None:
        """The answer to the next call of `key`, or None when none was kept."""
        answers = self._answers.get(key)
        if not answers:
            return None
        served = self._served.get(key, 0)
        self._served[key] = served + 1
        return answers[min(served, len(answers) - 1)]

    def keep(self, key: str, method: str, path: str, answer: Recorded) -> None:
        """Append one call's answer (a line written whole, then flushed to the disk)."""
        place = self._kept.get(key, 0)
        self._kept[key] = place + 1
        entry: dict[str, Any] = {
            "key": key,
            "call": place,
            "request": f"{method} {path}",
            "status": answer.status,
            "content_type": answer.content_type,
            "body": base64.b64encode(answer.body).decode("ascii"),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(entry) + "\n").encode()
        with open(self.path, "ab") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
