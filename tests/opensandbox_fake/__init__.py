"""A fake OpenSandbox server for tests: a real HTTP server on 127.0.0.1 that speaks the
lifecycle API (at /v1 and at the root) and, behind its proxy path, the API of the
in-sandbox daemon execd, backed by the real Docker engine.

It copies the real server's Docker runtime and execd, quirks included (the behaviour
digest, /tmp/osb/DIGEST.md, gives the evidence): creation is synchronous, deleted and
expired sandboxes are gone, command output comes as bare JSON lines split on newlines,
exit codes only through `error.evalue`. What it does not do (snapshots, volumes,
platforms) it refuses with the real server's kind of error; routes it does not have
(metadata patches, /code, /session, file search and moves) answer 404. Terminal
sessions (/pty) run in pipe mode only, over a WebSocket (pty.py, websocket.py). Egress
policies are refused unless it is made with an `egress_mode` (as a server with an egress
image): then egress.py serves the sidecar's API and enforces its policy. On purpose, it
stalls and cuts what faults.py says, and refuses creates past `max_creating`."""

from tests.opensandbox_fake.server import FakeOpenSandbox

__all__ = ["FakeOpenSandbox"]
