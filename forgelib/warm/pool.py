"""The pool of warm stacks (``forge run --stacks warm``): each worker keeps a stack up for the whole run and
resets it in place between trials, instead of a fresh ``up``/``down`` per trial.

Isolation on a warm stack, per service label:

* ``reset`` — restored to its seed before every trial by its recipe's ``reset`` (``forgelib/seeds/<kind>``:
  a data directory restored whole or a template-database clone, a redis keyspace RESTORE, the tree copied
  from the host seed), then **verified**: the
  recipe's ``fingerprint`` of what a trial could change beyond the reset's reach must equal the one taken
  right after the first seeding. Any difference, or any reset error, and the stack is torn down and a fresh
  one provisioned in its place (the trial records why): a trial never starts on state nobody proved clean.
* ``ephemeral`` (and unlabelled) — a container no trial ran with, every trial: ``forgelib.warm.ephemeral``
  (``Ephemerals``, one per stack), which the pool calls as a trial gets the stack, when it gives it back,
  after the reset, and before the stack is torn down.
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
import hashlib
import json
import logging
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from forgelib import labels as lab
from forgelib.admission import Admission, Workload, stacks_wanted
from forgelib.compose import ComposeProject, project_name
from forgelib.errors import ForgeError, Interrupted
from forgelib.provision import (
    PhaseCallback,
    ProvisionedTrial,
    StackContext,
    StackSpec,
    WarmSteps,
    provision_stack,
)
from forgelib.resolved import ResolvedConfig
from forgelib.seeds.base import fingerprint_diff
from forgelib.signals import LiveStacks
from forgelib.spec.models import EnvironmentManifest, Task
from forgelib.warm.ephemeral import Ephemerals, _ephemeral_plan

log = logging.getLogger("forgelib.warm")
_T = TypeVar("_T")


class DirtyStack(ForgeError):
    """A warm stack could not be proven clean (reset error or fingerprint difference)."""


@dataclass
class _Stack:
    trial: ProvisionedTrial  # as provisioned (compose, resolved config, prepared seeds)
    key: str
    # The ephemeral services' plan (``_ephemeral_plan``: depends_on waves, the named volumes only they
    # mount, why compose recreates them every trial), taken over by ``ephemerals``.
    waves: InitVar[list[list[str]]]
    renew: InitVar[list[str]]
    reuse: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    gone: bool = False
    handed: float = 0.0  # when the current trial got it (monotonic)
    # service -> its published ports as the trial on the stack sees them (trial.yaml's `ports`): an
    # ephemeral service's are its current container's, a new host port each time it is replaced.
    ports: dict[str, list[str]] = field(default_factory=dict)
    fallback: InitVar[str | None] = None
    ephemerals: Ephemerals = field(init=False)  # its ephemeral services' containers, this trial's and next

    def __post_init__(self, waves: list[list[str]], renew: list[str], fallback: str | None) -> None:
        self.ephemerals = Ephemerals(self.trial, waves, renew, fallback)

    @property
    def name(self) -> str:
        return self.trial.name

    @property
    def compose(self) -> ComposeProject:
        return self.trial.compose


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
        ctx: StackContext,
        *,
        workers: int = 1,
        stacks: LiveStacks | None = None,
        stopping: Callable[[], bool] = lambda: False,
        trials: int | None = None,
        admission: Admission | None = None,
        workload: Workload | None = None,
    ) -> None:
        self.ctx = ctx  # what every stack of the pool is provisioned with (its cache: the owner's)
        self.project = ctx.project
        self.timeouts = ctx.timeouts
        self.runner = ctx.runner
        self.workers = max(1, workers)
        self.cache = ctx.cache
        self.stacks = stacks
        self.stopping = stopping
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
        # The run's memory budget (None: unbounded) and its CPU per held stack-second (None: the older
        # rule alone, e.g. under pytest): see forgelib.admission.
        self.admission = admission
        self.workload = workload
        self._busy: dict[str, float] = {}  # name of a stack a trial holds -> when it was handed
        self._last_cpu: float | None = None  # the workload's CPU per held second, as last measured

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
        note: dict[str, Any] = {}
        stack, evict = self._take(key, note)
        # How long the trial queued for a stack (every one busy, none worth provisioning): in its wall, and
        # on record, so a reused trial's cost and its queueing can be told apart (workers > stacks). The
        # part of it spent waiting for the memory budget is `memory_wait`.
        queued = {"stack_wait": round(time.monotonic() - asked, 3)}
        if note.get("memory_wait"):
            queued["memory_wait"] = round(note["memory_wait"], 3)
        if evict is not None:
            note["evicted"] = evict.name
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
                handle = self._handle(stack, trial_dir, {**queued, **timings}, None, note)
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
        if self.admission is not None:
            self.admission.measure(key, self.runner, stack.name, timeout=self.timeouts.command)
        return self._handle(stack, trial_dir, {**queued, **stack.trial.timings}, replaced, note)

    def _take(self, key: str, note: dict[str, Any] | None = None) -> tuple[_Stack | None, _Stack | None]:
        """(an idle stack of ``key`` to reuse, None) or (None, an idle stack of another environment to tear
        down first, or None) with a provisioning slot of ``key`` reserved; waits until one of them holds.

        When every stack of the environment is busy, a trial waits for a release rather than provision a
        new stack, unless ``_grow`` finds the run ends sooner with one more: short trials queue on the
        stacks there are (a reused trial takes ~1 s, a new stack ~7 s, and several provisions at once on a
        small machine take longer still); long ones, or many left, grow the pool towards ``workers``
        stacks, one provisioning at a time per environment.

        A workload shown to wait (``_ahead``: trials hold stacks longer than one takes to come up, at little
        CPU) grows towards ``workers`` at once, several provisions at a time. Either way a new stack needs
        room in the memory budget (``admission``); ``note`` gets what was decided (``decision``: reuse,
        first, grow or ahead) and how long the memory budget held the trial back (``memory_wait``)."""
        note = {} if note is None else note
        memory_since: float | None = None
        with self._cond:
            while True:
                stack = next((s for s in self._idle if s.key == key), None)
                if stack is not None:
                    self._idle.remove(stack)
                    note["decision"] = "reuse"
                    return stack, None
                if self.stopping():
                    raise Interrupted("stopping: no warm stack handed out")
                waited = time.monotonic() - self._freed.get(key, 0.0)
                took = self._provision_s.get(key)
                patience = statistics.median(took) if took else 0.0
                stacks = sum(1 for s in self._all.values() if s.key == key)
                grow = not self._provisioning.get(key) and (
                    not stacks or self._grow(key, stacks, waited, patience)
                )
                ahead = not grow and stacks > 0 and self._ahead(key, stacks, patience)
                if grow or ahead:
                    evict = None
                    total = len(self._all) + sum(self._provisioning.values())
                    if total >= self.workers:
                        evict = self._idle.pop(0) if self._idle else None  # another environment's
                    room = total < self.workers and (self.admission is None or self.admission.fits(total))
                    if evict is not None or room:
                        self._provisioning[key] = self._provisioning.get(key, 0) + 1
                        note["decision"] = "ahead" if ahead else ("grow" if stacks else "first")
                        if memory_since is not None:
                            note["memory_wait"] = time.monotonic() - memory_since
                        return None, evict
                    if total < self.workers and memory_since is None:
                        memory_since = time.monotonic()  # a worker is free, the memory is not
                # Woken by a release, a finished provision or a teardown; or to see the patience run out.
                self._cond.wait(timeout=min(0.5, max(patience - waited, 0.05)))

    def _ahead(self, key: str, stacks: int, patience: float) -> bool:
        """Whether the run's trials are shown to wait more than work (``admission.stacks_wanted``) and want
        more stacks of ``key`` than exist or are on their way. Called under the pool's lock."""
        if self.workload is None or not patience:
            return False
        now = time.monotonic()
        in_flight = [now - t for t in self._busy.values()]
        held = self._held.get(key) or []
        hold = max([*in_flight, statistics.median(held) if held else 0.0])
        cpu = self.workload.cpu_per_held(in_flight)
        provisioning = self._provisioning.get(key, 0)
        # With a plan: the trials no stack is handed to or on its way for (the waiting ones among them).
        demand = None if self.trials is None else self.trials - self._handed - provisioning
        wanted = stacks_wanted(
            workers=self.workers, cores=self.workload.cores, cpu_per_held=cpu, hold=hold, provision=patience,
            demand=demand,
        )  # fmt: skip
        self._last_cpu = cpu
        # Provisions at once: as many as there are cores (more only slow each other down).
        return wanted is not None and stacks + provisioning < wanted and provisioning < self.workload.cores

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
        self,
        stack: _Stack,
        trial_dir: Path,
        timings: Mapping[str, float],
        replaced: str | None,
        note: Mapping[str, Any] | None = None,
    ) -> ProvisionedTrial:
        info: dict[str, Any] = {"mode": "warm", "name": stack.name, "reuse": stack.reuse}
        info["replaced"] = replaced
        with self._lock:
            if note:  # the pool's decision for this trial (forge records it as a `stack_acquired` event)
                info["pool"] = {**note, "stacks": len(self._all), "busy": len(self._busy) + 1}
                if self.admission is not None:
                    info["pool"].update(self.admission.figures(), held=len(self._all))
                if self._last_cpu is not None:
                    info["pool"]["cpu_per_held"] = round(self._last_cpu, 4)
            self._handed += 1
            self._busy[stack.name] = time.monotonic()
            if self.workload is not None:
                self.workload.handed()
            fallback = stack.ephemerals.fallback
            if fallback and fallback not in self._announced:  # once per run, not per trial
                self._announced.add(fallback)
                info["ephemeral_recreated"] = fallback
        stack.handed = time.monotonic()
        stack.ephemerals.precreate()
        compose = dataclasses.replace(stack.compose, containers=dict(stack.ephemerals.current))
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
        labels = lab.run_labels(run_id, lab.trial_label(tag, n))
        spec = StackSpec(env, name, labels, trial_dir)
        trial = provision_stack(self.ctx, spec, WarmSteps(), on_phase=on_phase)
        images = [s.image for s in ResolvedConfig.of(trial.config).services.values()]
        declared = self.cache.images.volumes(self.runner, images, self.timeouts.command)
        waves, renew, fallback = _ephemeral_plan(trial, declared)
        stack = _Stack(trial, key, waves, renew, ports=dict(trial.ports), fallback=fallback)
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
        restarted = [p.ctx.service for p in stack.trial.prepared if p.restarts]
        if restarted and any(stack.ports.get(s) for s in restarted):
            # `docker start` published them on new host ports: trial.yaml records the ones it runs on
            ports = stack.compose.published_ports()
            stack.ports.update({s: ports.get(s, []) for s in restarted if s in stack.ports})
        for p in stack.trial.prepared:
            now = timed(f"fingerprint:{p.ctx.service}", p.fingerprint)
            differ = fingerprint_diff(p.baseline, now)
            if differ:
                raise DirtyStack(
                    f"service {p.ctx.service!r} changed beyond its reset's reach ({', '.join(differ)} "
                    "differ from the first seeding)"
                )
        stack.ports.update(stack.ephemerals.recycle(timed))
        return timings

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
            stack.ephemerals.release()
        except ForgeError as e:
            log.warning("warm stack %s could not be released (%s); tearing it down", stack.name, e)
            self._destroy(stack)
            return time.monotonic() - t0
        with self._cond:
            self._held.setdefault(stack.key, []).append(t0 - stack.handed)
            handed = self._busy.pop(stack.name, None)
            if self.workload is not None and handed is not None:
                self.workload.released(t0 - handed)
            if not stack.gone:
                self._idle.append(stack)
                self._freed[stack.key] = time.monotonic()
                self._cond.notify_all()
        return time.monotonic() - t0

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
            stack.ephemerals.settle()  # never `down` while compose may still be creating
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
            self._busy.pop(stack.name, None)
            with contextlib.suppress(ValueError):
                self._idle.remove(stack)
            self._cond.notify_all()
        if self.stacks is not None:
            self.stacks.discard(_live_name(stack.name))


def _live_name(name: str) -> str:
    return f"{name} (warm)"
