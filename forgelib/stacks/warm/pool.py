"""The pool of warm stacks (``forge run --stacks warm``): each worker keeps a stack up for the whole run and
resets it in place between trials, instead of a fresh ``up``/``down`` per trial.

Isolation on a warm stack, per service label:

* ``reset`` — restored to its seed before every trial by its recipe's ``reset`` (``forgelib/kinds/<kind>/``:
  a data directory restored whole or a template-database clone, a redis keyspace RESTORE, the tree copied
  from the host seed), then **verified**: the
  recipe's ``fingerprint`` of what a trial could change beyond the reset's reach must equal the one taken
  right after the first seeding. Any difference, or any reset error, and the stack is torn down and a fresh
  one provisioned in its place (the trial records why): a trial never starts on state nobody proved clean.
* ``ephemeral`` (and unlabelled) — a container no trial ran with, every trial:
  ``forgelib.stacks.warm.ephemeral`` (``Ephemerals``, one per stack), which the pool calls as a trial gets
  the stack, when it gives it back, after the reset, and before the stack is torn down.
* ``shared`` — up for the whole run, never touched between trials (it must tolerate its reset
  dependencies being reset under it, e.g. reconnect per request).

A stack is reset when its trial gives it back, in the background (``_reset_ahead``), and goes back to the
idle stacks only once reset and verified: a trial is handed a stack that is clean already, and one that
asks while the only stacks left are still being reset waits for one of those resets (``reset_wait``). A
stack whose reset or check fails is torn down, never handed out; the next trial of its environment records
why (``replaced``). A waiting workload (see ``forgelib.stacks.budget``) also keeps spare clean stacks beyond
one per worker, provisioned in the background while its trials wait on their model
(``admission.spares_wanted``, within the memory budget), so that trials giving their stacks back together do
not wait for the resets. Once every trial of the run has been handed a stack, a stack given back is torn
down at once, in the background.

Stacks are keyed by environment (tasks with the same services share stacks), at most ``workers`` at once
besides the spares; an idle stack of another environment is torn down to make room. Every warm stack is
registered in ``LiveStacks`` for its whole life, so Ctrl-C tears it down like a fresh one (its background
reset waited for first); ``close`` (the run's end) tears down the rest. Labels, the reaper and
``--resume`` see ordinary forge stacks.
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
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from forgelib.docker import labels as lab
from forgelib.docker.compose import ComposeProject, project_name
from forgelib.errors import ForgeError, Interrupted, ProvisionError
from forgelib.kinds.base import fingerprint_diff
from forgelib.spec.models import EnvironmentManifest, Task
from forgelib.stacks.budget import WAITING_CPU, Admission, Workload, spares_wanted, stacks_wanted
from forgelib.stacks.live import LiveStacks
from forgelib.stacks.provision import (
    FAILURE_FILE,
    FreshSteps,
    PhaseCallback,
    StackContext,
    StackPlan,
    out_of_networks,
    provision_stack,
    warm_steps,
)
from forgelib.stacks.stack import Stack
from forgelib.stacks.warm.ephemeral import Ephemerals, _ephemeral_plan, independent, renewal

log = logging.getLogger("forgelib.stacks.warm")
_T = TypeVar("_T")
DEFAULT_RESET = 2.0  # seconds a reset ahead is assumed to take until one (or a warm preparation) was timed
CLOSE_AT_ONCE = 8  # warm stacks torn down at once at the run's end


class DirtyStack(ForgeError):
    """A warm stack could not be proven clean (reset error or fingerprint difference)."""


@dataclass(frozen=True)
class StartFrom:
    """Where a warm stack's reset services start and are reset to when not their seeds: a checkpoint (its
    id, part of the stacks' key) and the provisioning steps that start a stack there
    (``stacks.warm.checkpoint.CheckpointWarmSteps``)."""

    checkpoint: str
    steps: Callable[[], FreshSteps]


@dataclass
class PooledStack:
    trial: Stack  # as provisioned (compose, resolved config, prepared seeds)
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
    spare: bool = False  # provisioned ahead with no trial asking (``WarmPool._spare``)
    # The last reset, done ahead in the background (``WarmPool._reset_ahead``): its steps' seconds,
    # ``seconds`` in all and ``ended_at`` (epoch); handed to the next trial with the stack.
    reset: dict[str, float] = field(default_factory=dict)
    job: threading.Thread | None = None  # its background reset or teardown, while one runs
    dirty: bool = False  # given back after ``WarmPool.no_more`` and not reset: reset when a rerun takes it

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
        self._all: dict[str, PooledStack] = {}  # name -> stack, idle or in use
        self._idle: list[PooledStack] = []
        self._cond = threading.Condition(self._lock)
        self._provisioning: dict[str, int] = {}  # environment key -> stacks being provisioned now
        self._freed: dict[str, float] = {}  # environment key -> when one of its stacks last came free
        self._provision_s: dict[str, list[float]] = {}  # environment key -> seconds each provision took
        self._count = 0
        # The run's trials (None: not known, e.g. pytest): with what they take, it decides when to grow.
        self.trials = trials
        self._handed = 0  # stacks handed to trials so far
        self._held: dict[str, list[float]] = {}  # environment key -> seconds each trial held a stack
        self._announced: set[str] = set()  # the `PooledStack.fallback` reasons already handed to a trial
        # The run's memory budget (None: unbounded) and its CPU per held stack-second (None: the older
        # rule alone, e.g. under pytest): see forgelib.stacks.budget.
        self.admission = admission
        self.workload = workload
        self._busy: dict[str, float] = {}  # name of a stack a trial holds -> when it was handed
        self._last_cpu: float | None = None  # the workload's CPU per held second, as last measured
        self._resetting: dict[
            str, PooledStack
        ] = {}  # name -> a stack given back, being reset in the background
        self._claims: dict[str, int] = {}  # environment key -> trials waiting for one of its resets
        self._resets_s: dict[str, list[float]] = {}  # environment key -> seconds each reset ahead took
        self._prepare_s: dict[str, list[float]] = {}  # environment key -> each new stack's warm preparation
        self._replaced: dict[str, list[str]] = {}  # environment key -> stacks torn down after a failed reset
        self._asking = 0  # trials in ``_take`` now
        # environment key -> the trials in ``_take`` for it, in the order they asked: a clean stack of the
        # environment goes to the first of them, so a trial never waits behind one that asked later
        self._queue: dict[str, list[object]] = {}
        # What a spare of an environment is provisioned for: the last trial's (task, run id, run directory).
        self._spare_for: dict[str, tuple[Task, str, Path, StartFrom | None]] = {}
        self._spares: list[threading.Thread] = []  # spare provisions under way
        self._closing = False
        self._drained = False  # ``no_more``: only reruns may still ask
        self._dirty: list[PooledStack] = []  # given back since then, not reset (``PooledStack.dirty``)
        # service -> what its ephemeral successors are furnished with before they start (``Ephemerals``):
        # set by a host before its first trial asks.
        self.furnish: dict[str, Path] = {}

    # ------------------------------------------------------------------------------------------ acquire

    def acquire(
        self,
        task: Task,
        *,
        run_id: str,
        trial_dir: Path,
        on_phase: PhaseCallback | None = None,
        start: StartFrom | None = None,
    ) -> Stack:
        """A clean stack of ``task``'s environment: an idle one reset, verified and with its ephemeral
        services recreated, else (none idle, or it could not be proven clean) a freshly provisioned one.
        ``start``: its reset services start from (and are reset to) a checkpoint, not their seeds; such
        stacks are kept apart from the environment's others. Raises ``ProvisionError`` like
        ``provision_trial`` (nothing left behind)."""
        env = task.environment
        key = environment_key(env) + (f"@{start.checkpoint}" if start is not None else "")
        asked = time.monotonic()
        note: dict[str, Any] = {"asked_at": round(time.time(), 3)}
        root = _spare_root(trial_dir)
        with self._cond:
            if root is not None:
                self._spare_for[key] = (task, run_id, root, start)
        stack, evict = self._take(key, note)
        with self._cond:  # after the wait: a reset that failed meanwhile is why this trial gets a new stack
            replaced = "; ".join(self._replaced.pop(key, [])) or None
        # How long the trial queued for a stack (every one busy, none worth provisioning): in its wall, and
        # on record, so a reused trial's cost and its queueing can be told apart (workers > stacks). The
        # parts of it spent waiting for the memory budget and for a reset under way are `memory_wait` and
        # `reset_wait`.
        queued = {"stack_wait": round(time.monotonic() - asked, 3)}
        for part in ("memory_wait", "reset_wait"):
            if note.get(part):
                queued[part] = round(note[part], 3)
                note[part] = round(note[part], 3)
        if evict is not None:
            note["evicted"] = evict.name
        if evict is not None:
            self._destroy(evict)
        if stack is not None and stack.dirty and not self._reset_late(stack, on_phase, queued):
            return self.acquire(task, run_id=run_id, trial_dir=trial_dir, on_phase=on_phase, start=start)
        if stack is not None:  # reset and verified when it was given back (or a spare, never used)
            if stack.reset:
                note["reset_ahead"] = round(stack.reset.get("seconds", 0.0), 3)
                note["reset_ended_at"] = stack.reset.get("ended_at")
            if not stack.spare:  # a spare's first trial is its first use
                stack.reuse += 1
            handle = self._handle(stack, trial_dir, queued, replaced, note)
            stack.spare = False
            self._maybe_spare()
            return handle
        t0 = time.monotonic()
        try:
            stack = self._provision(task, env, key, run_id, trial_dir, on_phase, start=start)
            with self._cond:
                self._provision_s.setdefault(key, []).append(time.monotonic() - t0)
        except ProvisionError as e:
            with self._cond:
                held = len(self._all)
            # Docker's network address pools are full: no more stacks than the run holds now; this trial
            # waits for one of them (provisioning left nothing behind).
            if not (out_of_networks(e) and self.admission is not None and self.admission.limited(held)):
                raise
            log.warning("warm pool: Docker has no network address pool left; at most %d stacks", held)
            (trial_dir / FAILURE_FILE).unlink(missing_ok=True)
            again = True
        else:
            again = False
        finally:
            with self._cond:
                self._provisioning[key] -= 1
                self._freed[key] = time.monotonic()
                self._holding_changed()
                self._cond.notify_all()
        if again or stack is None:
            return self.acquire(task, run_id=run_id, trial_dir=trial_dir, on_phase=on_phase, start=start)
        if self.admission is not None:
            self.admission.measure(key, self.runner, stack.name, timeout=self.timeouts.command)
        timings = {**queued, **stack.trial.timings}
        started = float(stack.trial.timings.get("start_wait", 0.0))
        if started:  # waiting for one of the engine's start places is queueing too (``stack_wait``)
            timings["stack_wait"] = round(queued["stack_wait"] + started, 3)
            note["start_wait"] = started
        handle = self._handle(stack, trial_dir, timings, replaced, note)
        self._maybe_spare()
        return handle

    def _take(
        self, key: str, note: dict[str, Any] | None = None
    ) -> tuple[PooledStack | None, PooledStack | None]:
        """(an idle stack of ``key`` to reuse, None) or (None, an idle stack of another environment to tear
        down first, or None) with a provisioning slot of ``key`` reserved; waits until one of them holds.

        When every stack of the environment is busy, a trial waits for a release rather than provision a
        new stack, unless ``_grow`` finds the run ends sooner with one more: short trials queue on the
        stacks there are (reusing a stack is much quicker than provisioning one, and several provisions
        at once on a small machine take longer still); long ones, or many left, grow the pool towards
        ``workers`` stacks, one provisioning at a time per environment.

        A workload shown to wait (``_ahead``: trials hold stacks longer than one takes to come up, at little
        CPU) grows towards ``workers`` at once, several provisions at a time. Either way a new stack needs
        room in the memory budget (``admission``); ``note`` gets what was decided (``decision``: reuse,
        spare, first, grow or ahead) and how long the memory budget held the trial back (``memory_wait``).

        Idle stacks are clean (reset when given back); while a stack of the environment is still being
        reset and no other trial waits for that one, a trial waits for it (``reset_wait``) instead. The
        trials waiting for an environment take its clean stacks in the order they asked."""
        note = {} if note is None else note
        ticket = object()
        with self._cond:
            self._asking += 1
            self._queue.setdefault(key, []).append(ticket)
            try:
                return self._take_locked(key, note, ticket)
            finally:
                self._asking -= 1
                self._queue[key].remove(ticket)
                self._cond.notify_all()  # the next in line may take a clean stack now
                if note.get("claimed"):
                    note.pop("claimed")
                    self._claims[key] -= 1

    def _take_locked(
        self, key: str, note: dict[str, Any], ticket: object
    ) -> tuple[PooledStack | None, PooledStack | None]:
        memory_since: float | None = None
        reset_since: float | None = None  # since when this trial waits for a reset under way
        while True:
            ready = any(s.key == key for s in [*self._idle, *self._dirty])
            if ready and self._queue[key][0] is not ticket:  # an earlier trial takes it: wait behind it
                if self.stopping():
                    raise Interrupted("stopping: no warm stack handed out")
                self._cond.wait(timeout=0.5)
                continue
            stack = next((s for s in self._idle if s.key == key), None)
            if stack is not None:
                self._idle.remove(stack)
                note["decision"] = "spare" if stack.spare else "reuse"
                if reset_since is not None:
                    note["reset_wait"] = time.monotonic() - reset_since
                return stack, None
            stack = next((s for s in self._dirty if s.key == key), None)
            if stack is not None:  # a rerun after ``no_more``: this trial resets it (``_reset_late``)
                self._dirty.remove(stack)
                note["decision"] = "reuse"
                return stack, None
            if self.stopping():
                raise Interrupted("stopping: no warm stack handed out")
            # A stack of the environment is being reset and no other trial waits for it: wait for it
            # (a reset takes a second or two, a new stack several), growing no further for this trial.
            resetting = sum(1 for s in self._resetting.values() if s.key == key)
            if note.get("claimed") and self._claims[key] > resetting:  # a reset failed: not for us
                note.pop("claimed")
                self._claims[key] -= 1
            if not note.get("claimed") and self._claims.get(key, 0) < resetting:
                note["claimed"] = True
                self._claims[key] = self._claims.get(key, 0) + 1
            if note.get("claimed"):
                reset_since = time.monotonic() if reset_since is None else reset_since
                self._cond.wait(timeout=0.5)
                continue
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
                fits = self.admission is None or self.admission.fits(total)
                # No worker or no memory left for one more: an idle stack of another environment makes
                # room (nobody may give one back while this trial waits: pytest asks one test at a time).
                if total >= self.workers or not fits:
                    spent = self._idle or self._dirty
                    evict = spent.pop(0) if spent else None  # another environment's
                room = total < self.workers and fits
                if evict is not None or room:
                    self._provisioning[key] = self._provisioning.get(key, 0) + 1
                    self._holding_changed()
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
        stack: PooledStack,
        trial_dir: Path,
        timings: Mapping[str, float],
        replaced: str | None,
        note: Mapping[str, Any] | None = None,
    ) -> Stack:
        info: dict[str, Any] = {"mode": "warm", "name": stack.name, "reuse": stack.reuse}
        info["replaced"] = replaced
        if stack.reset:  # how the stack was reset before it was handed out (off the trial's path)
            info["reset_ahead"] = {k: round(v, 3) for k, v in stack.reset.items()}
        if stack.spare:
            info["spare"] = True
        if stack.ephemerals.current_furnished:  # its successors came furnished (``WarmPool.furnish``)
            info["furnished"] = sorted(stack.ephemerals.current_furnished)
        with self._lock:
            if note:  # the pool's decision for this trial (forge records it as a `stack_acquired` event)
                info["pool"] = {**note, "stacks": len(self._all), "busy": len(self._busy) + 1}
                if self.admission is not None:
                    info["pool"].update(self.admission.figures(), held=len(self._all))
                if self._last_cpu is not None:
                    info["pool"]["cpu_per_held"] = round(self._last_cpu, 4)
            self._handed += 1
            self._busy[stack.name] = time.monotonic()
            if self._all_handed():
                self._retire_idle()
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
        snapshots = stack.trial.snapshots
        if stack.reuse:  # a golden discarded at the stack's provisioning is its first trial's news alone
            snapshots = {s: {k: v for k, v in r.items() if k != "discarded"} for s, r in snapshots.items()}
        return dataclasses.replace(
            stack.trial, compose=compose, trial_dir=trial_dir, timings=dict(timings), source=info,
            ports=ports, pooled=True, snapshots=snapshots,
        )  # fmt: skip

    def _provision(
        self,
        task: Task,
        env: EnvironmentManifest,
        key: str,
        run_id: str,
        trial_dir: Path | None,
        on_phase: PhaseCallback | None,
        *,
        spare_root: Path | None = None,
        start: StartFrom | None = None,
    ) -> PooledStack:
        """A new stack; ``trial_dir`` None: a spare's, its files under ``spare_root/<name>``; ``start``: from
        a checkpoint (``acquire``)."""
        with self._lock:
            n = self._count
            self._count += 1
        tag = f"warm{key[:6]}"
        name = project_name(self.project.name, run_id, tag, n)
        if trial_dir is None:
            assert spare_root is not None
            trial_dir = spare_root / name
            trial_dir.mkdir(parents=True, exist_ok=True)
        # Registered before the first `up`: Ctrl-C mid-provisioning is covered by provisioning's own
        # clean-up, and from here on by this registration.
        labels = lab.run_labels(run_id, lab.trial_label(tag, n))
        spec = StackPlan(env, name, labels, trial_dir)
        # One of the engine's start places while it comes up, as a fresh stack holds (``Admission.starting``).
        place = self.admission.starting() if self.admission is not None else contextlib.nullcontext(0.0)
        steps = start.steps() if start is not None else warm_steps(self.ctx, run_id)
        with place as waited:
            trial = provision_stack(self.ctx, spec, steps, on_phase=on_phase)
        if waited:  # the trial's queueing, as a fresh stack's records it (``backends._admitted``)
            trial.timings["start_wait"] = round(waited, 3)
        images = [s.image for s in trial.resolved.services.values()]
        declared = self.cache.images.volumes(self.runner, images, self.timeouts.command)
        waves, renew, fallback = _ephemeral_plan(trial, declared)
        stack = PooledStack(trial, key, waves, renew, ports=dict(trial.ports), fallback=fallback)
        stack.ephemerals.furnish = {s: d for s, d in self.furnish.items() if s in stack.ephemerals.services}
        _, stack.ephemerals.renewing = renewal(trial, declared, stack.ephemerals.services)
        reset = [s.name for s in env.reset_services()]
        deps = {n: list(s.depends_on) for n, s in trial.resolved.services.items()}
        stack.ephemerals.early = independent(deps, stack.ephemerals.services, reset)
        stack.spare = spare_root is not None
        with self._lock:
            self._all[name] = stack
            if "warm_prepare" in trial.timings:
                self._prepare_s.setdefault(key, []).append(float(trial.timings["warm_prepare"]))
        if self.stacks is not None:
            try:
                self.stacks.add(_live_name(name), lambda graceful: self._destroy(stack, graceful=graceful))
            except Interrupted:
                self._destroy(stack, graceful=False)
                raise
        return stack

    def _recycle(self, stack: PooledStack, on_phase: PhaseCallback | None) -> dict[str, float]:
        """Reset, verify, recreate: the timings of each step (``reset:<svc>``, ``fingerprint:<svc>``,
        ``recreate``, ``ready``). Raises ``DirtyStack``/``ForgeError`` unless the stack is provably clean.

        Once the reset services are reset, a reset ahead (``on_phase`` None: off every trial's path) starts
        the ephemeral successors beside the fingerprints instead of after them: they start against the
        reset state either way, and a stack the fingerprints cannot prove clean comes down with them, so
        nothing they saw outlives it. A late reset, on its trial's path, keeps the steps in sequence (they
        are that trial's ready breakdown, whose parts add up)."""
        timings: dict[str, float] = {}

        def timed(phase: str, step: Callable[[], _T]) -> _T:
            t0 = time.monotonic()
            try:
                return step()
            finally:
                timings[phase] = time.monotonic() - t0
                if on_phase is not None:
                    on_phase(phase, timings[phase])

        prepared = stack.trial.prepared
        early = stack.ephemerals.early if on_phase is None and prepared else []
        early_job: threading.Thread | None = None
        early_failed: list[BaseException] = []

        def start_early() -> None:
            try:
                stack.ephemerals.start_early(lambda phase, step: timed(f"{phase}_early", step), early)
            except BaseException as e:  # noqa: BLE001  # raised below, on the recycling thread
                early_failed.append(e)

        def restored() -> None:  # the last reset service's trial changes are gone: the early ones start
            nonlocal early_job
            early_job = threading.Thread(
                target=start_early, name=f"forge-warm-early-{stack.name}", daemon=True
            )
            early_job.start()

        def join_early() -> None:
            if early_job is not None:
                early_job.join()
            if early_failed:
                raise early_failed[0]

        try:
            for i, p in enumerate(prepared):
                last = early and i == len(prepared) - 1
                timed(f"reset:{p.ctx.service}", functools.partial(p.reset, restored) if last else p.reset)
        except BaseException:
            if early_job is not None:  # nothing of this stack's runs on while it is torn down
                early_job.join()
            raise
        restarted = [p.ctx.service for p in stack.trial.prepared if p.restarts]
        if restarted and any(stack.ports.get(s) for s in restarted):
            # `docker start` published them on new host ports: trial.yaml records the ones it runs on
            ports = stack.compose.published_ports()
            stack.ports.update({s: ports.get(s, []) for s in restarted if s in stack.ports})

        def verify() -> None:
            for p in stack.trial.prepared:
                now = timed(f"fingerprint:{p.ctx.service}", p.fingerprint)
                differ = fingerprint_diff(p.baseline, now)
                if differ:
                    raise DirtyStack(
                        f"service {p.ctx.service!r} changed beyond its reset's reach ({', '.join(differ)} "
                        "differ from the stack's first state: its seeding, or the checkpoint it started from)"
                    )

        if on_phase is not None or not stack.ephemerals.services or not stack.trial.prepared:
            verify()
            join_early()
            stack.ports.update(stack.ephemerals.recycle(timed, early))
            return timings
        failed: list[BaseException] = []

        def verify_beside() -> None:
            try:
                verify()
            except BaseException as e:  # noqa: BLE001  # raised below, on the recycling thread
                failed.append(e)

        job = threading.Thread(target=verify_beside, name=f"forge-warm-verify-{stack.name}", daemon=True)
        job.start()
        try:
            join_early()
            ports = stack.ephemerals.recycle(timed, early)
        finally:
            job.join()
            if failed:  # a stack not proven clean says so, whatever the successors did
                raise failed[0]
        stack.ports.update(ports)
        return timings

    # ------------------------------------------------------------------------------------------ release

    def release(self, trial: Stack, *, graceful: bool = True) -> float:
        """The trial is over: freeze its ephemeral services (nothing of theirs may run on into the next
        reset), start making their successors, and reset the stack in the background (``_reset_ahead``):
        it goes back to the idle stacks once reset and verified. During a stop, or when the freeze fails,
        tear it down instead; once every trial of the run has been handed a stack, tear it down in the
        background (no trial will ask for it)."""
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
            if self._all.get(stack.name) is not stack:  # torn down meanwhile (a stop's sweep)
                return time.monotonic() - t0
            if self._all_handed():
                job = threading.Thread(
                    target=self._destroy, args=(stack,), name=f"forge-warm-down-{stack.name}"
                )
            elif self._drained:  # kept as it is: the run's end tears it down without resetting it first
                stack.dirty, stack.reset = True, {}
                self._dirty.append(stack)
                self._freed[stack.key] = time.monotonic()
                self._cond.notify_all()
                return time.monotonic() - t0
            else:
                self._resetting[stack.name] = stack
                job = threading.Thread(
                    target=self._reset_ahead, args=(stack,), name=f"forge-warm-reset-{stack.name}"
                )
            job.daemon = True
            job.start()
            stack.job = job  # started first: `_destroy` joins it
        return time.monotonic() - t0

    def _reset_ahead(self, stack: PooledStack) -> None:
        """In the background after a release: reset, verify and recreate (``_recycle``), then put the stack
        back among the idle ones, clean; or tear it down when it cannot be proven clean (the environment's
        next trial records why), or when the run is stopping."""
        t0 = time.monotonic()
        try:
            timings = self._recycle(stack, None)
        except (ForgeError, OSError) as e:
            self._unclean(stack, e)
            with self._cond:
                self._resetting.pop(stack.name, None)
                self._cond.notify_all()
            self._maybe_spare()
            return
        except BaseException:
            with self._cond:
                self._resetting.pop(stack.name, None)
                self._cond.notify_all()
            raise
        seconds = time.monotonic() - t0
        with self._cond:
            self._resetting.pop(stack.name, None)
            stack.reset = {**timings, "seconds": seconds, "ended_at": round(time.time(), 3)}
            self._resets_s.setdefault(stack.key, []).append(seconds)
            unwanted = self._all_handed()
            if not stack.gone and not self.stopping() and not unwanted:
                self._idle.append(stack)
                self._freed[stack.key] = time.monotonic()
            self._cond.notify_all()
        if unwanted:  # every trial has a stack by now: this one comes down
            self._destroy(stack)
            return
        self._maybe_spare()

    def no_more(self) -> None:
        """No trial will ask for a stack any more except a rerun (a cluster slot's pool, whose driver has
        handed out its whole queue; such a pool has no plan to know it by). A stack given back from now on
        is kept as it is, not reset ahead: the run's end tears it down at once instead of waiting for a
        reset that no trial needs, and a rerun that takes it resets it first (``_reset_late``)."""
        with self._cond:
            self._drained = True

    def _reset_late(
        self, stack: PooledStack, on_phase: PhaseCallback | None, timings: dict[str, float]
    ) -> bool:
        """Reset, verify and recreate a stack given back after ``no_more``, for the trial that took it (its
        steps are that trial's ``timings``); False when it could not be proven clean: it is torn down, and
        the trial is told why it gets a new one."""
        try:
            timings.update(self._recycle(stack, on_phase))
        except (ForgeError, OSError) as e:
            if self._unclean(stack, e):
                raise
            return False
        stack.dirty = False
        return True

    def _unclean(self, stack: PooledStack, error: ForgeError | OSError) -> bool:
        """A stack whose reset failed comes down; unless a stop caused it, the next trial of its environment
        is told why it gets a new one (recorded first, so a trial woken by the teardown finds it). True
        when stopping."""
        stopping = isinstance(error, Interrupted) or self.stopping()
        if not stopping:
            log.warning("warm stack %s replaced: %s", stack.name, error)
            with self._cond:
                self._replaced.setdefault(stack.key, []).append(f"{stack.name}: {error}")
        self._destroy(stack, graceful=not stopping)
        return stopping

    def _all_handed(self) -> bool:
        """Every trial of the run's plan was handed a stack and none is asking (a retry would). Under the
        lock."""
        return self.trials is not None and self._handed >= self.trials and not self._asking

    def _retire_idle(self) -> None:
        """Every trial of the run has a stack: the idle ones come down now, in the background (their
        memory is free sooner and the run's end has less to do). Under the lock."""
        spent = [*self._idle, *self._dirty]
        self._idle.clear()
        self._dirty.clear()
        for s in spent:
            job = threading.Thread(
                target=self._destroy, args=(s,), name=f"forge-warm-down-{s.name}", daemon=True
            )
            job.start()
            s.job = job

    # ------------------------------------------------------------------------------------------ spares

    def _spares_wanted(self, key: str) -> int:
        """How many stacks of ``key`` to keep beyond one per worker (``admission.spares_wanted``): only for
        a workload shown to wait, a run with a plan and a directory for a spare's files. Under the lock."""
        if (
            self.trials is None
            or key not in self._spare_for
            or self._last_cpu is None
            or self._last_cpu > WAITING_CPU
        ):
            return 0
        # Until a reset was timed: the warm preparation, the same stop-copy-start cycle on the same machine.
        took = self._resets_s.get(key) or self._prepare_s.get(key)
        reset = statistics.median(took) if took else DEFAULT_RESET
        room = None
        if self.admission is not None and self.admission.budget is not None:
            total = len(self._all) + sum(self._provisioning.values())
            per = self.admission.per_stack
            room = 0 if per is None else max(0, self.admission.budget // per - total)
        busy = [t for n, t in self._busy.items() if n in self._all and self._all[n].key == key]
        left = self.trials - self._handed
        return spares_wanted(
            handed=busy, reset=reset, left=left, room=None if room is None else room + self._extra(key)
        )

    def _extra(self, key: str) -> int:
        """Stacks of ``key`` beyond the ones trials hold: idle, being reset, being provisioned."""
        idle = sum(1 for s in [*self._idle, *self._dirty] if s.key == key)
        resetting = sum(1 for s in self._resetting.values() if s.key == key)
        return idle + resetting + self._provisioning.get(key, 0)

    def _maybe_spare(self) -> None:
        """Provision a spare stack in the background when a waiting workload wants more clean stacks than
        it has (every worker has a stack, no trial is asking for one, as many provisions at once as
        cores)."""
        with self._cond:
            if self._closing or self._drained or self.stopping() or self._asking:
                return
            total = len(self._all) + sum(self._provisioning.values())
            if total < self.workers:
                return
            cores = self.workload.cores if self.workload is not None else 1
            for key, (task, run_id, root, start) in list(self._spare_for.items()):
                if sum(self._provisioning.values()) >= cores:
                    return
                if self._extra(key) >= self._spares_wanted(key):
                    continue
                if self.admission is not None and not self.admission.fits(total):
                    return
                self._provisioning[key] = self._provisioning.get(key, 0) + 1
                self._holding_changed()
                job = threading.Thread(
                    target=self._spare,
                    args=(task, key, run_id, root, start),
                    name="forge-warm-spare",
                    daemon=True,
                )
                self._spares.append(job)
                job.start()
                total += 1

    def _spare(self, task: Task, key: str, run_id: str, root: Path, start: StartFrom | None) -> None:
        t0 = time.monotonic()
        stack: PooledStack | None = None
        try:
            stack = self._provision(
                task, task.environment, key, run_id, None, None, spare_root=root, start=start
            )
        except (ForgeError, OSError) as e:  # provisioning cleaned up after itself; a trial grows instead
            if not self.stopping():
                log.warning("spare warm stack not provisioned: %s", e)
        finally:
            with self._cond:
                self._provisioning[key] -= 1
                self._holding_changed()
                keep = not (self._closing or self.stopping() or self._all_handed())
                if stack is not None:
                    self._provision_s.setdefault(key, []).append(time.monotonic() - t0)
                    if keep:
                        self._idle.append(stack)
                        self._freed[key] = time.monotonic()
                self._cond.notify_all()
        if stack is None:
            return
        if not keep:
            self._destroy(stack, graceful=not self.stopping())
            return
        if self.admission is not None:
            self.admission.measure(key, self.runner, stack.name, timeout=self.timeouts.command)
        self._maybe_spare()

    def close(self) -> None:
        """Tear every warm stack down (the run is over, however it ended): no more spares, the ones under
        way waited for, then every stack at once (a few ``down``s at a time), its background reset or
        teardown waited for first."""
        with self._cond:
            self._closing = True
            spares = list(self._spares)
        for job in spares:
            job.join()
        with self._lock:
            stacks = list(self._all.values())
        errors = []

        def down(s: PooledStack) -> None:
            try:
                self._destroy(s, raise_errors=True)
            except ForgeError as e:
                errors.append(f"{s.name}: {e}")

        if stacks:
            with ThreadPoolExecutor(
                max_workers=min(CLOSE_AT_ONCE, len(stacks)), thread_name_prefix="forge-warm-close"
            ) as ex:
                list(ex.map(down, stacks))
        if errors:
            raise ForgeError("tearing down warm stacks failed:\n" + "\n".join(errors))

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._all)

    def _destroy(self, stack: PooledStack, *, graceful: bool = True, raise_errors: bool = False) -> None:
        with self._lock:
            job = stack.job
        if job is not None and job is not threading.current_thread():
            job.join()  # its reset (or teardown) first; a stop ends its commands, so this is short then
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
            self._holding_changed()
            self._busy.pop(stack.name, None)
            self._resetting.pop(stack.name, None)
            with contextlib.suppress(ValueError):
                self._idle.remove(stack)
            with contextlib.suppress(ValueError):
                self._dirty.remove(stack)
            self._cond.notify_all()
        if self.stacks is not None:
            self.stacks.discard(_live_name(stack.name))

    def _holding_changed(self) -> None:
        """The stacks this pool holds (up, coming up or not yet down) changed: the memory ledger says so now,
        not at the pool's next ask. Under the lock."""
        if self.admission is not None:
            self.admission.pool_holds(len(self._all) + sum(self._provisioning.values()))


def _spare_root(trial_dir: Path) -> Path | None:
    """Where a run's spare stacks keep their files (compose override, logs of a failed provision):
    ``<run>/stacks/`` beside ``<run>/trials/<task>/<index>/``; None elsewhere (no spares: pytest, inspect)."""
    if trial_dir.parent.parent.name != "trials":
        return None
    return trial_dir.parent.parent.parent / "stacks"


def _live_name(name: str) -> str:
    return f"{name} (warm)"
