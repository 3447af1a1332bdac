"""The stacks a ``forge run`` gets, local or on a cluster node: the orchestrator's ``Backend``
(``run.execute.Backend``) over real compose stacks, one per ``--stacks`` mode.

* ``DockerBackend`` — fresh stacks (``forgelib.provision``: up, seed, up the rest; from goldens with
  ``snapshots``), the run's shared stacks, and what the run learns about the engine (``ProvisionCache``);
* ``WarmBackend`` — ``--stacks warm``: stacks from a ``forgelib.warm.WarmPool``, reset in place;
* ``make_backend`` — the one place a run's stack source is chosen from its plan.

``forge run`` (``run/cli.py``) and a cluster node (``cluster/node.py``) both get their backend here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Unpack, cast

from forgelib.admission import MIB, Admission, Workload, default_budget, mem_available
from forgelib.custody import reap_dead_owners
from forgelib.errors import ForgeError
from forgelib.provision import (
    FAILURE_FILE,
    ProvisionCache,
    ProvisionedTrial,
    SharedStacks,
    capture_logs,
    out_of_networks,
    provision_trial,
    teardown_trial,
)
from forgelib.run.execute import RunPlan, TrialHandle, TrialRequest
from forgelib.runner import Result, Runner
from forgelib.signals import LiveStacks, StopState
from forgelib.spec.models import LOG_TAIL_LINES, Project, Task, Timeouts
from forgelib.warm import WarmPool


@dataclass(frozen=True)
class DockerBackend:
    """The orchestrator's ``Backend`` on forgelib.provision (real compose stacks). It owns its run's shared
    stacks and what it learns about the engine and the seeds (``ProvisionCache``)."""

    project: Project
    timeouts: Timeouts
    runner: Runner
    log_tail_lines: int = LOG_TAIL_LINES
    shared: SharedStacks = field(default_factory=SharedStacks)
    cache: ProvisionCache = field(default_factory=ProvisionCache)
    profiles: tuple[str, ...] = ()  # the run config's compose profiles
    snapshots: bool = False  # start reset services of fresh stacks from goldens (forgelib.snapshots)
    admission: Admission | None = None  # the run's memory budget: a stack counts from its ask to its `down`

    def provision(self, task: Task, **trial: Unpack[TrialRequest]) -> TrialHandle:
        waited = 0.0
        handle: ProvisionedTrial | None = None
        while handle is None:
            waited += self.admission.enter() if self.admission is not None else 0.0
            try:
                handle = provision_trial(
                    self.project,
                    task,
                    **trial,
                    timeouts=self.timeouts,
                    runner=self.runner,
                    log_tail_lines=self.log_tail_lines,
                    shared=self.shared,
                    cache=self.cache,
                    profiles=self.profiles,
                    snapshots=self.snapshots,
                )
            except BaseException as e:
                if self.admission is not None:
                    self.admission.leave()
                    # Docker's network address pools are full: wait for a stack of this run to come down
                    # (at most as many as it holds now from here on) and provision again.
                    if out_of_networks(e) and self.admission.limited(self.admission.held):
                        (trial["trial_dir"] / FAILURE_FILE).unlink(missing_ok=True)
                        continue
                raise
        if self.admission is not None:
            self.admission.measure("fresh", self.runner, handle.name, timeout=self.timeouts.command)
            pool = {"decision": "fresh", "memory_wait": round(waited, 3), **self.admission.figures()}
            handle = dataclasses.replace(
                handle,
                timings={**handle.timings, "memory_wait": round(waited, 3)},
                stack={**handle.stack, "pool": pool},
            )
        return handle

    def capture_logs(self, trial: TrialHandle, dest_dir: Path, tail_lines: int) -> None:
        capture_logs(cast(ProvisionedTrial, trial), dest_dir, tail_lines)

    def teardown(self, trial: TrialHandle, *, graceful: bool = True) -> float:
        try:
            return teardown_trial(cast(ProvisionedTrial, trial), graceful=graceful)
        finally:
            if self.admission is not None:
                self.admission.leave()

    def run_host(
        self, argv: Sequence[str], *, timeout: float, cwd: Path, env: Mapping[str, str], input: str | None
    ) -> Result:
        return self.runner.run(argv, timeout=timeout, cwd=cwd, env=env, input=input, check=False)

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
        return self.runner.run(
            argv, timeout=timeout, cwd=cwd, env=env, stdin=stdin, stdout_path=stdout_path,
            stderr_path=stderr_path, secrets=secrets, check=False, tag="run",
        )  # fmt: skip

    def discard_leftovers(self, run_id: str) -> None:
        report = reap_dead_owners(self.runner, run_id)
        if report.failed:
            raise ForgeError(
                f"cannot resume {run_id}: leftovers of the killed session remain:\n{report.table()}"
            )

    def finish_run(self, run_id: str) -> None:
        try:
            self.shared.teardown_run(run_id)
        finally:
            self.cache.builds.finish(self.runner, self.timeouts.command)


@dataclass(frozen=True)
class WarmBackend(DockerBackend):
    """``--stacks warm``: trials get stacks from a ``WarmPool`` (reset in place, verified, or replaced);
    an environment whose services are all ``shared`` keeps its one run-wide stack as in fresh mode."""

    pool: WarmPool | None = None

    def provision(self, task: Task, **trial: Unpack[TrialRequest]) -> TrialHandle:
        if self.pool is None or not task.environment.requires_per_trial:
            return super().provision(task, **trial)
        return self.pool.acquire(
            task, run_id=trial["run_id"], trial_dir=trial["trial_dir"], on_phase=trial.get("on_phase")
        )

    def teardown(self, trial: TrialHandle, *, graceful: bool = True) -> float:
        t = cast(ProvisionedTrial, trial)
        if self.pool is None or t.stack.get("mode") != "warm":
            return super().teardown(trial, graceful=graceful)
        return self.pool.release(t, graceful=graceful)

    def finish_run(self, run_id: str) -> None:
        try:
            if self.pool is not None:
                self.pool.close()
        finally:
            super().finish_run(run_id)


STACK_MODES = ("fresh", "warm")


def make_backend(
    plan: RunPlan,
    project: Project,
    profiles: Sequence[str],
    runner: Runner,
    stacks: LiveStacks | None,
    stop: StopState | None,
    *,
    snapshots: bool = False,
    memory_budget_mb: int | None = None,
) -> DockerBackend:
    """The backend for ``plan.stacks`` (``profiles``: the run config's compose profiles); ``memory_budget_mb``
    None: the default budget (admission). A plan without tasks (a cluster slot's: the driver keeps the
    queue) does not tell the warm pool how many trials come."""
    cfg_timeouts, tail = plan.timeouts, plan.log_tail_lines
    stopping = (lambda: stop.requested) if stop is not None else (lambda: False)
    budget = memory_budget_mb * MIB if memory_budget_mb else default_budget(mem_available())
    admission = Admission(budget, stopping=stopping)
    profiles = tuple(profiles)
    if plan.stacks != "warm":
        return DockerBackend(
            project, cfg_timeouts, runner, tail, profiles=profiles, snapshots=snapshots, admission=admission
        )
    cache = ProvisionCache()
    pool = WarmPool(
        project, cfg_timeouts, runner, workers=plan.workers, cache=cache, log_tail_lines=tail, stacks=stacks,
        profiles=profiles, stopping=stopping, admission=admission, workload=Workload(),
        trials=None if plan.resume or not plan.tasks else len(plan.tasks) * plan.repeats,
    )  # fmt: skip
    return WarmBackend(
        project,
        cfg_timeouts,
        runner,
        tail,
        profiles=profiles,
        snapshots=snapshots,
        cache=cache,
        pool=pool,
        admission=admission,
    )


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


__all__ = ["STACK_MODES", "DockerBackend", "WarmBackend", "heal_leftovers", "make_backend"]
