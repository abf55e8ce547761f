import asyncio

from harbor_verifiers import fraction, run


async def verify(workspace, task_data):
    """Two checks, run at once: the script exists and is executable, and it prints the
    greeting; the reward is the share that hold."""
    script = workspace / "hello.sh"
    ran = await asyncio.get_running_loop().run_in_executor(None, run, [str(script)])
    checks = {
        "executable": script.is_file() and ran.returncode is not None,
        "greets": ran.stdout.strip() == task_data["greeting"],
    }
    return {"reward": fraction(checks.values()), **{k: float(v) for k, v in checks.items()}}
