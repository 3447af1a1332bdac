"""Stacks for a front end that lives inside another program's process: inspect's sandbox, a harbor
environment. The host owns the signals and the lifecycle (inspect's task cleanup, the end of harbor's
event loop), calls in from its worker threads, and may cancel a trial at any moment; forge owns
everything else, opened as ``forge run`` opens its stacks (``stacks.open`` without signal handlers).

One ``HostedStacks`` per project and mode in a process: a run id naming its stacks on their labels, an
owned temp dir for the trials' override files and logs (the reaper removes it once the process is gone),
``acquire`` / ``release`` per trial, and ``close``, which waits for the acquires in flight (a provisioning
cut short cleans up after itself) and leaves nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
import shutil
import threading
from pathlib import Path

from forgelib import clients
from forgelib.docker.labels import owned_temp_dir
from forgelib.errors import ForgeError, Interrupted
from forgelib.runner import Runner, SubprocessRunner
from forgelib.spec.models import Project, Task, Timeouts
from forgelib.stacks.session import Mode
from forgelib.stacks.session import open as open_stacks
from forgelib.stacks.stack import Stack

log = logging.getLogger("forgelib.stacks")


class HostedStacks:
    """The stacks of one project in one mode inside a host's process. Thread-safe."""

    def __init__(
        self,
        project: Project,
        *,
        mode: Mode,
        goldens: bool,
        workers: int,
        timeouts: Timeouts,
        run_prefix: str,
        temp_prefix: str,
        host: str,
        runner: Runner | None = None,
    ) -> None:
        self.project = project
        self.mode = mode
        self.goldens = goldens
        self.timeouts = timeouts
        self.run_id = f"{run_prefix}-{secrets.token_hex(4)}"
        self._temp_prefix = temp_prefix
        self._host = host  # who is stopping, in messages: "the eval", "the harbor run"
        self._stopping = False
        self._lock = threading.Lock()
        self._busy = threading.Condition()  # guards _inflight: acquires running now (close waits for them)
        self._inflight = 0
        self._index = itertools.count()
        self._root: Path | None = None
        # The runner is guarded as forge run's is: once the host stops, nothing new is launched and what is
        # in flight (an `up`, an agent's long `exec`) is killed, so a cancelled trial's abandoned thread
        # ends at once instead of holding the host's exit.
        self._closing = contextlib.ExitStack()
        self.opened = self._closing.enter_context(
            open_stacks(
                project,
                mode=mode,
                runner=runner or SubprocessRunner(default_timeout=timeouts.command),
                timeouts=timeouts,
                goldens=goldens,
                workers=workers,
                signals=False,
            )
        )
        self.stop = self.opened.stop
        self.runner = self.opened.runner
        self.live = self.opened.live
        self.backend = self.opened.backend

    def start(self) -> None:
        """Heal the leftovers of dead owners and load the clients that resets and goldens talk through."""
        self.opened.heal(lambda line: log.warning("forge: %s", line))
        if self.mode == "warm" or self.goldens:
            clients.load()

    def root(self) -> Path:
        with self._lock:
            if self._root is None:
                self._root = owned_temp_dir(self._temp_prefix)
            return self._root

    def acquire(self, task: Task) -> Stack:
        """A seeded stack for one trial: fresh, or a warm one reset and fingerprint-verified (a stack not
        proven clean is replaced). Raises ``ProvisionError`` (forge's reason; nothing left behind)."""
        with self._busy:
            if self._stopping:
                raise Interrupted(f"{self._host} is stopping: no new stacks")
            self._inflight += 1
        try:
            return self._acquire(task)
        finally:
            with self._busy:
                self._inflight -= 1
                self._busy.notify_all()

    def _acquire(self, task: Task) -> Stack:
        index = next(self._index)
        trial = self.backend.provision(
            task, run_id=self.run_id, trial_index=index, trial_dir=self.root() / str(index)
        )
        assert isinstance(trial, Stack)
        if self._stopping:  # the host stopped meanwhile (its trial cancelled): nobody will use it
            self.backend.teardown(trial, graceful=False)
            raise Interrupted(f"{self._host} is stopping: {trial.name} torn down")
        try:  # registered until given back, so close tears down one a cancelled trial dropped
            self.live.add(
                trial.name, lambda graceful: self.backend.teardown(trial, graceful=graceful), started=True
            )
            trial.trial_dir.mkdir(parents=True, exist_ok=True)  # a warm stack's next trial: not made yet
        except BaseException:
            self.backend.teardown(trial, graceful=False)
            raise
        return trial

    def release(self, trial: Stack, *, graceful: bool = True) -> None:
        """The trial is over: a warm stack goes back to its pool (reset before the next trial), a fresh
        one is torn down; not ``graceful`` (the trial failed or was cut short): torn down either way."""
        why = self.live.teardown(trial.name, graceful=graceful)
        if why is not None:
            raise ForgeError(f"tearing down {trial.name} failed: {why}; `forge reap` removes it")

    def close(self) -> None:
        """Every stack torn down (warm pool, shared stacks, any trial's still registered), built images
        removed, the temp dir gone; a ``ForgeError`` naming what could not be."""
        with self._busy:
            self._stopping = True
        self.stop.request(f"{self._host}'s end")  # in-flight launches killed, new ones refused
        with self._busy:  # a provisioning cut short cleans up after itself (its `down` is not refused)
            self._busy.wait_for(lambda: self._inflight == 0, timeout=self.timeouts.teardown)
        errors: list[str] = []
        try:
            self.backend.finish_run(self.run_id)
        except ForgeError as e:
            errors.append(str(e))
        self._closing.close()  # every stack still registered, the warm pool, the built images
        errors += self.opened.left
        with self._lock:
            root, self._root = self._root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
        if errors:
            raise ForgeError("forge: cleanup left (`forge reap` removes them):\n" + "\n".join(errors))


__all__ = ["HostedStacks"]
