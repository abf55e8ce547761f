"""An episode's images and sandboxes: where they go (a place on one engine of several),
how they are made (the task's build, a Compose project's services, the verifier's image,
the harness's install) and how a sandbox is started from them."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from pytest_harbor.display import harbor_logger
from pytest_harbor.engine.context import EpisodeContext
from pytest_harbor.engine.failures import EpisodeError, FailureKind, start_failure
from pytest_harbor.engine.processes import SURVEY_SCRIPT, SandboxSurvey, survey
from pytest_harbor.engine.recovery import came_back
from pytest_harbor.engine.users import named_users
from pytest_harbor.engine.verification import SANDBOX_DIRECTORIES
from pytest_harbor.harnesses.base import AgentFailure, AgentSetupError, PreparesImage
from pytest_harbor.sandboxes.base import (
    ImageConfig,
    ImageSource,
    Placement,
    PlacesEpisodes,
    Sandbox,
    SandboxError,
    SandboxGroup,
    SandboxProvider,
    SandboxSpec,
    SandboxStartError,
)
from pytest_harbor.sandboxes.compose.tasks import compose_spec
from pytest_harbor.tasks.config import EnvironmentConfig
from pytest_harbor.tasks.errors import TaskLoadError
from pytest_harbor.threads import join

if TYPE_CHECKING:
    from pytest_harbor.sandboxes.compose.project import ComposeSpec

__all__ = ["SandboxLauncher", "stop_within"]

log = harbor_logger()


class SandboxLauncher:
    """Makes an episode's images and starts its sandboxes.

    On a provider of several places (PlacesEpisodes) the launcher takes a place first and
    makes everything there; `release()` gives it back. `provider` is the one everything
    of the episode goes through. Image timings go to `clock.phases` (`build_s`,
    `agent_install_s`, `start_s`).

    With `routes_model`, the model relay's route goes into the agent's sandbox in every
    agent phase: a sandbox whose agent has no network in some phase starts behind an
    egress, the route's only way out then.
    """

    def __init__(
        self, context: EpisodeContext, provider: SandboxProvider, *, routes_model: bool = False
    ) -> None:
        self._context = context
        self._routes_model = routes_model
        #: The agent's sandbox was started behind an egress (`filtered`).
        self.filtered = False
        self.task = context.task
        self.settings = context.settings
        self.provider = provider
        self._home = provider
        self._placement: Placement | None = None
        #: The agent's image, once made.
        self.image: str | None = None
        self.verifier_image: str | None = None
        #: The harness could not make its image (prepare_image): every turn fails so.
        self.setup_failure: AgentFailure | None = None
        #: A Compose task's images built for services other than main.
        self._built: dict[str, str] = {}

    # ---------------------------------------------------------------------- images

    def prepare(self, place: bool = True) -> str:
        """Make every image the episode needs (once); return the agent's. With `place`,
        take a place on an engine first. Raises EpisodeError when one cannot be made."""
        if self.image is not None:
            return self.image
        if place:
            self._place()
        started = time.monotonic()
        try:
            image = self._task_images()
            if self._context.separate_verifier:
                self.verifier_image = self.provider.prepare_image(self._verifier_source())
        except SandboxStartError as error:
            raise start_failure(error) from None
        self._context.clock.took("build_s", started)
        started = time.monotonic()
        self.setup_failure = None
        harness = self._context.harness
        try:
            self.image = (
                harness.prepare_image(image, self.provider, self._context.image_labels)
                if isinstance(harness, PreparesImage)
                else image
            )
        except AgentSetupError as error:
            # The agent's turn fails (agent_outcome_policy decides); the sandbox is the
            # task's own, so that a verification has something to grade.
            self.setup_failure = AgentFailure(
                cause=error.cause, message=self._context.redactor.text(str(error))
            )
            self.image = image
        if self.image != image or self.setup_failure is not None:
            self._context.clock.took("agent_install_s", started)
        return self.image

    def forget_failed_install(self) -> None:
        """A retry tries the harness's install again when it failed."""
        if self.setup_failure is not None:
            self.image = None

    def image_config(self, image: str | None = None) -> ImageConfig:
        """What `image` (by default the agent's) declares."""
        return self.provider.image_config(image or self.image or "")

    def image_workdir(self) -> str:
        return self.image_config().workdir or "/"

    @property
    def compose(self) -> ComposeSpec | None:
        try:
            return compose_spec(self.task, self.settings)
        except TaskLoadError as error:
            raise EpisodeError(FailureKind.TASK_REFUSED, str(error)) from None

    def _task_images(self) -> str:
        """The main image; for a Compose task also every service's (built once per
        content hash, pulled when missing), kept for the start."""
        spec = self.compose
        environment = self.task.config.environment
        if spec is None:
            return self.provider.prepare_image(self._image_source(environment))
        built = {
            service: self.provider.prepare_image(
                ImageSource(
                    docker_image=None,
                    context_dir=build.context,
                    build_timeout_sec=environment.build_timeout_sec,
                    labels=self._context.image_labels,
                    build=build.options,
                )
            )
            for service, build in spec.builds.items()
        }
        for image in spec.images().values():
            self.provider.prepare_image(
                ImageSource(
                    docker_image=image,
                    context_dir=None,
                    build_timeout_sec=environment.build_timeout_sec,
                    pull_retries=self.settings.image_pull_retries,
                )
            )
        self._built = {service: tag for service, tag in built.items() if service != "main"}
        return built.get("main") or spec.images()["main"]

    def _image_source(self, environment: EnvironmentConfig) -> ImageSource:
        dockerfile = self.task.dockerfile
        return ImageSource(
            docker_image=environment.docker_image,
            context_dir=None if dockerfile is None else dockerfile.parent,
            build_timeout_sec=environment.build_timeout_sec,
            labels=self._context.image_labels,
            pull_retries=self.settings.image_pull_retries,
        )

    def _verifier_source(self) -> ImageSource:
        environment = self.task.config.verifier.environment
        tests_dockerfile = self.task.verifier_dockerfile
        if environment is not None and environment.docker_image is not None:
            return ImageSource(
                docker_image=environment.docker_image,
                context_dir=None,
                build_timeout_sec=environment.build_timeout_sec,
                labels=self._context.image_labels,
                pull_retries=self.settings.image_pull_retries,
            )
        if tests_dockerfile is not None:
            return ImageSource(
                docker_image=None,
                context_dir=tests_dockerfile.parent,
                build_timeout_sec=(environment or self.task.config.environment).build_timeout_sec,
                labels=self._context.image_labels,
            )
        return self._image_source(self.task.config.environment)

    # ---------------------------------------------------------------------- places

    def _place(self) -> None:
        """On a provider of several engines, take a place on one with room (it may wait
        for one) and make everything of the episode there."""
        if not isinstance(self._home, PlacesEpisodes) or self._placement is not None:
            return
        try:
            self._placement = self._home.place()
        except SandboxStartError as error:
            raise start_failure(error) from None
        self.provider = self._placement.provider

    def release(self) -> None:
        """Give the place back (when one was taken); idempotent."""
        placement, self._placement = self._placement, None
        if placement is not None:
            placement.release()

    # ---------------------------------------------------------------------- sandboxes

    def start(
        self,
        image: str,
        environment: EnvironmentConfig,
        *,
        record: bool = True,
        network: bool | None = None,
        group: SandboxGroup | None = None,
        survey_users: set[str] | None = None,
        filtered: bool = False,
        allowed_hosts: tuple[str, ...] | None = None,
    ) -> Sandbox:
        """A sandbox from `image` with `environment`'s settings; `network` (else the
        environment's mode) says whether it has the network from its start. With
        `survey_users`, the sandbox surveys itself as it starts (processes.survey)."""
        override = self.settings.sandbox_resources_override
        cpus, memory = environment.cpus, environment.memory_mb
        if override is not None:
            cpus = override.cpu if override.cpu is not None else cpus
            memory = override.memory_mib if override.memory_mib is not None else memory
        # A leaked sandbox ends itself once the episode and its cleanup are long over.
        ttl = (
            self._context.budget.deadline_s
            + self.settings.cleanup_timeout_seconds
            + self.settings.sandbox_ttl_slack_s
        )
        started = time.monotonic()
        spec = SandboxSpec(
            image=image,
            workdir=environment.workdir,
            env=environment.env,
            cpus=cpus,
            memory_mb=memory,
            network=network if network is not None else environment.network_mode != "no-network",
            labels=self._context.labels,
            directories=SANDBOX_DIRECTORIES,
            start_script=None if survey_users is None else SURVEY_SCRIPT,
            start_arguments=() if survey_users is None else tuple(sorted(survey_users)),
            ttl_s=ttl,
            ready_timeout_s=self.settings.sandbox_ready_timeout_s,
            group=group,
            pids_limit=self.settings.sandbox_pids_limit,
            gpus=environment.gpus or None,
            filtered=filtered,
            allowed_hosts=allowed_hosts,
            gpu_type=environment.gpu_types[0]
            if self.settings.request_gpu_type and environment.gpus and environment.gpu_types
            else None,
        )
        failed: SandboxStartError | None = None
        try:
            sandbox = self.provider.start(spec)
        except SandboxStartError as error:
            failed = error
        if failed is not None:
            # Out of the handler: a run stopped for a silent engine says that alone.
            if not came_back(self.provider, failed, self.settings.engine_recovery_timeout_s):
                raise failed
            sandbox = self.provider.start(spec)
        if record:
            self._context.clock.took("start_s", started)
        return sandbox

    def start_agent_sandbox(self) -> Sandbox:
        """The agent's sandbox: with the network when any phase of any turn has it, and
        without it through the seed when the environment says `no-network`."""
        assert self.image is not None
        environment = self.task.config.environment
        online = environment.network_mode != "no-network"
        needed = online or any(t.agent_network or t.verifier_network for t in self.task.turns)
        # Surveyed as it starts when nothing else starts in it at the seed.
        users = self.named_users() if self.nothing_starts_at_seed else None
        spec = self.compose
        group = (
            None
            if spec is None
            else SandboxGroup(config=spec.config, built=self._built, episode=self._context.id)
        )
        offline_agent = any(not turn.agent_network for turn in self.task.turns)
        self.filtered = self.task.filtered or (self._routes_model and offline_agent)
        if self.filtered:
            # Behind its egress from the start, in the environment's own policy (a
            # Compose project's every phase, checked at planning).
            hosts = tuple(environment.allowed_hosts or ()) if online else None
            return self.start(
                self.image,
                environment,
                network=online,
                group=group,
                survey_users=users,
                filtered=True,
                allowed_hosts=hosts if environment.network_mode == "allowlist" else None,
            )
        if group is not None:
            # One network for every phase (checked at planning).
            return self.start(
                self.image, environment, network=needed, group=group, survey_users=users
            )
        sandbox = self.start(self.image, environment, network=needed, survey_users=users)
        if needed and not online:
            sandbox.set_network(False)
        return sandbox

    def named_users(self) -> set[str]:
        """The users the survey reads as numbers (engine/users.py)."""
        return named_users(self.task, self.image_config().user)

    def survey(self, sandbox: Sandbox) -> SandboxSurvey:
        """The agent's sandbox as the seed leaves it (processes.survey): taken as it
        started when nothing starts in it at the seed."""
        return survey(sandbox, self.named_users(), at_start=self.nothing_starts_at_seed)

    @property
    def nothing_starts_at_seed(self) -> bool:
        """The seed adds no process to the started sandbox (no ENTRYPOINT, no healthcheck):
        a survey right after the start is as good as one at the end of the seed."""
        return (
            not self.image_config().entrypoint and self.task.config.environment.healthcheck is None
        )

    def stop(self, sandbox: Sandbox) -> None:
        stop_within(sandbox, self.settings.cleanup_timeout_seconds)


def stop_within(sandbox: Sandbox, seconds: float) -> None:
    """Remove `sandbox`, waiting at most `seconds`: a removal that takes longer is left to
    the end-of-run sweep (logged)."""

    def stop() -> None:
        try:
            sandbox.stop()
        except SandboxError as error:
            # Its engine went away, say: the end-of-run sweep tries again.
            log.warning("sandbox %s was not removed: %s", sandbox.id[:12], error)

    stopper = threading.Thread(target=stop, name="harbor-stop", daemon=True)
    stopper.start()
    join(stopper, seconds)
    if stopper.is_alive():
        log.warning(
            "sandbox %s was not removed within cleanup_timeout_seconds = %g s; the run "
            "removes it when it ends",
            sandbox.id[:12],
            seconds,
        )
