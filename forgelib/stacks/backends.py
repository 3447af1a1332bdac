"""The stacks a front end gets, local or on a cluster node: the orchestrator's ``Backend``
(``run.execute.Backend``) over real compose stacks, and the one place that decides which stack a trial gets.

A backend has up to three sources, each with ``acquire`` (a trial's stack) and ``release`` (give it back):

* ``FreshSource`` — the trial's own stack (``provision.provision_trial``: up, seed, up the rest; from
  goldens when the context says so, ``provision.GoldenSteps``), torn down after it;
* ``SharedSource`` — an environment whose services are all ``shared``: the run's one stack of it
  (``stacks.shared.SharedStacks``), torn down when the run ends;
* ``WarmSource`` — ``--stacks warm``: a ``forgelib.stacks.warm.WarmPool`` stack, reset in place between
  trials (a trial of a task with ``setup:``: one started from, and reset to, the setup's checkpoint).

``DockerBackend._source`` picks one per environment, the same way for a stack handed out and given back.
Every front end gets its backend from ``stacks.open`` (``stacks.session``), which builds it with the
memory budget, the start bound and the live-stack registry.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Unpack

from forgelib.errors import ForgeError
from forgelib.runner import Result, Runner
from forgelib.spec.models import EnvironmentManifest, Task
from forgelib.stacks.budget import Admission
from forgelib.stacks.provision import (
    FAILURE_FILE,
    StackContext,
    TrialSpec,
    capture_logs,
    out_of_networks,
    provision_stack,
    provision_trial,
    teardown_trial,
)
from forgelib.stacks.reaper import reap_dead_owners
from forgelib.stacks.runcheckpoints import RunCheckpoints
from forgelib.stacks.shared import SharedStacks
from forgelib.stacks.stack import Stack, TrialRequest
from forgelib.stacks.warm import StartFrom, WarmPool


class StackSource(Protocol):
    """One way a trial gets a stack."""

    def acquire(self, task: Task, trial: TrialSpec) -> Stack:
        """A seeded stack for ``trial``; raises ``ProvisionError`` only after logs and teardown."""
        ...

    def release(self, trial: Stack, *, graceful: bool) -> float:
        """The trial is over: the seconds giving its stack back took."""
        ...


@dataclass(frozen=True)
class FreshSource:
    """Each trial its own stack (from goldens with ``ctx.goldens``), torn down after it; with a memory
    budget, a stack counts from its ask to its ``down``, and at most ``admission.starts`` come up at once."""

    ctx: StackContext
    admission: Admission | None = None

    checkpoints: RunCheckpoints | None = None  # where a fork's checkpoint is found (``trial.checkpoint``)

    def acquire(self, task: Task, trial: TrialSpec) -> Stack:
        def make() -> Stack:
            if trial.checkpoint is None:
                return provision_trial(self.ctx, trial)
            steps = (self.checkpoints or RunCheckpoints()).steps(self.ctx, trial.checkpoint)
            return provision_stack(self.ctx, trial.stack(self.ctx), steps, on_phase=trial.on_phase)

        return _admitted(self.ctx, self.admission, trial, make, start=True)

    def release(self, trial: Stack, *, graceful: bool) -> float:
        try:
            if graceful and self.admission is not None:
                self.admission.settle(trial.name)  # once per environment: its footprint's measurement
            return teardown_trial(trial, graceful=graceful)
        finally:
            if self.admission is not None:
                self.admission.leave()


@dataclass(frozen=True)
class SharedSource:
    """The run's one stack of an all-``shared`` environment; giving it back leaves it up (``shared``
    tears it down at the run's end)."""

    ctx: StackContext
    shared: SharedStacks
    admission: Admission | None = None

    def acquire(self, task: Task, trial: TrialSpec) -> Stack:
        # not a start: the run's one stack of it comes up once, and every other trial only looks it up
        return _admitted(self.ctx, self.admission, trial, lambda: self.shared.acquire(self.ctx, trial))

    def release(self, trial: Stack, *, graceful: bool) -> float:
        if self.admission is not None:
            self.admission.leave()
        return 0.0


@dataclass(frozen=True)
class WarmSource:
    """A warm stack (``forgelib.stacks.warm``): reset and verified, or replaced by a fresh one."""

    pool: WarmPool
    ctx: StackContext | None = None
    checkpoints: RunCheckpoints | None = None  # where a trial's checkpoint is found (``trial.checkpoint``)

    def acquire(self, task: Task, trial: TrialSpec) -> Stack:
        start = None
        if (cid := trial.checkpoint) is not None:  # a setup task's trial: from its checkpoint, reset to it
            ctx, checkpoints = self.ctx or self.pool.ctx, self.checkpoints or RunCheckpoints()
            start = StartFrom(cid, lambda: checkpoints.warm_steps(ctx, cid))
        return self.pool.acquire(
            task, run_id=trial.run_id, trial_dir=trial.trial_dir, on_phase=trial.on_phase, start=start
        )

    def release(self, trial: Stack, *, graceful: bool) -> float:
        return self.pool.release(trial, graceful=graceful)


def _admitted(
    ctx: StackContext,
    admission: Admission | None,
    trial: TrialSpec,
    make: Callable[[], Stack],
    *,
    start: bool = False,
) -> Stack:
    """``make()`` inside the memory budget: it waits for room first, and with ``start`` for one of the
    run's start places (``Admission.starting``). What it waited for goes on the handle's record: the budget's
    figures (``stack.pool``), ``timings.memory_wait`` and ``start_wait``, and their sum as ``stack_wait``
    (the trial's queueing, as a warm pool records it: ``run.ready``)."""
    if admission is None:
        return make()
    memory = queued = 0.0
    handle: Stack | None = None
    while handle is None:
        memory += admission.enter()
        try:
            with admission.starting() if start else contextlib.nullcontext(0.0) as waited:
                queued += waited
                handle = make()
        except BaseException as e:
            admission.leave()
            # Docker's network address pools are full: wait for a stack of this run to come down (at most
            # as many as it holds now from here on) and provision again.
            if out_of_networks(e) and admission.limited(admission.held):
                (trial.trial_dir / FAILURE_FILE).unlink(missing_ok=True)
                continue
            raise
    admission.measure("fresh", ctx.runner, handle.name, timeout=ctx.timeouts.command)
    waits = {"memory_wait": round(memory, 3), "start_wait": round(queued, 3)}
    pool = {"decision": "fresh", **waits, **admission.figures()}
    return dataclasses.replace(
        handle,
        timings={**handle.timings, **waits, "stack_wait": round(memory + queued, 3)},
        source={**handle.source, "pool": pool},
    )


@dataclass(frozen=True)
class DockerBackend:
    """The orchestrator's ``Backend`` on real compose stacks: what its stacks share (``ctx``: the project,
    runner, timeouts, the cache of what it learns about the engine and the seeds), the run's shared stacks
    (None: none, e.g. ``forge provision``, where an all-shared environment gets its own stack), its memory
    budget, and with ``pool`` warm stacks instead of fresh ones."""

    ctx: StackContext
    shared: SharedStacks | None = field(default_factory=SharedStacks)
    admission: Admission | None = None  # the run's memory budget (fresh and shared stacks; the pool's own)
    pool: WarmPool | None = None  # --stacks warm
    checkpoints: RunCheckpoints = field(default_factory=RunCheckpoints)  # the run's own (tasks' setups)

    def _source(self, env: EnvironmentManifest, *, own: bool = False) -> StackSource:
        """Which stack a trial of ``env`` gets — decided here only, from the environment and the backend,
        so a stack given back goes to the source it came from: all ``shared`` services, the run's shared
        stack; else a warm stack when the backend has a pool; else a fresh one. ``own``: a stack of its own
        whatever the mode (a task's setup stack; given back: one the warm pool never held)."""
        if self.shared is not None and not env.requires_per_trial:
            return SharedSource(self.ctx, self.shared, self.admission)
        if self.pool is not None and not own:
            return WarmSource(self.pool, self.ctx, self.checkpoints)
        return FreshSource(self.ctx, self.admission, self.checkpoints)

    def provision(self, task: Task, **trial: Unpack[TrialRequest]) -> Stack:
        spec = TrialSpec(task, **trial)
        return self._source(task.environment, own=spec.setup).acquire(task, spec)

    def checkpoint(self, trial: Stack, run_id: str) -> str:
        """Checkpoint ``trial`` (a task's setup stack) as ``run_id``'s own: removed as the run ends
        (``finish_run``), or by ``forge reap`` once this process is gone. Its id."""
        return self.checkpoints.take(self.ctx, trial, run_id)

    def teardown(self, trial: Stack, *, graceful: bool = True) -> float:
        """Give the stack back to its source: torn down (fresh), left up (shared), reset for the next trial
        (warm; torn down when ``graceful`` is False)."""
        return self._source(trial.environment, own=not trial.pooled).release(trial, graceful=graceful)

    def capture_logs(self, trial: Stack, dest_dir: Path, tail_lines: int) -> None:
        capture_logs(trial, dest_dir, tail_lines)

    def run_host(
        self, argv: Sequence[str], *, timeout: float, cwd: Path, env: Mapping[str, str], input: str | None
    ) -> Result:
        return self.ctx.runner.run(argv, timeout=timeout, cwd=cwd, env=env, input=input, check=False)

    def launch_host(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        cwd: Path,
        env: Mapping[str, str],
        stdin: Path,
        stdout_path: Path,
        stderr_path: Path,
        secrets: Sequence[str],
    ) -> Result:
        # Tagged `run` (a launch verb): a stop refuses it, and kills its process group while it runs.
        return self.ctx.runner.run(
            argv, timeout=timeout, cwd=cwd, env=env, stdin=stdin, stdout_path=stdout_path,
            stderr_path=stderr_path, secrets=secrets, check=False, tag="run",
        )  # fmt: skip

    def discard_leftovers(self, run_id: str) -> None:
        report = reap_dead_owners(self.ctx.runner, run_id)
        if report.failed:
            raise ForgeError(
                f"cannot resume {run_id}: leftovers of the killed session remain:\n{report.table()}"
            )

    def no_more(self) -> None:
        """Only reruns will ask for stacks from now on (``WarmPool.no_more``); fresh stacks skip nothing."""
        if self.pool is not None:
            self.pool.no_more()

    def close_warm(self) -> None:
        """Tear the warm pool's stacks down (a pytest scope's end; ``finish_run`` does it at a run's)."""
        if self.pool is not None:
            self.pool.close()

    def finish_run(self, run_id: str) -> None:
        """The run is over: its warm stacks, its shared stacks, its built images go."""
        try:
            if self.pool is not None:
                self.pool.close()
        finally:
            try:
                if self.shared is not None:
                    self.shared.teardown_run(run_id)
            finally:
                try:
                    self.checkpoints.finish(self.ctx)
                finally:
                    self.ctx.cache.builds.finish(self.ctx.runner, self.ctx.timeouts.command)


STACK_MODES = ("fresh", "warm")


def heal_leftovers(runner: Runner, say: Callable[[str], None]) -> None:
    """A crashed earlier run heals itself: remove stacks whose owner is provably gone (``forge reap``'s
    rules; live owners, other hosts and unproven owners are kept), and ``say``
    what was removed. ``forge run`` calls it at start, the pytest plugin before a process's first stack,
    the inspect sandbox at ``task_init``."""
    try:
        report = reap_dead_owners(runner)
    except ForgeError as e:  # healing is a courtesy to earlier runs: it never stops this one
        say(f"warning: could not look for leftovers of dead forge processes: {e}")
        return
    if report.removed or report.failed:
        say(f"removed leftovers of dead forge processes:\n{report.table()}")


__all__ = [
    "STACK_MODES",
    "DockerBackend",
    "FreshSource",
    "SharedSource",
    "StackSource",
    "WarmSource",
    "heal_leftovers",
]
