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
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forgelib import labels as lab
from forgelib import readiness
from forgelib.builds import Builds, build_services
from forgelib.compose import ComposeProject, labels_override, project_name, write_override
from forgelib.errors import (
    CommandError,
    CommandTimeout,
    ForgeError,
    Interrupted,
    ProvisionError,
    RecipeError,
)
from forgelib.images import ImageFacts
from forgelib.readiness import NotReady
from forgelib.runner import Runner
from forgelib.seeds import REGISTRY, ApplyContext, Memo, Recipe, SeedTarget, bare
from forgelib.seeds.base import PreparedSeed
from forgelib.signals import StopAwareRunner
from forgelib.snapshots.trial import GoldenFailed, Plan, TrialGoldens
from forgelib.spec.digest import seed_digest
from forgelib.spec.models import LOG_TAIL_LINES, EnvironmentManifest, Project, Seed, SeedKind, Task, Timeouts

log = logging.getLogger("forgelib.provision")

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
    '{"default-address-pools": [{"base": "10.200.0.0/16", "size": 24}]}, and restart dockerd'
)

PhaseCallback = Callable[[str, float], None]  # (phase name, seconds), called as each phase ends


def out_of_networks(e: BaseException) -> bool:
    """Whether provisioning failed because Docker had no address pool left for the stack's network: a limit
    on how many stacks the engine holds at once (the run waits for one of its own to come down), not a
    fault of the trial."""
    return isinstance(e, ProvisionError) and e.reason.startswith(NO_ADDRESS_POOL)


@dataclass(frozen=True)
class ProvisionedTrial:
    name: str  # the compose project name
    environment: EnvironmentManifest
    compose: ComposeProject
    timings: dict[str, float]
    bare_seeds: dict[str, bare.BareMount]  # service -> its `bare` seed's read-only mount (seeds.bare)
    trial_dir: Path
    labels: Mapping[str, str] = field(default_factory=dict)
    shared: bool = False  # the run's shared stack: teardown_trial leaves it to teardown_run
    config: Mapping[str, Any] = field(default_factory=dict)  # `docker compose config`, resolved
    # service -> ["127.0.0.1:49153->5432/tcp", ...]: where the host reaches what the stack publishes
    ports: Mapping[str, list[str]] = field(default_factory=dict)
    # Warm stacks: each reset service's recipe, what its `prepare` built and its baseline fingerprint.
    prepared: tuple[PreparedSeed, ...] = ()
    # How the trial got its stack: {"mode": "fresh"|"warm", "name", "reuse", "replaced"} (trial.yaml).
    stack: Mapping[str, Any] = field(default_factory=dict)
    # service -> what its golden did (restored / captured / none, discarded with the reason): trial.yaml
    snapshots: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass
class ProvisionCache:
    """What a backend learns once and every trial it provisions reuses: the engine's images (stand-ins
    present, declared VOLUMEs) and values derived from seed versions. Owned by the backend (one run, one
    ``forge provision``), so nothing is module-global and nothing needs resetting between runs or tests."""

    images: ImageFacts = field(default_factory=ImageFacts)
    seeds: Memo = field(default_factory=Memo)
    builds: Builds = field(default_factory=Builds)  # images of build: services, once per run


# ---------------------------------------------------------------------------------------- public API


def provision_trial(
    project: Project,
    task: Task | None,
    *,
    run_id: str,
    trial_index: int,
    trial_dir: Path,
    timeouts: Timeouts,
    runner: Runner,
    on_phase: PhaseCallback | None = None,
    log_tail_lines: int = LOG_TAIL_LINES,
    keep: bool = False,
    shared: SharedStacks | None = None,
    cache: ProvisionCache | None = None,
    warm: bool = False,
    attempt: int = 1,
    profiles: Sequence[str] = (),
    snapshots: bool = False,
    work_dir: Path | None = None,
) -> ProvisionedTrial:
    """Provision one trial of ``task`` (None: the project's default environment).

    ``keep``: the stack will outlive this process on purpose (``forge provision --keep``), so it is
    labelled for the reaper to leave alone. ``shared``: the run's shared stacks — an environment whose
    services are all ``shared`` gets one stack per run from there; without it (``forge provision``) such
    an environment is provisioned like any other, as this trial's own stack. ``cache``: the backend's (a
    fresh one when None). Raises ``ProvisionError(stage, reason)`` only after the logs were captured and
    the stack torn down. ``attempt`` > 1 (a retry) gets its own compose project, so
    it never lands on what an earlier attempt's failed teardown left. ``profiles``: the compose profiles to
    enable. ``snapshots``: reset services of kinds with goldens start from their golden when one exists
    (``forgelib.snapshots``); the first trial of a key captures it. ``work_dir``: a temp directory made
    for this stack alone (``forge provision``'s), named on its labels so teardown and the reaper remove it.
    """
    env = task.environment if task is not None else project.environment
    task_name = task.name if task is not None else DEFAULT_TASK
    cache = cache if cache is not None else ProvisionCache()
    if shared is not None and not env.requires_per_trial:
        return shared.get(
            (run_id, _files_key(env)),
            lambda: _Provisioning(
                project=project, env=env, name=shared_name(project, run_id, env),
                labels=lab.run_labels(run_id, "shared"),
                trial_dir=trial_dir, timeouts=timeouts, runner=runner, cache=cache, on_phase=on_phase,
                log_tail_lines=log_tail_lines, shared=True, profiles=tuple(profiles),
            ).run(),
            trial_dir,
        )  # fmt: skip
    return provision_stack(
        project,
        env,
        name=project_name(project.name, run_id, task_name, trial_index, attempt),
        labels=lab.run_labels(run_id, lab.trial_label(task_name, trial_index), kept=keep, work_dir=work_dir),
        trial_dir=trial_dir,
        timeouts=timeouts,
        runner=runner,
        cache=cache,
        on_phase=on_phase,
        log_tail_lines=log_tail_lines,
        warm=warm,
        profiles=profiles,
        snapshots=snapshots,
    )


def provision_stack(
    project: Project,
    env: EnvironmentManifest,
    *,
    name: str,
    labels: Mapping[str, str],
    trial_dir: Path,
    timeouts: Timeouts,
    runner: Runner,
    cache: ProvisionCache | None = None,
    on_phase: PhaseCallback | None = None,
    log_tail_lines: int = LOG_TAIL_LINES,
    warm: bool = False,
    profiles: Sequence[str] = (),
    snapshots: bool = False,
) -> ProvisionedTrial:
    """One stack of ``env`` named ``name`` (a compose project name) carrying ``labels``; ``warm``: also
    prepare every seed for in-place resets (``ProvisionedTrial.prepared``). Fails as ``provision_trial``."""
    return _Provisioning(
        project=project,
        env=env,
        name=name,
        labels=labels,
        trial_dir=trial_dir,
        timeouts=timeouts,
        runner=runner,
        cache=cache if cache is not None else ProvisionCache(),
        on_phase=on_phase,
        log_tail_lines=log_tail_lines,
        warm=warm,
        profiles=tuple(profiles),
        snapshots=snapshots,
    ).run()


def capture_logs(trial: ProvisionedTrial, dest_dir: Path, tail_lines: int) -> None:
    """``<dest_dir>/<svc>.log`` for every declared service (a service that never started: an empty file)."""
    _capture(trial.compose, trial.environment, dest_dir, tail_lines)


def teardown_trial(trial: ProvisionedTrial, *, graceful: bool = True) -> float:
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
    project: Project
    env: EnvironmentManifest
    name: str
    labels: Mapping[str, str]
    trial_dir: Path
    timeouts: Timeouts
    runner: Runner
    cache: ProvisionCache
    on_phase: PhaseCallback | None = None
    log_tail_lines: int = LOG_TAIL_LINES
    shared: bool = False
    warm: bool = False  # prepare each seed for in-place resets (forgelib.warm)
    profiles: tuple[str, ...] = ()  # compose profiles enabled (the run config's `profiles`)
    snapshots: bool = False  # start reset services from goldens (forgelib.snapshots)
    timings: dict[str, float] = field(default_factory=dict)
    _compose: ComposeProject | None = None  # the stack as far as it got (clean-up needs all its files)

    def run(self) -> ProvisionedTrial:
        t0 = time.monotonic()
        goldens = None
        if self.snapshots and not self.shared and not self.warm:
            run_id = self.labels.get(lab.RUN, "")
            goldens = TrialGoldens(
                self.runner, self.timeouts, run_id, self.project.name, _stopping(self.runner)
            )
        while True:
            try:
                trial = self._attempt(goldens)
            except GoldenFailed as e:
                # The golden is at fault, not the trial: discard it, say so (trial.yaml, an event), and
                # provision this trial again the normal way (that service seeded from its seed).
                assert goldens is not None
                if goldens.stopping():  # a stop can make any service fail: never blame the golden for it
                    raise Interrupted(f"stopped while provisioning {self.name}") from e
                goldens.discard(e.plan, e.reason)
                continue
            self.timings["provision"] = time.monotonic() - t0
            return dataclasses.replace(trial, timings=dict(self.timings), snapshots=_records(goldens))

    def _attempt(self, goldens: TrialGoldens | None) -> ProvisionedTrial:
        env = self.cache.images.env(self.runner)
        compose = self._compose = ComposeProject(
            self.name, self.env.compose_files, self.runner, self.timeouts, env, profiles=self.profiles
        )
        with contextlib.ExitStack() as locks:  # golden key locks this trial holds while it captures
            try:
                return self._provision(compose, goldens, locks)
            except GoldenFailed:
                self._compose.down(check=True)
                raise
            except BaseException as e:  # ProvisionError, a bug, Ctrl-C: never leave a stack behind
                self._clean_up(self._compose, e)  # with every file: the overrides name our resources
                raise

    def _provision(
        self, compose: ComposeProject, goldens: TrialGoldens | None, locks: contextlib.ExitStack
    ) -> ProvisionedTrial:
        prepared: tuple[PreparedSeed, ...] = ()
        bindings = self._bind()  # host-side guards: a broken binding or seed costs no container
        built: Mapping[str, str] = {}
        # The override is written once, in the last of these phases: with goldens, after the plan says
        # which services start from one (each on its golden's image, without the image's VOLUMEs).
        with self._phase("compose_config", "compose_config"):
            config = compose.config()
            if not build_services(config) and goldens is None:
                compose, services, declared, loopback = self._override(compose, config, bindings, {})
        if build_services(config):
            with self._phase("build", "build"):  # the run's first trial builds; the others wait, ~0 s
                timeout = self.timeouts.compose_up
                built = self.cache.builds.images(
                    self.project.name, compose, config, self.labels, self.trial_dir, timeout
                )
                if goldens is None:
                    compose, services, declared, loopback = self._override(compose, config, bindings, built)
        plans: dict[str, Plan] = {}
        if goldens is not None:
            with self._phase("golden_plan", "compose_config"):
                plans = goldens.plan(bindings, _imaged(config, built), locks)
                over = self._override(compose, config, bindings, {**built, **goldens.images(plans)})
                compose, services, declared, loopback = over
        self._compose = compose
        absent = {n: str(v.get("image")) for n, v in services.items() if v.get("image") not in declared}
        # A service restored from a golden holds its seeded state before it starts: it needs no recipe, so
        # it comes up with the rest (one `up` when nothing else needs a recipe) and only what does goes first.
        normal = [b for b in bindings if b.service not in plans or plans[b.service].golden is None]
        first = _closure([b.service for b in normal], services)
        if first:
            with self._phase("up_seeded", None):
                self._up(compose, services, first, absent, plans, goldens, create=True)
        contexts = []
        for b in normal:
            with self._phase(f"recipe:{b.service}", None):
                ctx = _apply(b, compose, services.get(b.service) or {}, self.timeouts, self.cache.seeds)
                contexts.append(ctx)
            plan = plans.get(b.service)
            if goldens is not None and plan is not None and plan.capture:
                with self._phase(f"golden_capture:{b.service}", "reset_recipe"):
                    goldens.capture(plan, b.recipe, ctx, b.seed, _restart(compose, b.service))
        if self.warm and contexts:
            # Before any dependent starts: the template/pristine copy is the seeded state alone.
            with self._phase("warm_prepare", None):
                prepared = tuple(_prepare(b, ctx) for b, ctx in zip(normal, contexts, strict=True))
        rest = [s for s in services if s not in first]
        if rest or not first:
            with self._phase("up_rest", None):
                # After the seeded phase, only the rest (created with the first): their dependencies in
                # `first` are up and ready.
                self._up(compose, services, rest, absent, plans, goldens, create=not first)
        for b in bindings:
            plan = plans.get(b.service)
            if goldens is not None and plan is not None and plan.golden is not None:
                ctx = _context(b, compose, services.get(b.service) or {}, self.timeouts, self.cache.seeds)
                with self._phase(f"golden_verify:{b.service}", None):
                    goldens.verify(plan, b.recipe, ctx)
        publishes = any(loopback.values()) or any(s.get("ports") for s in services.values())
        ports = compose.published_ports() if publishes else {}
        return ProvisionedTrial(
            name=self.name,
            environment=self.env,
            compose=dataclasses.replace(compose, direct=True),  # the trial's execs: plain `docker exec`
            timings=dict(self.timings),
            bare_seeds=_bare_mounts(bindings),
            trial_dir=self.trial_dir,
            labels=dict(self.labels),
            shared=self.shared,
            config=config,
            ports=ports,
            prepared=prepared,
            stack={
                "mode": "shared" if self.shared else "fresh",
                "name": self.name,
                "reuse": 0,
                "replaced": None,
            },
        )

    def _override(
        self,
        compose: ComposeProject,
        config: Mapping[str, Any],
        bindings: Sequence[_Binding],
        built: Mapping[str, str],
    ) -> tuple[ComposeProject, dict[str, Any], dict[str, tuple[str, ...]], dict[str, list[int]]]:
        """Write this trial's override; the compose project with it, the services (built ones naming the
        run's image), their images' declared VOLUMEs and the ports published for direct connections."""
        services = _imaged(config, built)
        images = [str(s.get("image", "")) for s in services.values()]
        declared = self.cache.images.volumes(self.runner, images, self.timeouts.command)
        loopback = _loopback(bindings, config)
        bares = _bare_mounts(bindings)
        doc = labels_override(
            config, self.labels, declared, loopback, built,
            mounts={m.service: [m.volume()] for m in bares.values()},
            environment={m.service: {m.env_var: m.path} for m in bares.values()},
        )  # fmt: skip
        override = write_override(self.trial_dir / OVERRIDE_FILE, doc)
        # from here on, the services' passwords never reach a log line or an error
        compose = compose.with_files(*self.env.compose_files, override).with_secrets(config)
        return compose, services, declared, loopback

    def _up(
        self,
        compose: ComposeProject,
        config_services: Mapping[str, Any],
        services: Sequence[str],
        absent: Mapping[str, str],
        plans: Mapping[str, Plan],
        goldens: TrialGoldens | None,
        *,
        create: bool,
    ) -> None:
        try:
            _up(compose, config_services, services, absent, create=create)
        except ProvisionError as e:
            if goldens is not None:  # a restored service that did not start: its golden is at fault
                goldens.check_started(compose, plans, services, e)
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
        for svc in self.env.reset_services():
            if svc.reset is None or not svc.reset.seed:
                raise _recipe_error(svc.name, None, None, "isolation is reset but no reset.seed is bound")
            seed = self.project.seeds.get(svc.reset.seed)
            if seed is None:
                known = ", ".join(sorted(self.project.seeds)) or "(none)"
                raise _recipe_error(
                    svc.name, svc.reset.seed, None, f"no seed named {svc.reset.seed!r}; seeds: {known}"
                )
            recipe = REGISTRY.get(seed.kind)
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
            write_failure_detail(self.trial_dir / FAILURE_FILE, cause)
        try:
            _capture(compose, self.env, self.trial_dir / SERVICES_DIR, self.log_tail_lines)
            compose.down(check=True)
        except BaseException as e:  # a second Ctrl-C or a dead engine: report it, keep the first error
            log.warning("clean-up of %s after %r failed: %s", self.name, cause, e)
            cause.add_note(f"forge: tearing down {self.name} failed too: {e}")
            if not isinstance(e, Exception):
                raise


FAILURE_FILE = "provision-error.txt"


def _imaged(config: Mapping[str, Any], built: Mapping[str, str]) -> dict[str, Any]:
    """The resolved config's services, each naming the image it runs: ``built``'s (a built or golden
    image) where it has one, else its own."""
    return {n: {**s, "image": built.get(n, s.get("image"))} for n, s in config["services"].items()}


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


def _bare_mounts(bindings: Sequence[_Binding]) -> dict[str, bare.BareMount]:
    return {
        b.service: bare.mount(b.service, b.seed.name, b.seed.path)
        for b in bindings
        if b.seed.kind is SeedKind.BARE
    }


def _loopback(bindings: Sequence[_Binding], config: Mapping[str, Any]) -> dict[str, list[int]]:
    """service -> the container port its recipe talks to directly (published on 127.0.0.1)."""
    services = config.get("services") or {}
    out: dict[str, list[int]] = {}
    for b in bindings:
        port = b.recipe.direct_port(services.get(b.service) or {})
        if port is not None:
            out[b.service] = [port]
    return out


def _recipe_error(service: str, seed: str | None, kind: SeedKind | None, text: str) -> ProvisionError:
    what = []
    if seed is not None:
        what.append(f"seed '{seed}'")
    if kind is not None:
        what.append(f"kind '{kind.value}'")
    about = f" ({', '.join(what)})" if what else ""
    return ProvisionError("reset_recipe", f"reset recipe for service '{service}'{about} failed: {text}")


def _context(
    b: _Binding, compose: ComposeProject, service_config: Mapping[str, Any], t: Timeouts, memo: Memo
) -> ApplyContext:
    # The recipe's execs (psql reading the dump, the tree's copy) go straight to the container with
    # `docker exec`: its container is up by now, and `compose exec` adds ~0.1 s of CLI start to each.
    direct = dataclasses.replace(compose, direct=True)
    return ApplyContext(
        b.service, b.seed, b.options, compose=direct, service_config=service_config, timeouts=t, memo=memo
    )


def _apply(
    b: _Binding, compose: ComposeProject, service_config: Mapping[str, Any], t: Timeouts, memo: Memo
) -> ApplyContext:
    ctx = _context(b, compose, service_config, t, memo)
    try:
        _verify_digest(ctx)  # right before applying: a seed edited since load fails loud
        b.recipe.apply(ctx)
    except RecipeError as e:
        raise _recipe_error(b.service, b.seed.name, b.seed.kind, str(e)) from e
    return ctx


def _prepare(b: _Binding, ctx: ApplyContext) -> PreparedSeed:
    """The warm preparation and the baseline fingerprint, right after the seed went in."""
    try:
        prepared = b.recipe.prepare(ctx)
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


def _records(goldens: TrialGoldens | None) -> dict[str, dict[str, Any]]:
    return {k: dict(v) for k, v in goldens.records.items()} if goldens is not None else {}


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


def _closure(roots: Sequence[str], services: Mapping[str, Any]) -> list[str]:
    """``roots`` and everything they transitively depend on, in the compose file's order."""
    seen: set[str] = set()
    todo = [r for r in roots if r in services]
    while todo:
        s = todo.pop()
        if s in seen:
            continue
        seen.add(s)
        todo.extend(d for d in (services[s].get("depends_on") or {}) if d in services)
    return [s for s in services if s in seen]


def _up(
    compose: ComposeProject,
    config_services: Mapping[str, Any],
    services: Sequence[str],
    absent: Mapping[str, str],
    *,
    create: bool,
) -> None:
    """Start ``services`` and wait until they are ready (``forgelib.readiness``): their dependencies
    outside ``services`` are up already. ``create``: first create every service's container (``up
    --no-start``; the later phase then only starts its own). ``config_services``: the resolved config's.

    ``absent``: service -> image not present locally. Compose's pull error names neither the image nor
    the service, so a failed ``up`` names them, and the fix."""
    try:
        if readiness.compose_wait():  # the benchmarks' baseline: compose's own `up --wait`
            compose.up(services, no_deps=not create)
            return
        if create:
            compose.up((), wait=False, no_start=True)  # every container, none started
        readiness.start(compose, config_services, services)
    except NotReady as e:
        raise ProvisionError("readiness", str(e)) from e
    except Interrupted:
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
    logs`` each, all at once (five ``compose logs`` calls cost the cache pack ~0.4 s a trial, mostly CLI
    start). On a warm stack a service's log is the container it serves now: its retired and spare
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


# ---------------------------------------------------------------------------------------- shared stack


class SharedStacks:
    """A run's shared stacks (environments whose services are all ``shared``): one per (run, compose file),
    brought up by the first trial that needs it (the others wait for it), no recipes (only reset services
    have seeds). Owned by the run's backend, which tears them down once the run is over."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._stacks: dict[tuple[str, str], ProvisionedTrial] = {}

    def get(
        self, key: tuple[str, str], make: Callable[[], ProvisionedTrial], trial_dir: Path
    ) -> ProvisionedTrial:
        """The stack for ``key`` = (run id, compose file); ``make()`` brings it up the first time."""
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            stack = self._stacks.get(key)
            if stack is not None:
                return dataclasses.replace(stack, trial_dir=trial_dir, timings={"shared_stack": 0.0})
            stack = make()
            self._stacks[key] = stack
            return stack

    def teardown_run(self, run_id: str) -> float:
        """Tear down the shared stacks of ``run_id`` (per-trial stacks are torn down trial by trial)."""
        t0 = time.monotonic()
        with self._guard:
            keys = [k for k in self._stacks if k[0] == run_id]
        errors = []
        for key in keys:
            stack = self._stacks.pop(key)
            try:
                stack.compose.down()
            except ForgeError as e:
                errors.append(str(e))
        if errors:
            raise ForgeError("tearing down the shared stack failed:\n" + "\n".join(errors))
        return time.monotonic() - t0


def shared_name(project: Project, run_id: str, env: EnvironmentManifest) -> str:
    """The compose project name of a run's shared stack for ``env``'s compose file."""
    tag = "env" + hashlib.sha256(_files_key(env).encode()).hexdigest()[:6]
    return project_name(project.name, run_id, tag, None)


def _files_key(env: EnvironmentManifest) -> str:
    return "\n".join(map(str, env.compose_files))
