"""A ``WarmPool`` without an engine, driven only through its public surface (acquire / release / names).

A stack "comes up" in ``provision`` seconds of a fake clock (the pool module's ``time.monotonic``) as a
compose project of a ``FakeRunner``, so what the pool decides (reuse, first, grow, ahead, wait, evict) is
read off what it hands out, what it provisions and what it tears down, never off its private state. With
``hold_provisions()`` each provision blocks until ``let_provisions()``: provisions in flight at once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from forgelib.admission import Admission, Workload
from forgelib.compose import ComposeProject
from forgelib.errors import Interrupted
from forgelib.provision import ProvisionedTrial, StackContext
from forgelib.spec.models import EnvironmentManifest, Isolation, Service, Task, Timeouts
from forgelib.testing import FakeRunner
from forgelib.warm import pool as pool_mod


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def task(service: str = "db") -> Task:
    """A task whose environment is one reset service (tasks of different services: other environments)."""
    env = EnvironmentManifest((Path("/x/compose.yaml"),), {service: Service(service, Isolation.RESET)})
    return Task(f"t-{service}", Path("/x/task.yaml"), "", env)


def decision(trial: ProvisionedTrial) -> str:
    return str(trial.stack["pool"]["decision"])


class PoolHarness:
    """A pool (``workers``, ``trials``, ``workload``, ``admission``) whose stacks take ``provision`` fake
    seconds to come up."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        *,
        provision: float = 7.0,
        workers: int = 4,
        trials: int | None = None,
        workload: Workload | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.clock = Clock()
        self.provisioned: list[str] = []  # stack names, in the order their provisioning started
        self.handed: list[ProvisionedTrial] = []  # what `waits` got when it did not wait
        self.fake = FakeRunner()
        self.fake.expect("docker", "compose")  # `down` of a torn-down stack
        self._looks: dict[int, list[bool]] = {}  # thread -> scripted answers of `stopping` (then True)
        self._gate: threading.Event | None = None
        self._entered = threading.Semaphore(0)
        clock, fake, lock = self.clock, self.fake, threading.Lock()

        def provision_stack(ctx: Any, spec: Any, steps: Any, *, on_phase: Any = None) -> ProvisionedTrial:
            with lock:
                self.provisioned.append(spec.name)
            gate = self._gate
            self._entered.release()
            if gate is not None:
                gate.wait(timeout=30)
            with lock:
                clock.now += provision
            compose = ComposeProject(spec.name, (), fake)
            config = {"services": {}}
            return ProvisionedTrial(spec.name, spec.env, compose, {}, {}, spec.trial_dir, config=config)

        monkeypatch.setattr(pool_mod, "time", SimpleNamespace(monotonic=clock.monotonic, time=time.time))
        monkeypatch.setattr(pool_mod, "provision_stack", provision_stack)
        ctx = StackContext(SimpleNamespace(name="p"), Timeouts(), fake)  # type: ignore[arg-type]
        self.pool = pool_mod.WarmPool(
            ctx,
            workers=workers,
            trials=trials,
            stopping=self._stopping,
            workload=workload,
            admission=admission,
        )

    def _stopping(self) -> bool:
        looks = self._looks.get(threading.get_ident())
        if looks is None:
            return False
        return looks.pop(0) if looks else True

    def acquire(self, t: Task | None = None, *, looks: int = 20) -> ProvisionedTrial:
        """A stack; a trial still waiting at the pool's ``looks``-th look (~0.5 s each) ends ``Interrupted``
        (a test never hangs on a wait it did not expect)."""
        me = threading.get_ident()
        self._looks[me] = [False] * (looks - 1)
        try:
            return self.pool.acquire(t or task(), run_id="r", trial_dir=Path("/t"))
        finally:
            del self._looks[me]

    def waits(self, t: Task | None = None) -> bool:
        """Whether a trial asking now waits for a release (the wait ends at the pool's second look at
        ``stopping``) rather than getting a stack; nothing is provisioned either way when it waits."""
        before = len(self.provisioned)
        try:
            trial = self.acquire(t, looks=2)
        except Interrupted:
            assert len(self.provisioned) == before
            return True
        self.handed.append(trial)
        return False

    def hold(self, trial: ProvisionedTrial, seconds: float) -> None:
        self.clock.now += seconds
        self.pool.release(trial)

    def downs(self) -> list[str]:
        return [c.argv[c.argv.index("--project-name") + 1] for c in self.fake.calls if "down" in c.argv]

    # ------------------------------------------------------------------------- provisions in flight

    def hold_provisions(self) -> None:
        self._gate = threading.Event()

    def let_provisions(self) -> None:
        assert self._gate is not None
        self._gate.set()
        self._gate = None

    def acquire_in_background(self) -> tuple[threading.Thread, list[ProvisionedTrial]]:
        """An acquire on its own thread that has started provisioning when this returns (its result in the
        list once the thread is joined)."""
        out: list[ProvisionedTrial] = []
        thread = threading.Thread(target=lambda: out.append(self.acquire()), daemon=True)
        thread.start()
        assert self._entered.acquire(timeout=10), "the acquire did not start provisioning"
        return thread, out
