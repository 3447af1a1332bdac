"""The shared source: a run's shared stacks (environments whose services are all ``shared``), one per
(run, compose files), brought up by the first trial that needs it through the fresh pipeline (plain: no
recipes, since only reset services have seeds; no goldens), torn down once the run is over."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from forgelib.docker import labels as lab
from forgelib.docker.compose import project_name
from forgelib.errors import ForgeError
from forgelib.spec.models import EnvironmentManifest, Project
from forgelib.stacks.provision import StackContext, StackPlan, TrialSpec, provision_stack
from forgelib.stacks.stack import Stack


class SharedStacks:
    """A run's shared stacks. Owned by the run's backend (``stacks.backends``), which tears them down once
    the run is over; a trial's ``teardown_trial`` leaves them up (``Stack.shared``)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._stacks: dict[tuple[str, str], Stack] = {}

    def acquire(self, ctx: StackContext, trial: TrialSpec) -> Stack:
        """The run's shared stack of ``trial``'s environment; the first trial that asks brings it up."""
        env = trial.environment(ctx.project)
        spec = StackPlan(
            env,
            shared_name(ctx.project, trial.run_id, env),
            lab.run_labels(trial.run_id, "shared"),
            trial.trial_dir,
            shared=True,
        )
        make = lambda: provision_stack(ctx, spec, on_phase=trial.on_phase)  # noqa: E731
        return self.get((trial.run_id, _files_key(env)), make, trial.trial_dir)

    def get(self, key: tuple[str, str], make: Callable[[], Stack], trial_dir: Path) -> Stack:
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
