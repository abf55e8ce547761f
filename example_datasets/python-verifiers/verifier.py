"""The dataset's grader for each task without tests/ of its own."""


def verify(workspace, task_data, state):
    """1.0 when the task's file holds the number it expects. `task_data` comes typed by
    task_data.py: "42" in task_data.json arrives as the number 42."""
    assert state["workspace"] == workspace
    path = workspace / task_data["file"]
    try:
        found = int(path.read_text().strip())
    except (OSError, ValueError):
        return 0.0
    return 1.0 if found == task_data["expected"] else 0.0
