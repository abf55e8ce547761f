"""What the engine does about MCP before each agent turn: it writes the task description
file, and under `task_mcp_grants = required` it makes sure every granted server answers
from inside the sandbox, whatever the harness (an in-sandbox agent's own connections
cannot be watched from here)."""

from __future__ import annotations

import posixpath

from pytest_harbor.display import harbor_logger
from pytest_harbor.harnesses.mcp.access import TASK_FILE, McpAccess
from pytest_harbor.redaction import Redactor
from pytest_harbor.sandboxes.base import TRUSTED_BUSYBOX, Sandbox, SandboxError
from pytest_harbor.sandboxes.pipes import OpensPipes
from pytest_harbor.tasks import Task, Turn

__all__ = ["describe_task", "unreachable_servers"]

log = harbor_logger()

#: The longest the check of the required servers waits for them.
CHECK_S = 30.0


def describe_task(
    sandbox: Sandbox, access: McpAccess, task: Task, turn: Turn, user: str | None
) -> None:
    """Write the task description file (for a task with MCP servers), as the turn's agent
    user: a link an earlier turn planted leads only where that user could write anyway."""
    if not task.config.environment.mcp_servers:
        return
    folder = posixpath.dirname(TASK_FILE)
    script = (
        f"{TRUSTED_BUSYBOX} mkdir -p {folder} && {TRUSTED_BUSYBOX} cat > {TASK_FILE}.new "
        f"&& {TRUSTED_BUSYBOX} mv -f {TASK_FILE}.new {TASK_FILE}"
    )
    try:
        done = sandbox.exec(
            [TRUSTED_BUSYBOX, "sh", "-c", script],
            user=user,
            stdin=access.task_file(task, turn),
            timeout=30,
        )
    except SandboxError as error:
        log.warning("%s: the task description file was not written: %s", task.id, error)
        return
    if done.exit_code != 0:
        log.warning(
            "%s: the task description file was not written: %s", task.id, done.stderr.strip()
        )


def unreachable_servers(
    sandbox: Sandbox,
    access: McpAccess,
    *,
    user: str | None,
    workdir: str | None,
    redactor: Redactor,
) -> str | None:
    """Under `required`: why a granted server cannot be used from the sandbox (a header's
    variable set nowhere, no answer to MCP's handshake and tool listing), else None."""
    if not access.required:
        return None
    if access.problems:
        return "; ".join(access.problems)
    if not access.granted:
        return None
    if not isinstance(sandbox, OpensPipes):
        return "this sandbox's provider cannot relay MCP connections from inside it"
    from pytest_harbor.harnesses.mcp.client import McpTools

    tools = McpTools(
        access, lambda command: sandbox.open_pipe(command, user=user, workdir=workdir), redactor
    )
    try:
        tools.connect(CHECK_S)
    finally:
        tools.close()
    if not tools.failures:
        return None
    return "required MCP servers cannot be used: " + "; ".join(
        f"{name}: {why}" for name, why in sorted(tools.failures.items())
    )
