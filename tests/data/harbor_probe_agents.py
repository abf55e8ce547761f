"""Harbor agents that misbehave, for the tests of Harbor's agents on pytest-harbor's
sandboxes (imported by path: `harbor:harbor_probe_agents:Raises`). Each does what an agent
of Harbor's may do; the engine must grade them as it grades any harness."""

from __future__ import annotations

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext


class _Probe(BaseAgent):
    @staticmethod
    def name() -> str:
        return "probe"

    def version(self) -> str:
        return "1.0.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        pass


class Raises(_Probe):
    """Solves the task, then raises."""

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        await environment.exec("echo 1 > /tmp/answer")
        context.n_input_tokens = 7
        raise RuntimeError("the probe agent broke down")


class Hangs(_Probe):
    """Solves the task, then runs a command that never ends, with no timeout of its own."""

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        await environment.exec("echo 1 > /tmp/answer")
        await environment.exec("sleep 3600")


class LeavesProcesses(_Probe):
    """Solves the task and leaves processes behind that would spoil the answer later."""

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        await environment.exec(
            "echo 1 > /tmp/answer; "
            "(setsid sh -c 'sleep 3; echo 0 > /tmp/answer; sleep 1000' > /dev/null 2>&1 &)"
        )


class Uploads(_Probe):
    """Moves files both ways through the environment's file calls."""

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        notes = self.logs_dir / "notes"
        notes.mkdir(parents=True, exist_ok=True)
        (notes / "a.txt").write_text("from the host\n")
        (notes / "deep").mkdir(exist_ok=True)
        (notes / "deep" / "b.txt").write_text("1\n")
        await environment.upload_dir(notes, "/tmp/uploaded")
        await environment.upload_file(notes / "a.txt", "/tmp/single/a.txt")
        await environment.exec("cp /tmp/uploaded/deep/b.txt /tmp/answer")
        await environment.download_file("/tmp/answer", self.logs_dir / "answer-copy.txt")
        await environment.download_dir("/tmp/uploaded", self.logs_dir / "round-trip")


class CountsSessions(_Probe):
    """Notes each set-up and each run in the sandbox, as Harbor's multi-step trials call
    them: set up once, then `run()` once per step."""

    async def setup(self, environment: BaseEnvironment) -> None:
        await environment.exec("echo setup >> /tmp/calls")

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        await environment.exec(f"echo 'run {instruction.strip()}' >> /tmp/calls")


class LeaksAndForges(_Probe):
    """Solves nothing; writes the model's key (it is in the agent's environment) into its
    logs, its trajectory and the sandbox, writes a reward of 1 where the verifier puts its
    own, and asks the environment to stop and remove the sandbox."""

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        key = self._extra_env["OPENAI_API_KEY"]
        (self.logs_dir / "leak.txt").write_text(f"key={key}\n")
        (self.logs_dir / "trajectory.json").write_text(
            '{"schema_version": "ATIF-v1.7", "agent": {"name": "probe", "version": "1"}, '
            f'"steps": [{{"step_id": 1, "source": "agent", "message": "{key}"}}]}}'
        )
        await environment.exec(
            f"mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
            f"echo {key} > /logs/agent/leak.txt"
        )
        await environment.stop(delete=True)
