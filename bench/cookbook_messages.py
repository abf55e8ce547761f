"""A scripted Anthropic Messages API for the simulated-user recipe of Harbor's cookbook
(bench/cookbook_recipes.py): its `user-server` asks Anthropic for the persona's answers,
which cannot be reached here, so this answers `POST /v1/messages` instead, from a container
of the recipe's own Compose project.

Stand-alone (standard library only): it runs in a container, not beside the tests. It
checks the key (`x-api-key`, or `Authorization: Bearer`, which newer SDKs send) against
its own `ANTHROPIC_API_KEY`, refuses a request whose
system prompt does not carry the persona, and answers the latest question by its topic, as
the recipe's persona would: how the script takes its input, what the JSON looks like, or
that there is nothing more. Each request is logged on stdout (the container's log).

    python3 cookbook_messages.py [PORT]
"""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: What the recipe's persona file says first; a system prompt without it did not come
#: from the recipe's server.
PERSONA_MARK = "converts CSV data to JSON"

#: (words of a question, the persona's answer), the first whose word the question holds.
ANSWERS = [
    (
        ("input", "read", "stdin", "file", "where"),
        "It should read the CSV from stdin and write the JSON to stdout.",
    ),
    (
        ("json", "shape", "format", "look", "structure", "output"),
        "A JSON array of objects: one object per row, with the column headers as keys.",
    ),
]
LAST_ANSWER = "That's it, keep it simple: no flags or options. Sounds good, go ahead."


def question_of(body: dict[str, Any]) -> str:
    """The text of the latest user message."""
    content = (body.get("messages") or [{}])[-1].get("content", "")
    if isinstance(content, list):
        return " ".join(str(block.get("text", "")) for block in content if isinstance(block, dict))
    return str(content)


def system_of(body: dict[str, Any]) -> str:
    system = body.get("system", "")
    if isinstance(system, list):
        return " ".join(str(block.get("text", "")) for block in system if isinstance(block, dict))
    return str(system)


def answer_to(question: str) -> str:
    words = question.lower()
    for topic, reply in ANSWERS:
        if any(word in words for word in topic):
            return reply
    return LAST_ANSWER


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _error(self, status: int, kind: str, message: str) -> None:
        print(f"refused ({status}): {message}", flush=True)
        self._send(status, {"type": "error", "error": {"type": kind, "message": message}})

    def do_GET(self) -> None:
        self._error(404, "not_found_error", f"no route {self.path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path.split("?")[0].rstrip("/") != "/v1/messages":
            self._error(404, "not_found_error", f"no route {self.path}")
            return
        key = os.environ.get("ANTHROPIC_API_KEY")
        given = {
            self.headers.get("x-api-key"),
            self.headers.get("Authorization", "").removeprefix("Bearer "),
        }
        if not key or key not in given:
            self._error(401, "authentication_error", "invalid x-api-key")
            return
        if PERSONA_MARK not in system_of(body):
            self._error(400, "invalid_request_error", "the system prompt holds no persona")
            return
        question = question_of(body)
        reply = answer_to(question)
        print(f"asked {question!r}: answered {reply!r}", flush=True)
        self._send(
            200,
            {
                "id": f"msg_{time.monotonic_ns()}",
                "type": "message",
                "role": "assistant",
                "model": str(body.get("model") or "scripted-persona"),
                "content": [{"type": "text", "text": reply}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 100, "output_tokens": 20},
            },
        )


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    # In its own container, on the recipe's project network: the sidecar reaches it by name.
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.daemon_threads = True
    print(f"scripted Messages API on port {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
