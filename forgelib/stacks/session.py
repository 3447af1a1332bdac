"""``open``: the one way a front end gets stacks (``forge run``, ``forge provision``, the pytest plugin, the
inspect sandbox, a cluster node).

What it owns, for every front end alike:

* **signals** — the live-stack registry (``signals.LiveStacks``) and the stop (``signals.StopState``);
  with ``signals=True`` SIGINT/SIGTERM tear the live stacks down (``signals.interruptible``); without, the
  host stops it (inspect's task cleanup, a cluster driver's stop level) through ``Stacks.stop``;
* **healing** — the leftovers of dead forge processes go first (``heal_leftovers``), when asked;
* **the memory budget and the start bound** — one ``Admission`` for every backend it hands out, with the
  engine's start places and memory ledger (``stacks.slots``), so they hold across forge processes;
* **teardown** — on leaving, every warm pool is closed, every stack still registered torn down, the
  images built for ``build:`` services removed (unless ``kept``).

It hands out backends (``stacks.backends.DockerBackend``: ``Stacks.backend`` for the project it was opened
with, ``Stacks.backend_of`` for another project or mode, as the pytest plugin needs per scope).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from forgelib.errors import ForgeError
from forgelib.runner import Runner, SubprocessRunner
from forgelib.spec.models import LOG_TAIL_LINES, Project, Timeouts
from forgelib.stacks import backends
from forgelib.stacks.backends import DockerBackend
from forgelib.stacks.budget import (
    DEFAULT_SHARE,
    MIB,
    Admission,
    Workload,
    mem_available,
    usable_cores,
)
from forgelib.stacks.live import LiveStacks, StopState, interruptible
from forgelib.stacks.provision import ProvisionCache, StackContext
from forgelib.stacks.shared import SharedStacks
from forgelib.stacks.slots import MemoryLedger, StartSlots, engine_dir
from forgelib.stacks.warm import WarmPool

Mode = Literal["fresh", "warm"]
Scope = Literal["run", "stack"]
SCOPES: tuple[Scope, ...] = ("run", "stack")
# A warm pool whose consumer asks one stack at a time (a pytest process): it keeps a stack of every
# environment it meets, as many as the memory budget holds, and evicts an idle one when it is full.
EVERY_ENVIRONMENT = sys.maxsize


def engine_budget(available: int | None, others: int) -> int | None:
    """The default memory budget: ``DEFAULT_SHARE`` of what is free now plus what other forge processes'
    stacks hold (they count against it through the ledger, so they must count in it too)."""
    return None if available is None else int((available + others) * DEFAULT_SHARE)


class Stacks:
    """What ``open`` hands a front end: its backends, the registry and the stop, the shared budget."""

    def __init__(
        self,
        project: Project | None,
        *,
        mode: Mode,
        scope: Scope,
        runner: Runner,
        stop: StopState,
        live: LiveStacks,
        admission: Admission,
        ledger: MemoryLedger | None,
        timeouts: Timeouts,
        log_tail_lines: int,
        profiles: tuple[str, ...],
        goldens: bool,
        kept: bool,
        work_dir: Path | None,
        workers: int | None,
        trials: int | None,
    ) -> None:
        self.project = project
        self.mode: Mode = mode
        self.scope: Scope = scope
        self.stop = stop
        self.live = live
        self.admission = admission
        self.runner = runner  # guarded: after a stop nothing new is launched; teardown still passes
        self.timeouts = timeouts
        self.log_tail_lines = log_tail_lines
        self.profiles = profiles
        self.goldens = goldens
        self.kept = kept
        self.work_dir = work_dir
        self.workers = workers
        self.trials = trials
        self.cache = ProvisionCache()  # what provisioning learns once, for every backend handed out
        # ``run``: an environment whose services are all ``shared`` is one stack for everything opened
        # here; ``stack``: each stack its own (``forge provision``: there is no run to share it with).
        self.shared = SharedStacks() if scope == "run" else None
        self.left: list[str] = []  # what ``close`` could not tear down
        self._ledger = ledger
        self._backends: list[DockerBackend] = []
        self._default: DockerBackend | None = None

    @property
    def backend(self) -> DockerBackend:
        """The backend of the project and mode ``open`` was given."""
        if self._default is None:
            if self.project is None:
                raise ForgeError("stacks opened without a project: ask backend_of(project)")
            self._default = self.backend_of(self.project)
        return self._default

    def backend_of(
        self, project: Project, *, mode: Mode | None = None, workers: int | None = None
    ) -> DockerBackend:
        """A backend of ``project`` over these stacks' cache, shared stacks, budget and registry; ``mode``
        (default: ``open``'s) ``warm`` gives it a warm pool of its own, of ``workers`` stacks (default:
        ``open``'s; None there too: ``EVERY_ENVIRONMENT``)."""
        ctx = StackContext(
            project, self.timeouts, self.runner, self.cache, self.log_tail_lines, self.profiles,
            goldens=self.goldens, kept=self.kept, work_dir=self.work_dir,
        )  # fmt: skip
        pool = None
        if (mode or self.mode) == "warm":
            workers = workers or self.workers
            pool = WarmPool(
                ctx,
                workers=workers or EVERY_ENVIRONMENT,
                stacks=self.live,
                stopping=lambda: self.stop.requested,
                admission=self.admission,
                # Spares ahead only where several consumers ask at once; one at a time never waits for one.
                workload=Workload() if workers else None,
                trials=self.trials,
            )
        backend = DockerBackend(ctx, shared=self.shared, admission=self.admission, pool=pool)
        self._backends.append(backend)
        return backend

    def heal(self, say: Callable[[str], None]) -> None:
        """Remove what dead forge processes left (``heal_leftovers``), saying what went."""
        backends.heal_leftovers(self.runner, say)

    def close(self, *, graceful: bool = True) -> list[str]:
        """Every warm pool closed, every stack still registered torn down, the built images removed (unless
        ``kept``); what could not be (also in ``left``)."""
        failed: list[str] = []
        for backend in self._backends:
            try:
                backend.close_warm()
            except ForgeError as e:
                failed.append(str(e))
        report = self.live.teardown_all(graceful=graceful)
        failed += [f"{name}: {why}" for name, why in sorted(report.failed.items())]
        if not self.kept:  # a kept stack keeps the image it runs; removing the stack is the user's call
            try:
                self.cache.builds.finish(self.runner, self.timeouts.command)
            except ForgeError as e:
                failed.append(str(e))
        if self._ledger is not None:
            self._ledger.close()
        self.left += failed
        return failed


@contextlib.contextmanager
def _hosted(live: LiveStacks) -> Iterator[StopState]:
    """No signal handlers: the host stops the stacks (``Stacks.stop``), and ``close`` tears them down."""
    yield StopState()


@contextlib.contextmanager
def open(
    project: Project | None,
    *,
    mode: Mode = "fresh",
    scope: Scope = "run",
    runner: Runner | None = None,
    timeouts: Timeouts | None = None,
    log_tail_lines: int = LOG_TAIL_LINES,
    profiles: Sequence[str] = (),
    goldens: bool = False,
    workers: int | None = None,
    trials: int | None = None,
    memory_budget_mb: int | None = None,
    signals: bool = True,
    heal: Callable[[str], None] | None = None,
    kept: bool = False,
    work_dir: Path | None = None,
    slots: int | None = None,
    say: Callable[[str], None] | None = None,
) -> Iterator[Stacks]:
    """Stacks of ``project`` (None: ask ``backend_of`` per project), ``mode`` fresh or warm, ``scope`` run
    (all-``shared`` environments: one stack for everything opened here) or stack (each its own).

    ``workers``: how many trials ask at once (a warm pool's size); ``trials``: how many will (None: not
    known). ``memory_budget_mb`` None: ``engine_budget``. ``signals``: SIGINT/SIGTERM tear the stacks down
    (main thread only); ``heal``: remove dead processes' leftovers first, saying what went. ``kept`` and
    ``work_dir``: ``forge provision --keep``'s labels. ``slots``: start places on the engine (default:
    the usable cores). What could not be torn down on leaving goes to ``say`` (and ``Stacks.left``)."""
    timeouts = timeouts or Timeouts()
    base = runner or SubprocessRunner(default_timeout=timeouts.command)
    live = LiveStacks()
    try:
        where = engine_dir()
        ledger = MemoryLedger(where)
    except OSError as e:
        raise ForgeError(
            f"cannot use forge's state directory for this engine ({e}); make $XDG_STATE_HOME (default "
            "~/.local/state) writable, or point XDG_STATE_HOME at a writable directory"
        ) from None
    try:
        with interruptible(live) if signals else _hosted(live) as stop:
            if memory_budget_mb:
                budget: int | None = memory_budget_mb * MIB
            else:
                budget = engine_budget(mem_available(), ledger.others())
            admission = Admission(
                budget,
                starts=usable_cores(),
                stopping=lambda: stop.requested,
                slots=StartSlots(where, slots or usable_cores()),
                ledger=ledger,
            )
            stacks = Stacks(
                project, mode=mode, scope=scope, runner=stop.guard(base), stop=stop, live=live,
                admission=admission, ledger=ledger, timeouts=timeouts, log_tail_lines=log_tail_lines,
                profiles=tuple(profiles), goldens=goldens, kept=kept, work_dir=work_dir, workers=workers,
                trials=trials,
            )  # fmt: skip
            try:
                if heal is not None:
                    stacks.heal(heal)
                yield stacks
            finally:
                for line in stacks.close(graceful=not stop.hurry):
                    if say is not None:
                        say(f"could not tear down {line}; `forge reap` removes it once this process exited")
    finally:
        ledger.close()


__all__ = ["EVERY_ENVIRONMENT", "SCOPES", "Mode", "Scope", "Stacks", "engine_budget", "open"]
