"""Per-trial (and shared) compose stacks: guards → config → up the seeded services → seeds → up the rest.

Seeds go in before their dependents start: the reset services and their ``depends_on`` closure come up
first (``up --wait``), the recipes run, then everything else comes up. No dependent ever observes an
unseeded database, so a seed may hold schema as well as data.

Any failure — a ``ProvisionError``, a bug, Ctrl-C — first captures every declared service's log tail to
``<trial_dir>/services/<svc>.log`` and runs ``down --volumes --remove-orphans``, then propagates: a failed
provision leaves no container, network or volume behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forgelib.docker import labels as lab
from forgelib.docker import readiness
from forgelib.docker.builds import Builds, build_services
from forgelib.docker.compose import (
    ComposeFacts,
    ComposeProject,
    ImageProcess,
    labels_override,
    project_name,
    write_override,
)
from forgelib.docker.configmemo import ConfigMemo
from forgelib.docker.images import ImageFacts
from forgelib.docker.readiness import NotReady
from forgelib.docker.resolved import ResolvedConfig, ServiceConfig
from forgelib.errors import (
    CommandError,
    CommandTimeout,
    ForgeError,
    Interrupted,
    ProvisionError,
    RecipeError,
)
from forgelib.kinds import registry as kinds
from forgelib.kinds.base import ApplyContext, Memo, PreparedSeed, Recipe, SeedMount, SeedTarget
from forgelib.runner import Runner
from forgelib.spec.digest import seed_digest
from forgelib.spec.models import LOG_TAIL_LINES, EnvironmentManifest, Project, Seed, Task, Timeouts
from forgelib.spec.rules import service_config as written_service
from forgelib.stacks.live import StopAwareRunner
from forgelib.stacks.snapshots.trial import GoldenFailed, Plan, TrialGoldens
from forgelib.stacks.stack import Stack

log = logging.getLogger("forgelib.stacks.provision")

SETUP_TAIL = "setup"  # the compose project name's and trial label's last part of a task's setup stack
DEFAULT_TASK = "default"  # the trial label's task part when the project's own environment is provisioned
OVERRIDE_FILE = "compose.forge.yaml"
LOG_THREADS = 4  # services whose logs are captured at once
SERVICES_DIR = "services"

# What `up --wait` prints when containers started but did not get ready (vs. could not be created at all).
_NOT_READY = re.compile(r"unhealthy|exited \(\d+\)|timeout|timed out", re.IGNORECASE)

# Docker's words when every default address pool is taken (20.10 / 23+); each compose project's network
# takes one subnet, so leftovers or many parallel trials exhaust the ~30 default pools.
_POOL_EXHAUSTED = re.compile(
    r"could not find an available, non-overlapping IPv4 address pool|all predefined address pools have been "
    r"fully subnetted",
    re.IGNORECASE,
)
NO_ADDRESS_POOL = (
    "Docker has no free network address pool left for this trial's network (every compose project takes "
    "one subnet from the daemon's default-address-pools, about 30 by default). Fix: remove leftovers "
    "(`forge reap`; `docker network ls` shows what holds the pools), run fewer trials at once (--workers), "
    "or give dockerd more, smaller pools in /etc/docker/daemon.json, e.g. "
    '{"default-address-pools": [{"base": "10.200.0.0/17", "size": 24}]}, and restart dockerd'
)

PhaseCallback = Callable[[str, float], None]  # (phase name, seconds), called as each phase ends


def out_of_networks(e: BaseException) -> bool:
    """Whether provisioning failed because Docker had no address pool left for the stack's network: a limit
    on how many stacks the engine holds at once (the run waits for one of its own to come down), not a
    fault of the trial."""
    return isinstance(e, ProvisionError) and e.reason.startswith(NO_ADDRESS_POOL)


@dataclass
class ProvisionCache:
    """What a backend learns once and every trial it provisions reuses: the engine's images (stand-ins
    present, declared VOLUMEs) and values derived from seed versions. Owned by the backend (one run, one
    ``forge provision``), so nothing is module-global and nothing needs resetting between runs or tests."""

    images: ImageFacts = field(default_factory=ImageFacts)
    seeds: Memo = field(default_factory=Memo)
    builds: Builds = field(default_factory=Builds)  # images of build: services, once per run
    configs: ConfigMemo = field(default_factory=ConfigMemo)  # `compose config`, once per environment
    compose: ComposeFacts = field(default_factory=ComposeFacts)  # what the plugin can do, asked once
    # image ref -> its ID when a golden plan last looked (``TrialGoldens.seen``: a guess, checked each time)
    golden_images: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------- public API


@dataclass(frozen=True)
class StackContext:
    """What every stack one owner provisions shares: a run's backend, ``forge provision``, a pytest
    process, an inspect task. Per run, never per trial (``TrialSpec`` is the trial's part)."""

    project: Project
    timeouts: Timeouts
    runner: Runner
    cache: ProvisionCache = field(default_factory=ProvisionCache)  # the owner's, one for all its stacks
    log_tail_lines: int = LOG_TAIL_LINES
    profiles: tuple[str, ...] = ()  # the compose profiles enabled (the run config's `profiles`)
    goldens: bool = False  # a trial's reset services of kinds with goldens start from their golden
    kept: bool = False  # `forge provision --keep`: the stack outlives its owner on purpose (labelled so)
    work_dir: Path | None = None  # a temp dir made for the stack alone (`forge provision`'s), on its labels


@dataclass(frozen=True)
class TrialSpec:
    """Which trial a stack is for (``run.execute.TrialRequest``'s keywords plus the task)."""

    task: Task | None  # None: the project's default environment
    run_id: str
    trial_index: int
    trial_dir: Path
    on_phase: PhaseCallback | None = None  # (phase, seconds) as each provisioning phase ends
    attempt: int = 1  # > 1: a retry, on its own compose project (never what a failed teardown left)
    checkpoint: str | None = None  # a fork of this checkpoint (``stacks.checkpoints.CheckpointSteps``)
    setup: bool = False  # the task's setup stack (``run.setup``), not one of its trials

    def environment(self, project: Project) -> EnvironmentManifest:
        return self.task.environment if self.task is not None else project.environment

    def stack(self, ctx: StackContext) -> StackPlan:
        """This trial's own stack: its compose project name and labels."""
        task = self.task.name if self.task is not None else DEFAULT_TASK
        tail = SETUP_TAIL if self.setup else ""
        trial = f"{task}.{SETUP_TAIL}" if self.setup else lab.trial_label(task, self.trial_index)
        return StackPlan(
            self.environment(ctx.project),
            project_name(ctx.project.name, self.run_id, task, self.trial_index, self.attempt, tail=tail),
            lab.run_labels(self.run_id, trial, kept=ctx.kept, work_dir=ctx.work_dir),
            self.trial_dir,
        )


@dataclass(frozen=True)
class StackPlan:
    """One stack to bring up: ``env`` as the compose project ``name`` carrying ``labels``, its files
    (override, logs) in ``trial_dir``; ``shared``: a run's shared stack (``teardown_trial`` leaves it)."""

    env: EnvironmentManifest
    name: str
    labels: Mapping[str, str]
    trial_dir: Path
    shared: bool = False


def provision_trial(ctx: StackContext, trial: TrialSpec) -> Stack:
    """``trial``'s own stack: fresh, or with ``ctx.goldens`` its reset services from their goldens
    (``forgelib.stacks.snapshots``; the first trial of a key captures it).

    Raises ``ProvisionError(stage, reason)`` only after the logs were captured and the stack torn down.
    Which stack a trial gets at all (its own, a run's shared one, a warm one) is ``forgelib.stacks``'s
    decision; this is the fresh source."""
    spec = trial.stack(ctx)
    steps: FreshSteps = FreshSteps()
    if ctx.goldens:
        stopping = _stopping(ctx.runner)
        goldens = TrialGoldens(
            ctx.runner, ctx.timeouts, trial.run_id, ctx.project.name, stopping, seen=ctx.cache.golden_images
        )
        steps = GoldenSteps(goldens)
    return provision_stack(ctx, spec, steps, on_phase=trial.on_phase)


def provision_stack(
    ctx: StackContext,
    spec: StackPlan,
    steps: FreshSteps | None = None,
    *,
    on_phase: PhaseCallback | None = None,
) -> Stack:
    """One stack of ``spec`` through the fresh pipeline; ``steps`` fill in its fixed points (None: none,
    ``WarmSteps``: every seed prepared for in-place resets, ``GoldenSteps``: from goldens). Fails as
    ``provision_trial``."""
    return _Provisioning(ctx, spec, steps or FreshSteps(), on_phase).run()


def capture_logs(trial: Stack, dest_dir: Path, tail_lines: int) -> None:
    """``<dest_dir>/<svc>.log`` for every declared service (a service that never started: an empty file)."""
    _capture(trial.compose, trial.environment, dest_dir, tail_lines)


def teardown_trial(trial: Stack, *, graceful: bool = True) -> float:
    """``down --volumes --remove-orphans``; the seconds it took. The run's shared stack stays up (0.0):
    ``teardown_run`` removes it once the run is over. ``graceful=False`` (a second Ctrl-C) kills the
    containers at once instead of waiting out their stop timeout."""
    if trial.shared:
        return 0.0
    t0 = time.monotonic()
    trial.compose.down(stop_timeout=None if graceful else 0)
    return time.monotonic() - t0


# ------------------------------------------------------------------------------------- per-trial stack


@dataclass
class _Provisioning:
    """One stack through the fresh pipeline: guards, config, images (builds; ``steps``' plan), the
    override, up the seeded services, recipes, up the rest. ``steps`` is called at fixed points."""

    ctx: StackContext
    spec: StackPlan
    steps: FreshSteps
    on_phase: PhaseCallback | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _compose: ComposeProject | None = None  # the stack as far as it got (clean-up needs all its files)
    _own_volumes: list[str] = field(default_factory=list)  # the override's ``per_container`` (Stack's)

    def run(self) -> Stack:
        t0 = time.monotonic()
        while True:
            try:
                trial = self._attempt()
            except GoldenFailed as e:
                # What the steps started from is at fault, not the trial: they say so (trial.yaml, an
                # event) and this trial is provisioned again the normal way for that service.
                self.steps.failed(e, self.spec.name)
                continue
            self.timings["provision"] = time.monotonic() - t0
            return dataclasses.replace(trial, timings=dict(self.timings), snapshots=self.steps.records())

    def _attempt(self) -> Stack:
        env = self.ctx.cache.images.env(self.ctx.runner)
        compose = self._compose = ComposeProject(
            self.spec.name,
            self.spec.env.compose_files,
            self.ctx.runner,
            self.ctx.timeouts,
            env,
            profiles=self.ctx.profiles,
        )
        with contextlib.ExitStack() as locks:  # golden key locks this trial holds while it captures
            try:
                return self._provision(compose, locks)
            except GoldenFailed:
                self._compose.down(check=True)
                raise
            except BaseException as e:  # ProvisionError, a bug, Ctrl-C: never leave a stack behind
                self._clean_up(self._compose, e)  # with every file: the overrides name our resources
                raise

    def _provision(self, compose: ComposeProject, locks: contextlib.ExitStack) -> Stack:
        bindings = self._bind()  # host-side guards: a broken binding or seed costs no container
        # Where services' images come from besides their compose file, each step in its own phase: the
        # run's builds, then the steps' plan (goldens: which services start from one). The override is
        # written once, in the last phase: every service on its final image (a golden's without its
        # image's VOLUMEs).
        with self._phase("compose_config", "compose_config"):
            config = self.ctx.cache.configs.config(compose)
            sources = [*self._builds(compose, config), *self.steps.images(bindings, locks)]
            if not sources:
                compose, services, declared, loopback = self._override(compose, config, bindings, {})
        images: dict[str, str] = {}
        for i, (phase, stage, source) in enumerate(sources):
            with self._phase(phase, stage):
                images.update(source(_imaged(config, images)))
                if i == len(sources) - 1:
                    compose, services, declared, loopback = self._override(compose, config, bindings, images)
        self._compose = compose
        absent = {n: s.image for n, s in services.items() if s.image not in declared}
        # A service restored from a golden holds its seeded state before it starts: it needs no recipe, so
        # it comes up with the rest (one `up` when nothing else needs a recipe) and only what does goes first.
        normal = [b for b in bindings if self.steps.needs_recipe(b.service)]
        # Started seeded, yet prepared before any dependent starts (a warm stack from a checkpoint).
        early = [b for b in bindings if b not in normal and self.steps.starts_first(b.service)]
        first = _closure([b.service for b in [*normal, *early]], services)

        def context(b: _Binding) -> ApplyContext:
            svc = services.get(b.service) or ServiceConfig(b.service)
            return _context(b, compose, svc, self.ctx.timeouts, self.ctx.cache.seeds)

        # A service that started seeded (golden, fork) is checked as soon as it is ready, beside the start
        # of the services after it, not once they are all up.
        unseeded = {b.service: b for b in bindings if b not in normal}

        def ready(service: str) -> None:
            if (b := unseeded.get(service)) is not None:
                self.steps.ready(b, context(b), self._phase)

        if first:
            with self._phase("up_seeded", None):
                self._up(compose, services, first, absent, create=True, on_ready=ready)
        contexts = []
        for b in normal:
            with self._phase(f"recipe:{b.service}", None):
                svc = services.get(b.service) or ServiceConfig(b.service)
                ctx = _apply(b, compose, svc, self.ctx.timeouts, self.ctx.cache.seeds)
                contexts.append(ctx)
            self.steps.applied(b, ctx, _restart(compose, b.service), self._phase)

        # Before any dependent starts (warm: the template/pristine copy is the seeded state alone).
        applied = [*zip(normal, contexts, strict=True), *((b, context(b)) for b in early)]
        prepared = self.steps.seeded(applied, self._phase)
        rest = [s for s in services if s not in first]
        if rest or not first:
            with self._phase("up_rest", None):
                # After the seeded phase, only the rest (created with the first): their dependencies in
                # `first` are up and ready.
                self._up(compose, services, rest, absent, create=not first, on_ready=ready)
        self.steps.started(bindings, context, self._phase)
        publishes = any(loopback.values()) or any(s.ports for s in services.values())
        ports = compose.published_ports() if publishes else {}
        return Stack(
            name=self.spec.name,
            environment=self.spec.env,
            compose=dataclasses.replace(compose, direct=True),  # the trial's execs: plain `docker exec`
            timings=dict(self.timings),
            bare_seeds=_seed_mounts(bindings),
            trial_dir=self.spec.trial_dir,
            labels=dict(self.spec.labels),
            shared=self.spec.shared,
            config=config,
            ports=ports,
            prepared=prepared,
            own_volumes=tuple(self._own_volumes),
            source={
                "mode": "shared" if self.spec.shared else "fresh",
                "name": self.spec.name,
                "reuse": 0,
                "replaced": None,
            },
        )

    def _builds(self, compose: ComposeProject, config: Mapping[str, Any]) -> list[_ImageStep]:
        """The run's images of ``build:`` services (the run's first trial builds; the others wait for it)."""
        if not build_services(config):
            return []
        timeout = self.ctx.timeouts.compose_up

        def build(services: Mapping[str, ServiceConfig]) -> Mapping[str, str]:
            return self.ctx.cache.builds.images(
                self.ctx.project.name, compose, config, self.spec.labels, self.spec.trial_dir, timeout
            )

        return [("build", "build", build)]

    def _override(
        self,
        compose: ComposeProject,
        config: Mapping[str, Any],
        bindings: Sequence[_Binding],
        built: Mapping[str, str],
    ) -> tuple[ComposeProject, dict[str, ServiceConfig], dict[str, tuple[str, ...]], dict[str, list[int]]]:
        """Write this trial's override; the compose project with it, the services (built ones naming the
        run's image), their images' declared VOLUMEs and the ports published for direct connections."""
        services = _imaged(config, built)
        images = [s.image for s in services.values()]
        configs = self.ctx.cache.images.configs(self.ctx.runner, images, self.ctx.timeouts.command)
        declared = {image: c.volumes for image, c in configs.items()}
        loopback = _loopback(bindings, config)
        seed_mounts = _seed_mounts(bindings)
        process = self.steps.processes(bindings, services, {i: c.process for i, c in configs.items()})
        self._own_volumes = self._per_container(services, declared)
        doc = labels_override(
            config, self.spec.labels, declared, loopback, built,
            mounts={m.service: [m.volume()] for m in seed_mounts.values()},
            environment={m.service: m.env() for m in seed_mounts.values()},
            quiet_health=not readiness.compose_wait(),
            process=process,
            per_container=self._own_volumes,
        )  # fmt: skip
        override = write_override(self.spec.trial_dir / OVERRIDE_FILE, doc)
        # from here on, the services' passwords never reach a log line or an error
        compose = compose.with_files(*self.spec.env.compose_files, override).with_secrets(config)
        return compose, services, declared, loopback

    def _per_container(
        self, services: Mapping[str, ServiceConfig], declared: Mapping[str, Sequence[str]]
    ) -> list[str]:
        """The ephemeral services whose image VOLUMEs are each container's own (``labels_override``): all of
        them when compose labels such volumes (asked only when one of them has one), else none."""
        eph = [s for s in self.spec.env.ephemeral(services) if declared.get(services[s].image)]
        if eph and self.ctx.cache.compose.volume_labels(self.ctx.runner, self.ctx.timeouts.command):
            return eph
        return []

    def _up(
        self,
        compose: ComposeProject,
        config_services: Mapping[str, ServiceConfig],
        services: Sequence[str],
        absent: Mapping[str, str],
        *,
        create: bool,
        on_ready: Callable[[str], None] | None = None,
    ) -> None:
        try:
            _up(compose, config_services, services, absent, create=create, on_ready=on_ready)
        except ProvisionError as e:
            self.steps.up_failed(compose, services, e)  # goldens: a restored service that did not start
            raise

    @contextmanager
    def _phase(self, phase: str, stage: str | None) -> Iterator[None]:
        """Time ``phase``; with ``stage``, a ForgeError inside becomes ``ProvisionError(stage, ...)``."""
        t0 = time.monotonic()
        try:
            yield
        except (ProvisionError, Interrupted):  # Ctrl-C is no stage's failure (trial.yaml would say so)
            raise
        except ForgeError as e:
            if stage is None:
                raise
            raise ProvisionError(stage, str(e)) from e
        finally:
            seconds = time.monotonic() - t0
            self.timings[phase] = seconds
            if self.on_phase is not None:
                self.on_phase(phase, seconds)

    def _bind(self) -> list[_Binding]:
        """Resolve every reset service's binding and run its recipe's host-side checks."""
        out = []
        for svc in self.spec.env.reset_services():
            if svc.reset is None or not svc.reset.seed:
                raise _recipe_error(svc.name, None, None, "isolation is reset but no reset.seed is bound")
            seed = self.ctx.project.seeds.get(svc.reset.seed)
            if seed is None:
                known = ", ".join(sorted(self.ctx.project.seeds)) or "(none)"
                raise _recipe_error(
                    svc.name, svc.reset.seed, None, f"no seed named {svc.reset.seed!r}; seeds: {known}"
                )
            # as written, its image interpolated (``${FORGE_IMAGE_X:-x}``): the kind is told by the image
            written = written_service(
                (self.spec.env.compose.get("services") or {}).get(svc.name) or {}, svc.name
            )
            recipe = kinds.recipe_for(seed.kind, written)
            if recipe is None:
                raise _recipe_error(svc.name, seed.name, seed.kind, f"no recipe for kind {seed.kind!r}")
            b = _Binding(svc.name, seed, recipe, dict(svc.reset.options))
            unknown = sorted(set(b.options) - recipe.OPTIONS)
            try:
                if unknown:
                    known = ", ".join(sorted(recipe.OPTIONS)) or "none"
                    raise b.target.fail("guard", f"unknown reset option(s) {unknown} (known: {known})")
                recipe.check(b.target)
            except RecipeError as e:
                raise _recipe_error(svc.name, seed.name, seed.kind, str(e)) from e
            out.append(b)
        return out

    def _clean_up(self, compose: ComposeProject, cause: BaseException) -> None:
        if isinstance(cause, ForgeError) and not isinstance(cause, Interrupted):
            write_failure_detail(self.spec.trial_dir / FAILURE_FILE, cause)
        try:
            _capture(compose, self.spec.env, self.spec.trial_dir / SERVICES_DIR, self.ctx.log_tail_lines)
            compose.down(check=True)
        except BaseException as e:  # a second Ctrl-C or a dead engine: report it, keep the first error
            log.warning("clean-up of %s after %r failed: %s", self.spec.name, cause, e)
            cause.add_note(f"forge: tearing down {self.spec.name} failed too: {e}")
            if not isinstance(e, Exception):
                raise


# ------------------------------------------------------------------------------ the pipeline's steps

PhaseTimer = Callable[[str, "str | None"], AbstractContextManager[None]]  # _Provisioning._phase
# (phase, stage, step): a step that names images some services run instead of their own, given the
# services as imaged so far (``_imaged``); timed as ``phase``, its ForgeError a ``ProvisionError(stage)``.
_ImageStep = tuple[str, str, Callable[[Mapping[str, ServiceConfig]], Mapping[str, str]]]
_Applied = Sequence[tuple["_Binding", ApplyContext]]  # each recipe that ran, with its context


class FreshSteps:
    """The fixed points of the fresh pipeline (``_Provisioning``), each a no-op here: a plain fresh
    stack, every reset service seeded by its recipe, nothing prepared. ``WarmSteps`` and ``GoldenSteps``
    fill some of them in; which one a stack gets is chosen once, by its source (``provision_trial``, the
    warm pool), never tested for inside the pipeline."""

    def images(self, bindings: Sequence[_Binding], locks: contextlib.ExitStack) -> list[_ImageStep]:
        """Steps naming the images services start from, after the builds (before the override)."""
        return []

    def needs_recipe(self, service: str) -> bool:
        """Whether ``service`` is seeded by its recipe (else it started seeded)."""
        return True

    def processes(
        self,
        bindings: Sequence[_Binding],
        services: Mapping[str, ServiceConfig],
        images: Mapping[str, ImageProcess],
    ) -> dict[str, Mapping[str, Any]]:
        """service -> what runs in it instead of its own process (the override's ``entrypoint`` and
        ``command``); ``images``: image -> its default process, for the images present locally. Each
        reset service's kind says (``Recipe.warm_process``), the same in every mode (fresh, warm, golden,
        fork), so that a trial sees the same process in a restored stack as in a fresh one: a postgres
        server runs under a loop that restarts it in place for the exact reset (``kinds.supervisor``)."""
        out: dict[str, Mapping[str, Any]] = {}
        for b in bindings:
            svc = services.get(b.service)
            if svc is not None and (p := b.recipe.warm_process(b.target, svc, images.get(svc.image))):
                out[b.service] = p
        return out

    def starts_first(self, service: str) -> bool:
        """Whether ``service``, which needs no recipe, still comes up with the seeded services and goes to
        ``seeded`` with them, before any dependent starts (a warm stack from a checkpoint)."""
        return False

    def applied(self, b: _Binding, ctx: ApplyContext, restart: Callable[[], None], phase: PhaseTimer) -> None:
        """Right after ``b``'s recipe applied its seed (``restart``: start the service again)."""

    def seeded(self, applied: _Applied, phase: PhaseTimer) -> tuple[PreparedSeed, ...]:
        """Every recipe ran, no dependent started yet: what the stack keeps for in-place resets. ``applied``:
        each seeded service (its recipe ran, or it ``starts_first``) with its context."""
        return ()

    def up_failed(self, compose: ComposeProject, services: Sequence[str], error: ProvisionError) -> None:
        """An ``up`` of ``services`` failed with ``error`` (re-raised after this; raise ``GoldenFailed``
        to blame what the steps started a service from)."""

    def ready(self, b: _Binding, ctx: ApplyContext, phase: PhaseTimer) -> None:
        """``b``'s service, which started seeded (``needs_recipe`` false), is ready; the services after it
        may be starting meanwhile. Called on a thread of ``readiness`` (with compose's ``up --wait``:
        never, and ``started`` is the first call after it)."""

    def started(
        self, bindings: Sequence[_Binding], context: Callable[[_Binding], ApplyContext], phase: PhaseTimer
    ) -> None:
        """Every service is up and ready."""

    def failed(self, error: GoldenFailed, name: str) -> None:
        """A ``GoldenFailed`` ended an attempt: make the next one go the normal way, or raise."""
        raise error

    def records(self) -> dict[str, dict[str, Any]]:
        """service -> what the steps did for it (``Stack.snapshots``, trial.yaml)."""
        return {}


class WarmSteps(FreshSteps):
    """A warm stack's (``forgelib.stacks.warm``): after every recipe's apply, before any dependent starts,
    each seed prepared for in-place resets (``recipe.prepare``) and its baseline fingerprint taken."""

    def seeded(self, applied: _Applied, phase: PhaseTimer) -> tuple[PreparedSeed, ...]:
        if not applied:
            return ()
        with phase("warm_prepare", None):
            return tuple(prepare_seed(b, ctx) for b, ctx in applied)


@dataclass
class GoldenSteps(FreshSteps):
    """A fresh stack from goldens (``forgelib.stacks.snapshots``): plan which reset services restore a golden
    and which capture one, run the restored ones on their golden's image (no recipe), capture after the
    recipe, verify after ``up``; a golden at fault is discarded and the trial provisioned again."""

    goldens: TrialGoldens
    plans: dict[str, Plan] = field(default_factory=dict)  # the current attempt's
    verified: set[str] = field(default_factory=set)  # the current attempt's services checked once ready

    def images(self, bindings: Sequence[_Binding], locks: contextlib.ExitStack) -> list[_ImageStep]:
        def plan(services: Mapping[str, ServiceConfig]) -> Mapping[str, str]:
            self.plans = self.goldens.plan(bindings, services, locks)
            self.verified = set()
            return self.goldens.images(self.plans)

        return [("golden_plan", "compose_config", plan)]

    def needs_recipe(self, service: str) -> bool:
        plan = self.plans.get(service)
        return plan is None or plan.golden is None

    def applied(self, b: _Binding, ctx: ApplyContext, restart: Callable[[], None], phase: PhaseTimer) -> None:
        plan = self.plans.get(b.service)
        if plan is not None and plan.capture:
            with phase(f"golden_capture:{b.service}", "reset_recipe"):
                self.goldens.capture(plan, b.recipe, ctx, b.seed, restart)
            # started again on new host ports: what talks to it next (a warm preparation) looks them up
            for key in [k for k in ctx.addresses if k[0] == b.service]:
                del ctx.addresses[key]

    def up_failed(self, compose: ComposeProject, services: Sequence[str], error: ProvisionError) -> None:
        self.goldens.check_started(compose, self.plans, services, error)

    def ready(self, b: _Binding, ctx: ApplyContext, phase: PhaseTimer) -> None:
        plan = self.plans.get(b.service)
        if plan is not None and plan.golden is not None:
            with phase(f"golden_verify:{b.service}", None):
                self.goldens.verify(plan, b.recipe, ctx)
            self.verified.add(b.service)

    def started(
        self, bindings: Sequence[_Binding], context: Callable[[_Binding], ApplyContext], phase: PhaseTimer
    ) -> None:
        for b in bindings:
            if b.service not in self.verified:
                self.ready(b, context(b), phase)

    def failed(self, error: GoldenFailed, name: str) -> None:
        # The golden is at fault, not the trial: discard it, say so (trial.yaml, an event); the next attempt
        # seeds that service from its seed.
        if self.goldens.stopping():  # a stop can make any service fail: never blame the golden for it
            raise Interrupted(f"stopped while provisioning {name}") from error
        self.goldens.discard(error.plan, error.reason)

    def records(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self.goldens.records.items()}


@dataclass
class GoldenWarmSteps(GoldenSteps):
    """A warm stack's first provisioning with goldens on: its reset services plan, restore, capture and
    verify as ``GoldenSteps`` (the same keys: a golden a fresh stack captured serves a warm one, and the
    other way round), then are prepared for in-place resets as ``WarmSteps`` (``recipe.prepare``, the
    baseline fingerprint). A restored service comes up first, with what it depends on and before any
    dependent (``starts_first``), and is verified before its preparation, so the pristine copy is of a
    state proven equal to the golden's, which is the seeded state: its resets put back what a warm stack
    seeded by its recipe would. A golden that fails is discarded and the stack provisioned again, seeding
    that service (``failed``)."""

    def starts_first(self, service: str) -> bool:
        plan = self.plans.get(service)
        return plan is not None and plan.golden is not None

    def seeded(self, applied: _Applied, phase: PhaseTimer) -> tuple[PreparedSeed, ...]:
        for b, ctx in applied:
            if b.service not in self.verified:  # not yet checked as it became ready (``ready``)
                self.ready(b, ctx, phase)
        return WarmSteps().seeded(applied, phase)

    def started(
        self, bindings: Sequence[_Binding], context: Callable[[_Binding], ApplyContext], phase: PhaseTimer
    ) -> None:
        """Nothing more: each restored service was verified before its preparation (``seeded``), and the
        pool checks every reset against the baseline taken then."""


def warm_steps(ctx: StackContext, run_id: str) -> FreshSteps:
    """A warm stack's provisioning steps (``forgelib.stacks.warm``): from goldens with ``ctx.goldens``
    (``GoldenWarmSteps``), else every reset service seeded by its recipe (``WarmSteps``)."""
    if not ctx.goldens:
        return WarmSteps()
    stopping = _stopping(ctx.runner)
    goldens = TrialGoldens(
        ctx.runner, ctx.timeouts, run_id, ctx.project.name, stopping, seen=ctx.cache.golden_images
    )
    return GoldenWarmSteps(goldens)


FAILURE_FILE = "provision-error.txt"


def _imaged(config: Mapping[str, Any], built: Mapping[str, str]) -> dict[str, ServiceConfig]:
    """The resolved config's services, each naming the image it runs: ``built``'s (a built or golden
    image) where it has one, else its own."""
    services = ResolvedConfig.of(config).services
    return {n: s.with_image(built[n]) if n in built else s for n, s in services.items()}


def write_failure_detail(path: Path, error: BaseException) -> None:
    """The whole failure for the trial's files: every error in the chain with its full command line and
    output tails (the reason a user reads keeps only the cause and the short command)."""
    parts: list[str] = []
    e: BaseException | None = error
    while e is not None:
        parts.append(getattr(e, "full", None) or str(e))
        e = e.__cause__
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\ncaused by:\n".join(parts) + "\n")


@dataclass(frozen=True)
class _Binding:
    service: str
    seed: Seed
    recipe: Recipe
    options: Mapping[str, Any]

    @property
    def target(self) -> SeedTarget:
        return SeedTarget(self.service, self.seed, self.options)


def _seed_mounts(bindings: Sequence[_Binding]) -> dict[str, SeedMount]:
    """service -> the extra mount its seed's kind asks for (``Recipe.seed_mount``; ``bare``'s file)."""
    return {b.service: m for b in bindings if (m := b.recipe.seed_mount(b.target)) is not None}


def _loopback(bindings: Sequence[_Binding], config: Mapping[str, Any]) -> dict[str, list[int]]:
    """service -> the container port its recipe talks to directly (published on 127.0.0.1)."""
    resolved = ResolvedConfig.of(config)
    out: dict[str, list[int]] = {}
    for b in bindings:
        port = b.recipe.direct_port(resolved.service(b.service))
        if port is not None:
            out[b.service] = [port]
    return out


def _recipe_error(service: str, seed: str | None, kind: str | None, text: str) -> ProvisionError:
    what = []
    if seed is not None:
        what.append(f"seed '{seed}'")
    if kind is not None:
        what.append(f"kind '{kind}'")
    about = f" ({', '.join(what)})" if what else ""
    return ProvisionError("reset_recipe", f"reset recipe for service '{service}'{about} failed: {text}")


def _context(
    b: _Binding, compose: ComposeProject, service_config: ServiceConfig, t: Timeouts, memo: Memo
) -> ApplyContext:
    # The recipe's execs (psql reading the dump, the tree's copy) go straight to the container with
    # `docker exec`: its container is up by now, and `compose exec` would add its CLI start to each.
    direct = dataclasses.replace(compose, direct=True)
    return ApplyContext(
        b.service, b.seed, b.options, compose=direct, service_config=service_config, timeouts=t, memo=memo
    )


def _apply(
    b: _Binding, compose: ComposeProject, service_config: ServiceConfig, t: Timeouts, memo: Memo
) -> ApplyContext:
    ctx = _context(b, compose, service_config, t, memo)
    try:
        _verify_digest(ctx)  # right before applying: a seed edited since load fails loud
        b.recipe.apply(ctx)
    except RecipeError as e:
        raise _recipe_error(b.service, b.seed.name, b.seed.kind, str(e)) from e
    return ctx


def prepare_seed(b: _Binding, ctx: ApplyContext, *, live: bool = False) -> PreparedSeed:
    """The warm preparation and the baseline fingerprint, right after the seed went in; ``live``: of the
    state the service started with (a checkpoint's: ``Recipe.checkpoint_prepare``), not of its seed."""
    try:
        prepared = b.recipe.checkpoint_prepare(ctx) if live else b.recipe.prepare(ctx)
        return PreparedSeed(b.recipe, ctx, prepared, b.recipe.fingerprint(ctx))
    except RecipeError as e:
        raise ProvisionError(
            "warm_prepare", _recipe_error(b.service, b.seed.name, b.seed.kind, str(e)).reason
        ) from e


def _restart(compose: ComposeProject, service: str) -> Callable[[], None]:
    """Start ``service`` again after its golden was captured (it was stopped for a consistent copy)."""
    return lambda: _up(compose, {}, [service], {}, create=False)


def _stopping(runner: Runner) -> Callable[[], bool]:
    """Whether a stop (Ctrl-C) was requested, for waits that issue no command (a golden's key lock)."""
    return lambda: isinstance(runner, StopAwareRunner) and runner.state.requested


def _verify_digest(target: SeedTarget) -> None:
    seed = target.seed
    try:
        now = seed_digest(seed.path, seed.kind)
    except ForgeError as e:
        raise target.fail("digest", str(e)) from e
    if now != seed.digest:
        raise target.fail(
            "digest",
            f"seed {seed.name!r} changed since the project was loaded ({seed.path}: "
            f"expected {seed.digest}, found {now}); re-run `forge stamp` if the change is intended",
        )


def _closure(roots: Sequence[str], services: Mapping[str, ServiceConfig]) -> list[str]:
    """``roots`` and everything they transitively depend on, in the compose file's order."""
    seen: set[str] = set()
    todo = [r for r in roots if r in services]
    while todo:
        s = todo.pop()
        if s in seen:
            continue
        seen.add(s)
        todo.extend(d for d in services[s].depends_on if d in services)
    return [s for s in services if s in seen]


def _up(
    compose: ComposeProject,
    config_services: Mapping[str, ServiceConfig],
    services: Sequence[str],
    absent: Mapping[str, str],
    *,
    create: bool,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Start ``services`` and wait until they are ready (``forgelib.docker.readiness``): their dependencies
    outside ``services`` are up already. ``create``: first create every service's container (``up
    --no-start``; the later phase then only starts its own). ``config_services``: the resolved config's.
    ``on_ready(service)``: as each one is ready (``readiness.start``; not with compose's ``up --wait``),
    what it raises raised as is.

    ``absent``: service -> image not present locally. Compose's pull error names neither the image nor
    the service, so a failed ``up`` names them, and the fix."""
    try:
        if readiness.compose_wait():  # the benchmarks' baseline: compose's own `up --wait`
            compose.up(services, no_deps=not create)
            return
        if create:
            compose.up((), wait=False, no_start=True)  # every container, none started
        readiness.start(compose, config_services, services, on_ready=on_ready)
    except NotReady as e:
        raise ProvisionError("readiness", str(e)) from e
    except (Interrupted, ProvisionError):  # Ctrl-C, or ``on_ready``'s own failure
        raise
    except ForgeError as e:
        stage = _up_stage(e)
        reason = str(e)
        if _POOL_EXHAUSTED.search(reason):
            raise ProvisionError("compose_up", f"{NO_ADDRESS_POOL} (docker said: {reason})") from e
        concerned = {s: i for s, i in absent.items() if not services or s in services}
        if stage == "compose_up" and concerned:
            listed = ", ".join(f"{s}: {i}" for s, i in sorted(concerned.items()))
            reason = (
                f"image(s) not present locally ({listed}); build them (`forge images` builds the "
                f"stand-ins) or fix the name in the compose file. {reason}"
            )
        raise ProvisionError(stage, reason) from e


def _up_stage(e: ForgeError) -> str:
    """``readiness`` when containers were created but did not become healthy/running in time,
    ``compose_up`` when they could not be created or started at all (compose says which on stderr)."""
    if isinstance(e, CommandTimeout):
        return "readiness"
    said = e.stderr_tail if isinstance(e, CommandError) else str(e)
    return "readiness" if _NOT_READY.search(said) else "compose_up"


def _capture(compose: ComposeProject, env: EnvironmentManifest, dest: Path, tail_lines: int) -> None:
    """Every service's log: one ``docker ps`` + ``docker inspect`` finds the containers, then one ``docker
    logs`` each, all at once (a ``compose logs`` call per service would pay the compose CLI's start each
    time). On a warm stack a service's log is the container it serves now: its retired and spare
    containers are not this trial's."""
    dest.mkdir(parents=True, exist_ok=True)
    services = list(env.services)
    try:
        found = compose.served(services)
    except ForgeError as e:
        for svc in services:
            (dest / f"{svc}.log").write_text(f"forge: could not capture this log: {e}\n")
        return

    def one(svc: str) -> None:
        path = dest / f"{svc}.log"
        try:
            compose.service_log(found.get(svc, []), path, tail=tail_lines)
        except ForgeError as e:  # one unreadable log must not hide the others (or the original error)
            path.write_text(f"forge: could not capture this log: {e}\n")

    if len(services) <= 1:
        for svc in services:
            one(svc)
        return
    with ThreadPoolExecutor(
        max_workers=min(LOG_THREADS, len(services)), thread_name_prefix="forge-logs"
    ) as pool:
        for f in [pool.submit(one, svc) for svc in services]:
            f.result()
