"""Warm stacks (``forge run --stacks warm``): each worker keeps a stack up for the whole run and resets it
in place between trials, instead of a fresh ``up``/``down`` per trial.

Isolation on a warm stack, per service label:

* ``reset`` — restored to its seed before every trial by its recipe's ``reset`` (``forgelib/seeds/<kind>``:
  a template-database clone, a redis keyspace RESTORE, a pristine-tree copy), then **verified**: the
  recipe's ``fingerprint`` of what a trial could change beyond the reset's reach must equal the one taken
  right after the first seeding. Any difference, or any reset error, and the stack is torn down and a fresh
  one provisioned in its place (the trial records why): a trial never starts on state nobody proved clean.
* ``ephemeral`` (and unlabelled) — a container no trial ran with, every trial. While a trial runs, compose
  itself creates the next one beside it, not started (``up --no-start --no-deps --no-recreate --scale
  <svc>=2``: the same labels, networks, aliases, mounts and environment as any ``up``, numbered on; a
  created container has no network endpoint, so nothing of the trial sees it). When the trial ends, after
  its logs were captured, its ephemeral containers are frozen (``docker pause``), so nothing of theirs runs
  on while the reset services are reset, and, in the background during the reset, taken off every network
  (so exactly one container answers for the service's name once its successor starts); they are removed
  during the next trial, before compose creates the next spares. The next trial, after the reset, checks
  each successor is provably fresh (never started: state ``created``, no start time, an id no trial has
  used) and starts them with plain ``docker start`` in ``depends_on`` waves; the trial's execs go to them
  by name (``ComposeProject.containers``). Anything else (no spare, a named volume only ephemeral services
  mount, which must be renewed with them) removes the old ones after the release and has compose create
  the successors then (``up --no-start --force-recreate --renew-anon-volumes``), and a failed or unprovable
  precreation falls back to ``up --no-deps --force-recreate``. Ready when the container's own healthcheck
  command, run by us through ``docker exec``, first passes (compose's ``--wait`` sees health only at the
  healthcheck's interval).
* ``shared`` — up for the whole run, never touched between trials (it must tolerate its reset
  dependencies being reset under it, e.g. reconnect per request).

Stacks are keyed by environment (tasks with the same services share stacks), at most ``workers`` at once;
an idle stack of another environment is torn down to make room. Every warm stack is registered in
``LiveStacks`` for its whole life, so Ctrl-C tears it down like a fresh one; ``close`` (the run's end)
tears down the rest. Labels, the reaper and ``--resume`` see ordinary forge stacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from forgelib import labels as lab
from forgelib import readiness
from forgelib.compose import ComposeProject, labels_override, project_name, published_of_inspect
from forgelib.errors import ForgeError, Interrupted
from forgelib.provision import (
    PhaseCallback,
    ProvisionCache,
    ProvisionedTrial,
    provision_stack,
)
from forgelib.runner import Runner
from forgelib.seeds.base import fingerprint_diff
from forgelib.signals import LiveStacks
from forgelib.spec.models import LOG_TAIL_LINES, EnvironmentManifest, Isolation, Project, Task, Timeouts

log = logging.getLogger("forgelib.warm")
_T = TypeVar("_T")


class DirtyStack(ForgeError):
    """A warm stack could not be proven clean (reset error or fingerprint difference)."""


@dataclass
class _Successors:
    """The next trial's ephemeral containers, made in the background (``WarmPool._spares`` during a trial,
    ``WarmPool._retire`` after its release): service -> container id once created, their ``docker
    inspect`` records once the old ones are gone, or why they could not be made."""

    job: threading.Thread | None = None
    ids: dict[str, str] = field(default_factory=dict)
    infos: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None

    def wait(self) -> None:
        if self.job is not None:
            self.job.join()


@dataclass
class _Stack:
    trial: ProvisionedTrial  # as provisioned (compose, resolved config, prepared seeds)
    key: str
    waves: list[list[str]]  # ephemeral services, in depends_on order
    renew: list[str]  # named volumes only ephemeral services mount (removed with them)
    reuse: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    gone: bool = False
    handed: float = 0.0  # when the current trial got it (monotonic)
    successors: _Successors | None = None  # the next trial's ephemeral containers, created not started
    used: set[str] = field(default_factory=set)  # ids of every ephemeral container a trial ran with
    # service -> the name of the ephemeral container the current (or last) trial runs with: compose
    # numbers each new one on (`<project>-<service>-<n>`), the trial's compose execs into this one.
    current: dict[str, str] = field(default_factory=dict)
    networks: dict[str, list[str]] = field(default_factory=dict)  # service -> its current one's networks
    retired: list[str] = field(default_factory=list)  # frozen, off every network, not yet removed
    # service -> its published ports as the trial on the stack sees them (trial.yaml's `ports`): an
    # ephemeral service's are its current container's, a new host port each time it is replaced.
    ports: dict[str, list[str]] = field(default_factory=dict)
    # Why this stack's ephemeral services are recreated by compose every trial instead of started from
    # spares (None: spares). A spare is one precreated container per service; a service of several
    # replicas has several at once, so its successors are compose's to make (see `_ephemeral_plan`).
    fallback: str | None = None

    @property
    def name(self) -> str:
        return self.trial.name

    @property
    def compose(self) -> ComposeProject:
        return self.trial.compose

    @property
    def ephemeral(self) -> list[str]:
        return [s for wave in self.waves for s in wave]


def environment_key(env: EnvironmentManifest) -> str:
    """Stacks are interchangeable between tasks whose environments are equal (files, labels, bindings)."""
    doc = {
        "files": [str(f) for f in env.compose_files],
        "services": {
            n: [
                s.isolation.value,
                s.reset.seed if s.reset else None,
                dict(s.reset.options) if s.reset else {},
            ]
            for n, s in sorted(env.services.items())
        },
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:12]


class WarmPool:
    """The warm stacks of one run. ``acquire`` hands a trial a clean stack; ``release`` takes it back."""

    def __init__(
        self,
        project: Project,
        timeouts: Timeouts,
        runner: Runner,
        *,
        workers: int = 1,
        cache: ProvisionCache | None = None,
        log_tail_lines: int = LOG_TAIL_LINES,
        stacks: LiveStacks | None = None,
        stopping: Callable[[], bool] = lambda: False,
        profiles: Sequence[str] = (),
        trials: int | None = None,
    ) -> None:
        self.project = project
        self.timeouts = timeouts
        self.runner = runner
        self.workers = max(1, workers)
        self.cache = cache if cache is not None else ProvisionCache()
        self.log_tail_lines = log_tail_lines
        self.stacks = stacks
        self.stopping = stopping
        self.profiles = tuple(profiles)
        self._lock = threading.Lock()
        self._all: dict[str, _Stack] = {}  # name -> stack, idle or in use
        self._idle: list[_Stack] = []
        self._cond = threading.Condition(self._lock)
        self._provisioning: dict[str, int] = {}  # environment key -> stacks being provisioned now
        self._freed: dict[str, float] = {}  # environment key -> when one of its stacks last came free
        self._provision_s: dict[str, list[float]] = {}  # environment key -> seconds each provision took
        self._count = 0
        # The run's trials (None: not known, e.g. pytest): with what they take, it decides when to grow.
        self.trials = trials
        self._handed = 0  # stacks handed to trials so far
        self._held: dict[str, list[float]] = {}  # environment key -> seconds each trial held a stack
        self._announced: set[str] = set()  # the `_Stack.fallback` reasons already handed to a trial

    # ------------------------------------------------------------------------------------------ acquire

    def acquire(
        self,
        task: Task,
        *,
        run_id: str,
        trial_dir: Path,
        on_phase: PhaseCallback | None = None,
    ) -> ProvisionedTrial:
        """A clean stack of ``task``'s environment: an idle one reset, verified and with its ephemeral
        services recreated, else (none idle, or it could not be proven clean) a freshly provisioned one.
        Raises ``ProvisionError`` like ``provision_trial`` (nothing left behind)."""
        env = task.environment
        key = environment_key(env)
        asked = time.monotonic()
        stack, evict = self._take(key)
        # How long the trial queued for a stack (every one busy, none worth provisioning): in its wall, and
        # on record, so a reused trial's cost and its queueing can be told apart (workers > stacks).
        queued = {"stack_wait": round(time.monotonic() - asked, 3)}
        if evict is not None:
            self._destroy(evict)
        replaced: str | None = None
        if stack is not None:
            taken = time.monotonic()
            try:
                timings = self._recycle(stack, on_phase)
            except (ForgeError, OSError) as e:
                if isinstance(e, Interrupted) or self.stopping():
                    self._destroy(stack, graceful=False)
                    raise
                replaced = str(e)
                log.warning("warm stack %s replaced: %s", stack.name, replaced)
                self._destroy(stack)
                with self._cond:
                    self._provisioning[key] = self._provisioning.get(key, 0) + 1
            else:
                stack.reuse += 1
                handle = self._handle(stack, trial_dir, {**queued, **timings}, None)
                stack.handed = taken  # what a reused trial holds a stack for includes its recycling
                return handle
        t0 = time.monotonic()
        try:
            stack = self._provision(task, env, key, run_id, trial_dir, on_phase)
            with self._cond:
                self._provision_s.setdefault(key, []).append(time.monotonic() - t0)
        finally:
            with self._cond:
                self._provisioning[key] -= 1
                self._freed[key] = time.monotonic()
                self._cond.notify_all()
        return self._handle(stack, trial_dir, {**queued, **stack.trial.timings}, replaced)

    def _take(self, key: str) -> tuple[_Stack | None, _Stack | None]:
        """(an idle stack of ``key`` to reuse, None) or (None, an idle stack of another environment to tear
        down first, or None) with a provisioning slot of ``key`` reserved; waits until one of them holds.

        When every stack of the environment is busy, a trial waits for a release rather than provision a
        new stack, unless ``_grow`` finds the run ends sooner with one more: short trials queue on the
        stacks there are (a reused trial takes ~1 s, a new stack ~7 s, and several provisions at once on a
        small machine take longer still); long ones, or many left, grow the pool towards ``workers``
        stacks, one provisioning at a time per environment."""
        with self._cond:
            while True:
                stack = next((s for s in self._idle if s.key == key), None)
                if stack is not None:
                    self._idle.remove(stack)
                    return stack, None
                if self.stopping():
                    raise Interrupted("stopping: no warm stack handed out")
                waited = time.monotonic() - self._freed.get(key, 0.0)
                took = self._provision_s.get(key)
                patience = statistics.median(took) if took else 0.0
                stacks = sum(1 for s in self._all.values() if s.key == key)
                if not self._provisioning.get(key) and (
                    not stacks or self._grow(key, stacks, waited, patience)
                ):
                    evict = None
                    if len(self._all) + sum(self._provisioning.values()) >= self.workers:
                        evict = self._idle.pop(0) if self._idle else None  # another environment's
                    if evict is not None or len(self._all) + sum(self._provisioning.values()) < self.workers:
                        self._provisioning[key] = self._provisioning.get(key, 0) + 1
                        return None, evict
                # Woken by a release, a finished provision or a teardown; or to see the patience run out.
                self._cond.wait(timeout=min(0.5, max(patience - waited, 0.05)))

    def _grow(self, key: str, stacks: int, waited: float, patience: float) -> bool:
        """Whether a trial waiting for a busy environment should provision another stack of it.

        Knowing how many trials are left and how long a trial holds a stack (``r``) and a provision takes
        (``p``): grow when the rest finishes sooner that way — the ``stacks`` existing ones work through
        ``stacks * p / r`` trials while the new one comes up, then ``stacks + 1`` share what is left.
        Not knowing (no trial released yet, or no plan, as under pytest): ski rental."""
        held = self._held.get(key)
        if self.trials is None or not held or not patience:
            return waited >= patience
        r, p = max(statistics.median(held), 1e-3), patience
        left = max(1, self.trials - self._handed)
        meanwhile = stacks * p / r
        if left <= meanwhile:
            return False
        return p + (left - meanwhile) * r / (stacks + 1) < left * r / stacks

    def _handle(
        self, stack: _Stack, trial_dir: Path, timings: Mapping[str, float], replaced: str | None
    ) -> ProvisionedTrial:
        info: dict[str, Any] = {"mode": "warm", "name": stack.name, "reuse": stack.reuse}
        info["replaced"] = replaced
        with self._lock:
            self._handed += 1
            if stack.fallback and stack.fallback not in self._announced:  # once per run, not per trial
                self._announced.add(stack.fallback)
                info["ephemeral_recreated"] = stack.fallback
        stack.handed = time.monotonic()
        self._spares(stack)
        compose = dataclasses.replace(stack.compose, containers=dict(stack.current))
        ports = {s: list(p) for s, p in stack.ports.items()}
        return dataclasses.replace(
            stack.trial, compose=compose, trial_dir=trial_dir, timings=dict(timings), stack=info, ports=ports
        )

    def _provision(
        self,
        task: Task,
        env: EnvironmentManifest,
        key: str,
        run_id: str,
        trial_dir: Path,
        on_phase: PhaseCallback | None,
    ) -> _Stack:
        with self._lock:
            n = self._count
            self._count += 1
        tag = f"warm{key[:6]}"
        name = project_name(self.project.name, run_id, tag, n)
        # Registered before the first `up`: Ctrl-C mid-provisioning is covered by provisioning's own
        # clean-up, and from here on by this registration.
        trial = provision_stack(
            self.project,
            env,
            name=name,
            labels=lab.run_labels(run_id, lab.trial_label(tag, n)),
            trial_dir=trial_dir,
            timeouts=self.timeouts,
            runner=self.runner,
            cache=self.cache,
            on_phase=on_phase,
            log_tail_lines=self.log_tail_lines,
            profiles=self.profiles,
            warm=True,
        )
        images = [str(s.get("image", "")) for s in (trial.config.get("services") or {}).values()]
        declared = self.cache.images.volumes(self.runner, images, self.timeouts.command)
        waves, renew, fallback = _ephemeral_plan(trial, declared)
        stack = _Stack(trial, key, waves, renew, ports=dict(trial.ports), fallback=fallback)
        stack.current = {s: stack.compose.container(s) for s in stack.ephemeral}
        with self._lock:
            self._all[name] = stack
        if self.stacks is not None:
            try:
                self.stacks.add(_live_name(name), lambda graceful: self._destroy(stack, graceful=graceful))
            except Interrupted:
                self._destroy(stack, graceful=False)
                raise
        return stack

    def _recycle(self, stack: _Stack, on_phase: PhaseCallback | None) -> dict[str, float]:
        """Reset, verify, recreate: the timings of each step (``reset:<svc>``, ``fingerprint:<svc>``,
        ``recreate``, ``ready``). Raises ``DirtyStack``/``ForgeError`` unless the stack is provably clean."""
        timings: dict[str, float] = {}

        def timed(phase: str, step: Callable[[], _T]) -> _T:
            t0 = time.monotonic()
            try:
                return step()
            finally:
                timings[phase] = time.monotonic() - t0
                if on_phase is not None:
                    on_phase(phase, timings[phase])

        for p in stack.trial.prepared:
            timed(f"reset:{p.ctx.service}", p.reset)
        for p in stack.trial.prepared:
            now = timed(f"fingerprint:{p.ctx.service}", p.fingerprint)
            differ = fingerprint_diff(p.baseline, now)
            if differ:
                raise DirtyStack(
                    f"service {p.ctx.service!r} changed beyond its reset's reach ({', '.join(differ)} "
                    "differ from the first seeding)"
                )
        fresh = timed("successors", functools.partial(self._successors, stack)) if stack.waves else None
        for wave in stack.waves:
            if fresh is not None:  # created in the background, proven never started: start them
                timed("recreate", functools.partial(self._start, [fresh[s]["Id"] for s in wave]))
                infos = [fresh[s] for s in wave]
                stack.current.update({s: str(fresh[s].get("Name", "")).lstrip("/") for s in wave})
                stack.networks.update({s: _networks(fresh[s]) for s in wave})
            else:
                timed("recreate", functools.partial(self._recreate, stack, wave))
                infos = []
            timed("ready", functools.partial(self._ready, stack, wave, infos))
        stack.ports.update(self._published(stack))
        return timings

    def _published(self, stack: _Stack) -> dict[str, list[str]]:
        """The published ports of the ephemeral services' new containers (one ``docker inspect``, only
        when one of them publishes any): Docker picks each host port at start, so the last trial's no
        longer hold, and a precreated container's record (taken before its start) has none yet."""
        services = stack.trial.config.get("services") or {}
        publish = [s for s in stack.ephemeral if (services.get(s) or {}).get("ports")]
        if not publish:
            return {}
        if not stack.fallback:
            found = self._inspect(stack.current[s] for s in publish)
            return {s: published_of_inspect(found[s]) for s in publish}
        ids = [cid for cid, _, svc in self._ps(stack, "running") if svc in publish]  # every replica's
        res = self.runner.run(["docker", "inspect", *ids], timeout=self.timeouts.command)
        out: dict[str, list[str]] = {s: [] for s in publish}
        for info in json.loads(res.stdout or "[]"):
            ports = out.setdefault(str(lab.of_inspect(info).get(lab.COMPOSE_SERVICE)), [])
            ports += [p for p in published_of_inspect(info) if p not in ports]
        return out

    def _successors(self, stack: _Stack) -> dict[str, dict[str, Any]] | None:
        """The precreated ephemeral containers (service -> its ``docker inspect`` record, taken after the
        trial before was over and its containers gone) if every one is provably fresh: created by compose
        for this stack and service, never started (state ``created``, no start time), an id no trial has
        run with. None (recreate them the usual way) otherwise."""
        succ, stack.successors = stack.successors, None
        if succ is None:
            return None
        succ.wait()
        if succ.error is not None or set(succ.infos) != set(stack.ephemeral):
            log.warning("warm stack %s: precreated containers unusable (%s)", stack.name, succ.error)
            return None
        for svc, info in succ.infos.items():
            if not _never_started(info, stack.name, svc) or str(info.get("Id")) in stack.used:
                log.warning("warm stack %s: precreated %s is not provably fresh", stack.name, svc)
                return None
        stack.used.update(str(i.get("Id")) for i in succ.infos.values())
        return succ.infos

    def _start(self, ids: Sequence[str]) -> None:
        self.runner.run(["docker", "start", *ids], timeout=self.timeouts.compose_up, tag="start")

    # ------------------------------------------------------------------------------------------ release

    def release(self, trial: ProvisionedTrial, *, graceful: bool = True) -> float:
        """The trial is over: freeze its ephemeral services (nothing of theirs may run on into the next
        reset), start making their successors in the background, and put the stack back; during a stop,
        or when that fails, tear it down instead."""
        t0 = time.monotonic()
        with self._lock:
            stack = self._all.get(trial.name)
        if stack is None or stack.gone:
            return 0.0
        if self.stopping() or not graceful:
            self._destroy(stack, graceful=graceful)
            return time.monotonic() - t0
        try:
            if stack.ephemeral and stack.fallback:
                self._clear(stack)
            elif stack.ephemeral:
                spares, stack.successors = stack.successors, None
                if spares is not None:  # compose must be done: an `up` meeting a paused container fails
                    spares.wait()
                self._freeze(stack)
                succ = stack.successors = _Successors()
                succ.job = threading.Thread(
                    target=self._retire,
                    args=(stack, succ, spares),
                    name=f"forge-warm-next-{stack.name}",
                    daemon=True,
                )
                succ.job.start()
        except ForgeError as e:
            log.warning("warm stack %s could not be released (%s); tearing it down", stack.name, e)
            self._destroy(stack)
            return time.monotonic() - t0
        with self._cond:
            self._held.setdefault(stack.key, []).append(t0 - stack.handed)
            if not stack.gone:
                self._idle.append(stack)
                self._freed[stack.key] = time.monotonic()
                self._cond.notify_all()
        return time.monotonic() - t0

    def _clear(self, stack: _Stack) -> None:
        """The fallback's release: every container of the ephemeral services (all replicas) removed with its
        anonymous volumes, and the named volumes only they mount, so nothing of theirs runs on into the
        reset and the next trial's ``_recreate`` makes them all anew."""
        ids = [cid for cid, _, svc in self._ps(stack, "") if svc in stack.ephemeral]
        if ids:
            self._remove(ids)
        if stack.renew:
            self.runner.run(["docker", "volume", "rm", *stack.renew], timeout=self.timeouts.command)

    def _freeze(self, stack: _Stack) -> None:
        """Nothing of the ephemeral services runs on: paused at once (~20 ms; removed in the background).
        One that cannot be paused (it exited, or is gone) is removed here instead; compose tries last
        (which removes the spares too: the next trial then recreates the usual way)."""
        names = [stack.current[svc] for svc in stack.ephemeral]
        if self.runner.run(["docker", "pause", *names], timeout=self.timeouts.command, check=False).rc == 0:
            return
        rm = ["docker", "rm", "--force", "--volumes", *names]
        if self.runner.run(rm, timeout=self.timeouts.command, check=False).rc != 0:
            stack.compose.run(["rm", "--stop", "--force", "--volumes", *stack.ephemeral])

    def _spares(self, stack: _Stack) -> None:
        """While the trial runs, have compose create the next trial's ephemeral containers beside the
        running ones, not started (``up --no-start --no-deps --no-recreate --scale <svc>=2``: the same
        labels, networks, aliases, mounts and environment as any ``up``; numbered on by compose). A created
        container has no network endpoint: nothing of the trial can see it. Not when a named volume must be
        renewed with them (a volume in use by the spare cannot be removed): ``_retire`` makes them then."""
        if not stack.ephemeral or stack.renew or stack.fallback:
            return
        succ = stack.successors = _Successors()

        def create() -> None:
            try:
                if stack.retired:  # the last trial's: compose counts (and would try to start) them
                    self._remove(stack.retired)
                    stack.retired = []
                if set(stack.networks) != set(stack.ephemeral):  # a new stack's first containers
                    for svc, i in self._inspect(stack.current.values()).items():
                        stack.networks[svc] = _networks(i)
                scale = {svc: 2 for svc in stack.ephemeral}
                stack.compose.up(
                    stack.ephemeral, wait=False, no_deps=True, no_start=True, no_recreate=True, scale=scale
                )
                succ.ids = self._created(stack)
            except (ForgeError, OSError, ValueError) as e:  # `_retire` makes them the usual way
                succ.error = str(e)

        succ.job = threading.Thread(target=create, name=f"forge-warm-spare-{stack.name}", daemon=True)
        succ.job.start()

    def _created(self, stack: _Stack) -> dict[str, str]:
        """service -> id of the one never-started container of each ephemeral service (raises otherwise)."""
        found: dict[str, list[str]] = {}
        for cid, _, svc in self._ps(stack, "created"):
            if svc in stack.ephemeral:
                found.setdefault(svc, []).append(cid)
        odd = [s for s in stack.ephemeral if len(found.get(s, ())) != 1]
        if odd:
            raise ForgeError(f"expected one created container of {', '.join(odd)}, found {found}")
        return {s: ids[0] for s, ids in found.items()}

    def _ps(self, stack: _Stack, status: str) -> list[tuple[str, str, str]]:
        """(id, name, service) of the stack's containers in ``status`` (any: "") (one ``docker ps``)."""
        fmt = '{{.ID}}\t{{.Names}}\t{{.Label "' + lab.COMPOSE_SERVICE + '"}}'
        only = ["--filter", f"status={status}"] if status else []
        res = self.runner.run(
            [
                "docker", "ps", "--all", "--no-trunc", *only,
                *lab.filters({lab.COMPOSE_PROJECT: stack.name}), "--format", fmt,
            ],
            timeout=self.timeouts.command,
        )  # fmt: skip
        rows = [[*line.split("\t"), "", ""][:3] for line in res.stdout.splitlines()]
        return [(r[0], r[1], r[2]) for r in rows]

    def _retire(self, stack: _Stack, succ: _Successors, spares: _Successors | None) -> None:
        """In the background after a release: take the frozen ephemeral containers off every network (so
        none answers for the service's name when its successor starts; the next ``_spares`` removes them,
        with their anonymous volumes, off the path of a trial), or remove them at once when there are no
        spares, have compose create the successors then (first removing the named volumes only they
        mount); then inspect the successors (``_successors`` proves them fresh from that record)."""
        try:
            names = [stack.current[svc] for svc in stack.ephemeral]
            if spares is not None and spares.error is None and set(spares.ids) == set(stack.ephemeral):
                ids = spares.ids
                if self._disconnect(stack):
                    stack.retired = names
                else:
                    self._remove(names)
            else:
                self._remove([*stack.retired, *names])
                stack.retired = []
                if spares is not None:
                    log.warning("warm stack %s: spare containers unusable (%s)", stack.name, spares.error)
                if stack.renew:
                    self.runner.run(["docker", "volume", "rm", *stack.renew], timeout=self.timeouts.command)
                # Every container of the services replaced by one, whatever spares are left.
                stack.compose.up(
                    stack.ephemeral, wait=False, no_deps=True, force_recreate=True, no_start=True
                )
                ids = self._created(stack)
            succ.infos = self._inspect(ids.values())
            succ.ids = {svc: str(i.get("Id")) for svc, i in succ.infos.items()}
        except (ForgeError, OSError, ValueError) as e:  # the next trial recreates them the usual way
            succ.error = str(e)

    def _inspect(self, refs: Iterable[str]) -> dict[str, dict[str, Any]]:
        """service -> the ``docker inspect`` record of these containers (one per service; raises if one is
        not there)."""
        res = self.runner.run(["docker", "inspect", *refs], timeout=self.timeouts.command)
        return {str(lab.of_inspect(i).get(lab.COMPOSE_SERVICE)): i for i in json.loads(res.stdout or "[]")}

    def _disconnect(self, stack: _Stack) -> bool:
        """Take the current ephemeral containers off their networks (~0.08 s each against ~0.15 s for a
        removal); False when one could not be (or its networks are not known): remove them instead."""
        for svc in stack.ephemeral:
            nets = stack.networks.get(svc)
            if not nets:
                return False
            for net in nets:
                argv = ["docker", "network", "disconnect", "--force", net, stack.current[svc]]
                if self.runner.run(argv, timeout=self.timeouts.command, check=False).rc != 0:
                    return False
        return True

    def _remove(self, names: Sequence[str]) -> None:
        """Remove these containers with their anonymous volumes (gone already is fine); raises otherwise."""
        gone = self.runner.run(
            ["docker", "rm", "--force", "--volumes", *names], timeout=self.timeouts.command, check=False
        )
        if gone.rc != 0 and "No such container" not in gone.stderr:
            raise ForgeError(f"could not remove {', '.join(names)}: {gone.stderr.strip()[-300:]}")

    def close(self) -> None:
        """Tear every warm stack down (the run is over, however it ended)."""
        with self._lock:
            stacks = list(self._all.values())
        errors = []
        for s in stacks:
            try:
                self._destroy(s, raise_errors=True)
            except ForgeError as e:
                errors.append(f"{s.name}: {e}")
        if errors:
            raise ForgeError("tearing down warm stacks failed:\n" + "\n".join(errors))

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._all)

    def _destroy(self, stack: _Stack, *, graceful: bool = True, raise_errors: bool = False) -> None:
        with stack.lock:
            if stack.gone:
                return
            if stack.successors is not None:  # never `down` while compose may still be creating
                stack.successors.wait()
            try:
                stack.compose.down(stop_timeout=None if graceful else 0)
            except ForgeError as e:
                log.warning("tearing down warm stack %s failed: %s", stack.name, e)
                if raise_errors:
                    raise
                return  # still registered: the run's end (or Ctrl-C's sweep) tries again
            stack.gone = True
        with self._cond:
            self._all.pop(stack.name, None)
            with contextlib.suppress(ValueError):
                self._idle.remove(stack)
            self._cond.notify_all()
        if self.stacks is not None:
            self.stacks.discard(_live_name(stack.name))

    # ---------------------------------------------------------------------------------------- readiness

    def _recreate(self, stack: _Stack, services: Sequence[str]) -> None:
        """The fallback: compose replaces every container of ``services`` (spares included) by one."""
        stack.compose.up(services, wait=False, no_deps=True, force_recreate=True)
        for cid, name, svc in self._ps(stack, "running"):
            if svc in services:
                stack.current[svc] = name
                stack.used.add(cid)

    def _ready(self, stack: _Stack, services: Sequence[str], inspected: Sequence[Mapping[str, Any]]) -> None:
        """Wait until each recreated container is ready (``forgelib.readiness``: its own healthcheck command
        through ``docker exec``, not compose's 1 s ticks): the ones just started (``inspected`` before),
        never their successors."""
        refs = [] if stack.fallback else [stack.current[s] for s in services]  # []: every replica
        readiness.wait_ready(
            stack.compose, services, timeout=self.timeouts.compose_up, refs=refs, inspected=inspected
        )


def _never_started(info: Mapping[str, Any], project: str, service: str) -> bool:
    """``docker inspect``'s record of a container compose created for ``project``'s ``service`` and nobody
    ever started (Docker's zero time as its start time)."""
    state = info.get("State") or {}
    labels = lab.of_inspect(info)
    return (
        state.get("Status") == "created"
        and str(state.get("StartedAt", "")).startswith("0001-01-01")
        and labels.get(lab.COMPOSE_PROJECT) == project
        and labels.get(lab.COMPOSE_SERVICE) == service
    )


def _networks(info: Mapping[str, Any]) -> list[str]:
    """The networks ``docker inspect`` says a container is (or, created, will be) attached to; none for
    ``network_mode: host|none|service:…`` (nothing of its own to take off)."""
    mode = str((info.get("HostConfig") or {}).get("NetworkMode") or "")
    if mode in ("host", "none") or mode.startswith(("container:", "service:")):
        return []
    return sorted((info.get("NetworkSettings") or {}).get("Networks") or {})


def _live_name(name: str) -> str:
    return f"{name} (warm)"


def _ephemeral_plan(
    trial: ProvisionedTrial, image_volumes: Mapping[str, Sequence[str]]
) -> tuple[list[list[str]], list[str], str | None]:
    """The ephemeral (and unlabelled) services in ``depends_on`` waves, the named volumes only they
    mount (their full engine names), the override's volumes for image-declared VOLUMEs included, and why
    they are recreated by compose every trial rather than started from spares (None: spares).

    Spares stand for one container per service (the trial's execs go to it by name); an ephemeral
    service of several replicas is recreated whole by compose instead (``up --force-recreate`` on the
    trial's path): every replica is new each trial, as the isolation promises, and the run says so once
    (a ``warm_ephemeral_recreated`` event) rather than paying for a spare attempt that cannot work."""
    services: Mapping[str, Any] = trial.config.get("services") or {}
    env = trial.environment
    keep = {n for n, s in env.services.items() if s.isolation in (Isolation.RESET, Isolation.SHARED)}
    eph = [n for n in services if n not in keep]
    waves: list[list[str]] = []
    placed: set[str] = set()
    while len(placed) < len(eph):
        wave = [
            s
            for s in eph
            if s not in placed
            and all(d in placed or d not in eph for d in (services[s].get("depends_on") or {}))
        ]
        if not wave:  # a cycle compose itself would refuse: one wave, compose orders it
            wave = [s for s in eph if s not in placed]
        waves.append(wave)
        placed.update(wave)
    users: dict[str, set[str]] = {}
    added = labels_override(trial.config, {}, image_volumes).get("services") or {}
    for n, svc in services.items():
        for m in [*(svc.get("volumes") or []), *((added.get(n) or {}).get("volumes") or [])]:
            if isinstance(m, Mapping) and m.get("type") == "volume" and m.get("source"):
                users.setdefault(str(m["source"]), set()).add(n)
    declared: Mapping[str, Any] = trial.config.get("volumes") or {}
    renew = [
        str((declared.get(v) or {}).get("name") or f"{trial.name}_{v}")
        for v, who in sorted(users.items())
        if who <= set(eph) and not (declared.get(v) or {}).get("external")
    ]
    several = {s: _replicas(services[s]) for s in eph if _replicas(services[s]) > 1}
    fallback = None
    if several:
        listed = ", ".join(f"{s} ({n} replicas)" for s, n in sorted(several.items()))
        fallback = f"ephemeral {listed}: recreated by compose every trial (spares stand for one container)"
    return waves, renew, fallback


def _replicas(service: Mapping[str, Any]) -> int:
    """How many containers compose runs for ``service`` (``deploy.replicas``, or the legacy ``scale``)."""
    n = (service.get("deploy") or {}).get("replicas", service.get("scale", 1))
    try:
        return int(n if n is not None else 1)
    except (TypeError, ValueError):
        return 1
