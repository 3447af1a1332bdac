"""A ``WarmPool`` without an engine, driven only through its public surface (acquire / release / names).

A stack "comes up" in ``provision`` seconds of a fake clock (the pool module's ``time.monotonic``) as a
compose project of a ``FakeRunner``, so what the pool decides (reuse, first, grow, ahead, wait, evict) is
read off what it hands out, what it provisions and what it tears down, never off its private state. With
``hold_provisions()`` each provision blocks until ``let_provisions()``: provisions in flight at once.

Each stack has one reset service whose reset (the pool's reset ahead, in the background, after a release)
takes ``reset`` fake seconds and is scripted through what ``provision_stack`` hands the pool (the trial's
``prepared`` seeds): ``fail_reset(name, why)`` makes a stack's resets fail, ``hold_resets()`` blocks every
reset until ``let_resets()``; ``resets_started`` / ``resets_done`` list them, ``settle()`` waits for the
pool's background resets and teardowns (its ``forge-warm-*`` threads) to end.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from forgelib.docker.compose import ComposeProject
from forgelib.errors import Interrupted
from forgelib.spec.models import EnvironmentManifest, Isolation, Service, Task, Timeouts
from forgelib.stacks.budget import Admission, Workload
from forgelib.stacks.provision import StackContext
from forgelib.stacks.stack import Stack
from forgelib.stacks.warm import DirtyStack
from forgelib.stacks.warm import pool as pool_mod
from forgelib.testing import FakeRunner

_harnesses = itertools.count()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def task(service: str = "db") -> Task:
    """A task whose environment is one reset service (tasks of different services: other environments)."""
    env = EnvironmentManifest((Path("/x/compose.yaml"),), {service: Service(service, Isolation.RESET)})
    return Task(f"t-{service}", Path("/x/task.yaml"), "", env)


def decision(trial: Stack) -> str:
    return str(trial.source["pool"]["decision"])


class PoolHarness:
    """A pool (``workers``, ``trials``, ``workload``, ``admission``) whose stacks take ``provision`` fake
    seconds to come up."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        *,
        provision: float = 7.0,
        reset: float = 0.5,
        prepare: float | None = None,
        workers: int = 4,
        trials: int | None = None,
        workload: Workload | None = None,
        admission: Admission | None = None,
        goldens: bool = False,
        snapshots: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """``goldens``: the pool's context has them on; ``snapshots``: what each provisioning's steps did
        (``Stack.snapshots``)."""
        self.clock = Clock()
        self.provisioned: list[str] = []  # stack names, in the order their provisioning started
        self.steps: dict[str, Any] = {}  # stack name -> the provisioning steps it came up with
        self.handed: list[Stack] = []  # what `waits` got when it did not wait
        self.fake = FakeRunner()
        self.fake.expect("docker", "compose")  # `down` of a torn-down stack
        self._looks: dict[int, list[bool]] = {}  # thread -> scripted answers of `stopping` (then True)
        self._gate: threading.Event | None = None
        self._entered = threading.Semaphore(0)
        self.resets_started: list[str] = []  # stack names, as each reset started
        self.resets_done: list[str] = []  # ... and as each one ended (failed or not)
        self.down_mid_reset: list[str] = []  # stacks torn down before their reset had ended
        self._reset_fails: dict[str, str] = {}  # stack name -> why its resets fail
        self._reset_gate: threading.Event | None = None
        self._reset_entered = threading.Semaphore(0)
        self._asking: dict[int, threading.Event] = {}  # thread -> set at its first look at `stopping`
        clock, fake, lock = self.clock, self.fake, threading.Lock()

        def provision_stack(ctx: Any, spec: Any, steps: Any, *, on_phase: Any = None) -> Stack:
            with lock:
                self.provisioned.append(spec.name)
                self.steps[spec.name] = steps
            gate = self._gate
            if gate is not None:  # only a held provision counts for `acquire_in_background`
                self._entered.release()
                gate.wait(timeout=30)
            with lock:
                clock.now += provision
            compose = ComposeProject(spec.name, (), fake)
            config = {"services": {}}
            seed = self._seed(spec.name, reset, lock)
            timings = {} if prepare is None else {"warm_prepare": prepare}  # the reset services' seeding
            return Stack(
                spec.name,
                spec.env,
                compose,
                timings,
                {},
                spec.trial_dir,
                config=config,
                prepared=(seed,),
                snapshots=dict(snapshots or {}),
            )

        monkeypatch.setattr(pool_mod, "time", SimpleNamespace(monotonic=clock.monotonic, time=time.time))
        monkeypatch.setattr(pool_mod, "provision_stack", provision_stack)
        # A project of its own: its stacks' names (and background threads) are this harness's only.
        project: Any = SimpleNamespace(name=f"p{next(_harnesses)}")
        ctx = StackContext(project, Timeouts(), fake, goldens=goldens)
        self.pool = pool_mod.WarmPool(
            ctx,
            workers=workers,
            trials=trials,
            stopping=self._stopping,
            workload=workload,
            admission=admission,
        )

    def _seed(self, name: str, seconds: float, lock: threading.Lock) -> Any:
        """The stack's one reset service as the pool sees it (a ``PreparedSeed``'s reset and check)."""

        def reset() -> None:
            with lock:
                self.resets_started.append(name)
            self._reset_entered.release()
            gate = self._reset_gate
            try:
                if gate is not None:
                    gate.wait(timeout=30)  # (never let go: a failed test's; it ends, and so does this)
                with lock:
                    self.clock.now += seconds
                if name in self._reset_fails:
                    raise DirtyStack(self._reset_fails[name])
            finally:
                with lock:
                    self.resets_done.append(name)
                    if name in self.downs():
                        self.down_mid_reset.append(name)

        ctx = SimpleNamespace(service="db")
        return SimpleNamespace(ctx=ctx, reset=reset, restarts=False, baseline={}, fingerprint=dict)

    def _stopping(self) -> bool:
        asking = self._asking.get(threading.get_ident())
        if asking is not None:
            asking.set()
        looks = self._looks.get(threading.get_ident())
        if looks is None:
            return False
        return looks.pop(0) if looks else True

    def acquire(
        self,
        t: Task | None = None,
        *,
        looks: int = 20,
        trial_dir: Path = Path("/t"),
        start: pool_mod.StartFrom | None = None,
    ) -> Stack:
        """A stack (a trial in ``trial_dir``: one under ``<run>/trials/`` lets the pool keep spares); a
        trial still waiting at the pool's ``looks``-th look (~0.5 s each) ends ``Interrupted`` (a test never
        hangs on a wait it did not expect)."""
        me = threading.get_ident()
        self._looks[me] = [False] * (looks - 1)
        try:
            return self.pool.acquire(t or task(), run_id="r", trial_dir=trial_dir, start=start)
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

    def hold(self, trial: Stack, seconds: float) -> None:
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

    def acquire_in_background(self) -> tuple[threading.Thread, list[Stack]]:
        """An acquire on its own thread that has started a held provision when this returns (its result in
        the list once the thread is joined): call it after ``hold_provisions``. Only held provisions count,
        so an earlier one (the pool's first stack) never stands in for this thread's."""
        out: list[Stack] = []
        thread = threading.Thread(target=lambda: out.append(self.acquire()), daemon=True)
        thread.start()
        assert self._entered.acquire(timeout=10), "the acquire did not start provisioning"
        return thread, out

    # ------------------------------------------------------------------------- resets ahead

    def fail_reset(self, name: str, why: str) -> None:
        self._reset_fails[name] = why

    def hold_resets(self) -> None:
        self._reset_gate = threading.Event()

    def let_resets(self) -> None:
        assert self._reset_gate is not None
        self._reset_gate.set()
        self._reset_gate = None

    def reset_started(self) -> None:
        """Wait until one more reset has started (a held one: it is under way, not done)."""
        assert self._reset_entered.acquire(timeout=10), "no reset started"

    def settle(self) -> None:
        """Wait for this pool's background resets and teardowns under way to end, and for the spares being
        provisioned (those a spare starts as it ends too)."""
        ours = {f"forge-warm-{job}-{name}" for name in self.provisioned for job in ("reset", "down")}
        ours.add("forge-warm-spare")
        while True:
            running = [t for t in threading.enumerate() if t.name in ours and t.is_alive()]
            if not running:
                return
            for thread in running:
                thread.join(timeout=30)
                assert not thread.is_alive(), f"{thread.name} did not end"

    def ask_in_background(self, *, looks: int = 20) -> tuple[threading.Thread, list[Stack]]:
        """An acquire on its own thread that found no clean stack and is waiting when this returns (it has
        looked at ``stopping`` once); its result in the list once the thread is joined."""
        out: list[Stack] = []
        looked = threading.Event()

        def ask() -> None:
            self._asking[threading.get_ident()] = looked
            try:
                out.append(self.acquire(looks=looks))
            finally:
                del self._asking[threading.get_ident()]

        thread = threading.Thread(target=ask, daemon=True)
        thread.start()
        assert looked.wait(timeout=10), "the acquire did not wait"
        return thread, out
