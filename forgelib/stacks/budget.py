"""How many stacks a run may hold at once: a memory budget, and whether its trials wait more than they work.

Two questions every backend asks before it brings another stack up, answered by pure functions over
measured figures (unit-tested with made-up ones) and two small stateful holders:

* **Memory** (``Admission``): a run's stacks may together use at most ``budget`` bytes. One stack's
  footprint is measured on the run's first stack (``docker stats --no-stream`` through the runner, idle
  right after provisioning); until then ``ASSUMED_STACK`` stands in. A stack counts from the moment it is
  asked for until its teardown has finished (a stack coming down still holds its memory). The first stack is
  always admitted, so a budget below one stack slows a run to one stack at a time, never to a halt.
  The default budget is ``DEFAULT_SHARE`` of the machine's ``MemAvailable`` when the run starts.
* **Starts** (``Admission.starting``): at most ``starts`` of a run's stacks come up at once (default: the
  cores this process may use, ``usable_cores``), the rest queue; with ``slots`` (``stacks.slots``), at most
  that many of every forge process on the engine between them. Bringing a stack up is CPU (Docker's
  namespaces and networks, a database's ``initdb``, readiness probes); more at once only slow each other
  down, until healthy services' probes run past their timeouts and the stacks fail (benchmarks/README.md,
  "Agent-shaped load"). The warm pool keeps the same bound on its own provisions (``WarmPool._ahead``,
  ``_maybe_spare``) and holds a start place for each. With a ``ledger`` (``stacks.slots.MemoryLedger``) the
  budget is the engine's: what the stacks of other live forge processes hold counts against it, and this
  process's holding is published for them.
* **Workload** (``Workload``, ``stacks_wanted``): host CPU (this process and the commands it waited for)
  per second a stack is held by a trial. A trial that spends its stack's time waiting on a model uses a
  few hundredths of a core; an oracle-only trial, a sixth of one or more (the rest of its CPU is the
  engine's and the containers', which this figure leaves out). ``stacks_wanted`` turns the figure into how
  many stacks the cores can keep busy: a waiting workload gets one per worker (provisioned ahead, several at
  once); a CPU-bound one keeps the warm pool's older rule (``WarmPool._grow``).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Protocol

from forgelib import engineapi
from forgelib.docker import argv as dk
from forgelib.errors import ForgeError, Interrupted
from forgelib.runner import Runner

MIB = 1024 * 1024
DEFAULT_SHARE = 0.8  # of MemAvailable at the run's start: the rest stays for the host and forge itself
ASSUMED_STACK = 512 * MIB  # one stack's footprint until the first one is measured (reference packs: < 200)
MEASURE_ATTEMPTS = 3  # stacks of an environment measured at most until one gives a figure
SETTLE_LIMIT = 10.0  # seconds a stack's teardown waits at most for its measurement (one engine sample)
# Host CPU seconds (forge and the commands it waited for) per second a trial holds a stack, above which a
# workload counts as working rather than waiting: between what oracle-only trials and an agent waiting on a
# model cost per held second (benchmarks/README.md, "Figures behind the code's choices").
WAITING_CPU = 0.1
MIN_OBSERVED = 1.0  # held seconds before the CPU figure means anything


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity, which a container's cpuset narrows), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


# --------------------------------------------------------------------------------------------- memory
def parse_meminfo(text: str) -> int | None:
    """``MemAvailable`` of /proc/meminfo, in bytes; None when the kernel does not report it."""
    m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def mem_available(path: Path = Path("/proc/meminfo")) -> int | None:
    try:
        return parse_meminfo(path.read_text())
    except OSError:
        return None


def default_budget(available: int | None) -> int | None:
    """The budget when the run config and the command line give none: a share of what is free now."""
    return None if available is None else int(available * DEFAULT_SHARE)


def admits(holding: int, per_stack: int | None, budget: int | None) -> bool:
    """Whether one more stack fits beside ``holding`` (asked for, up, or coming down). No budget: always;
    no stack yet: always (a run must move); else ``(holding + 1) * footprint <= budget``."""
    if budget is None or holding <= 0:
        return True
    return (holding + 1) * (per_stack or ASSUMED_STACK) <= budget


def capacity(per_stack: int | None, budget: int | None) -> int | None:
    """How many stacks the budget holds (at least one); None without a budget."""
    if budget is None:
        return None
    return max(1, budget // (per_stack or ASSUMED_STACK))


_UNITS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": MIB, "gb": 1000**3, "gib": 1024**3}


def parse_size(text: str) -> int:
    """``docker stats``' ``12.5MiB`` (or ``1.2GiB``, ``800kB``) in bytes; ValueError for anything else."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]+)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_stats(out: str) -> dict[str, int]:
    """container name -> memory in use, from ``docker stats --no-stream --format '{{.Name}}\\t{{.MemUsage}}'``
    (``MemUsage`` is ``used / limit``); lines that do not parse are skipped."""
    usage: dict[str, int] = {}
    for line in out.splitlines():
        name, _, mem = line.partition("\t")
        used = mem.split("/")[0]
        try:
            usage[name.strip()] = parse_size(used)
        except ValueError:
            continue
    return usage


def stack_memory(runner: Runner, project: str, *, timeout: float) -> dict[str, int]:
    """container name -> memory in use (RSS + kernel memory, without page cache: docker's own figure) of
    every running container of compose project ``project``; empty when it has none."""
    ps = runner.run(
        dk.ps(quiet=True, filter=f"label=com.docker.compose.project={project}"),
        timeout=timeout,
    )
    ids = ps.stdout.split()
    if not ids:
        return {}
    res = runner.run(dk.stats(ids, no_stream=True, format=engineapi.MEMORY_FORMAT), timeout=timeout)
    return parse_stats(res.stdout)


class EngineSlots(Protocol):
    """Start places shared by the forge processes on one engine (``stacks.slots.StartSlots``)."""

    def hold(self, stopping: Callable[[], bool] = ...) -> AbstractContextManager[float]: ...


class EngineLedger(Protocol):
    """What the other forge processes' stacks on the engine hold (``stacks.slots.MemoryLedger``)."""

    def publish(self, held: int) -> None: ...
    def others(self) -> int: ...


class Admission:
    """The memory budget of one run, shared by whatever brings its stacks up (the warm pool, fresh trials).

    ``enter`` waits until one more stack fits and counts it; ``leave`` uncounts it once its teardown is over.
    The warm pool counts its own stacks and asks ``fits``. ``measure`` takes one stack's footprint once
    (per ``key``), on a thread of its own, so no trial waits for ``docker stats``; the stack's teardown
    waits for it (``settle``). ``starting`` holds one of ``starts`` places while a fresh stack comes up
    (None: no bound), and one of the engine's ``slots``.
    With a ``ledger``, what other forge processes' stacks hold counts against the budget."""

    def __init__(
        self,
        budget: int | None,
        *,
        starts: int | None = None,
        stopping: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        slots: EngineSlots | None = None,
        ledger: EngineLedger | None = None,
    ) -> None:
        self.budget = budget
        self.starts = starts
        self.slots = slots
        self.ledger = ledger
        self._pool_held = 0  # the warm pool's stacks, as it last asked ``fits``
        self._starting = 0
        self.stopping = stopping
        self.clock = clock
        self.per_stack: int | None = None
        self.footprints: dict[str, dict[str, int]] = {}  # key -> container -> bytes, as measured
        # The most stacks the engine held at once for this run when it ran out of network address pools
        # (``limited``); None: no such limit met.
        self.limit: int | None = None
        self._held = 0
        self._measuring: set[str] = set()  # measured, or being measured
        self._attempts: dict[str, int] = {}
        self._inflight: dict[str, threading.Event] = {}  # project -> its measurement's end
        self._cond = threading.Condition()

    def fits(self, holding: int) -> bool:
        """Whether one more stack fits beside the warm pool's ``holding`` (the pool counts its own stacks:
        what it holds goes on the ledger as it asks, and as it changes: ``pool_holds``)."""
        self.pool_holds(holding)
        return self._fits(holding)

    def pool_holds(self, holding: int) -> None:
        """The warm pool holds ``holding`` stacks now (those coming up and coming down included): on the
        ledger at once, so other processes never wait for memory a torn-down stack gave back, nor count
        without one that is coming up."""
        if self.ledger is not None and holding != self._pool_held:
            self._pool_held = holding
            self._publish()

    def _fits(self, holding: int) -> bool:
        """Whether one more stack fits beside ``holding`` of this process's and, with a ledger, beside what
        the other processes' stacks hold (a process's first stack is always admitted, so each one moves)."""
        if self.limit is not None and holding >= self.limit:
            return False
        budget = self.budget
        if budget is not None and self.ledger is not None:
            budget -= self.ledger.others()
        return admits(holding, self.per_stack, budget)

    def _publish(self) -> None:
        if self.ledger is not None:
            self.ledger.publish(max(self._held, self._pool_held) * (self.per_stack or ASSUMED_STACK))

    def limited(self, holding: int) -> bool:
        """The engine could not make a stack's network beside ``holding`` others of the run: at most that
        many from now on (at least one). False when it held none (nothing of ours to wait for)."""
        if holding <= 0:
            return False
        with self._cond:
            self.limit = holding if self.limit is None else min(self.limit, holding)
            self._cond.notify_all()
        return True

    def enter(self, hopeless: Callable[[], str | None] = lambda: None) -> float:
        """Count one more stack, first waiting until it fits; the seconds waited (0.0 when it fitted at
        once: reading the ledger is no wait). Raises ``Interrupted`` when the run stops meanwhile, and
        ``ForgeError`` with ``hopeless()``'s text when that says the wait cannot end (checked while it
        waits: a caller whose own stacks fill the budget and are given back only once all are up)."""
        waited = 0.0
        with self._cond:
            if not self._fits(self._held):
                t0 = self.clock()
                while not self._fits(self._held):
                    if self.stopping():
                        raise Interrupted("stopping: no stack admitted")
                    if (why := hopeless()) is not None:
                        raise ForgeError(why)
                    self._cond.wait(timeout=0.5)
                waited = self.clock() - t0
            self._held += 1
            self._publish()
        return waited

    def leave(self) -> None:
        with self._cond:
            self._held = max(0, self._held - 1)
            self._publish()
            self._cond.notify_all()

    @contextmanager
    def starting(self) -> Iterator[float]:
        """Hold one of ``starts`` places while a stack comes up, first waiting for one (then for one of the
        engine's ``slots``); yields the seconds waited. Raises ``Interrupted`` when the run stops
        meanwhile."""
        queued = 0.0  # a place free at once is no wait
        with self._cond:
            if self.starts is not None and self._starting >= self.starts:
                t0 = self.clock()
                while self._starting >= self.starts:
                    if self.stopping():
                        raise Interrupted("stopping: no stack started")
                    self._cond.wait(timeout=0.5)
                queued = self.clock() - t0
            self._starting += 1
        try:
            with self.slots.hold(self.stopping) if self.slots is not None else nullcontext(0.0) as slot_wait:
                yield queued + slot_wait
        finally:
            with self._cond:
                self._starting -= 1
                self._cond.notify_all()

    @property
    def held(self) -> int:
        with self._cond:
            return self._held

    def recorded(self, key: str, usage: Mapping[str, int]) -> None:
        """One stack's measured containers: the largest stack so far is the footprint every stack counts."""
        total = sum(usage.values())
        with self._cond:
            self.footprints[key] = dict(usage)
            if total > 0:
                self.per_stack = max(self.per_stack or 0, total)
            self._publish()
            self._cond.notify_all()

    def measure(self, key: str, runner: Runner, project: str, *, timeout: float) -> None:
        """Measure ``project``'s containers in the background, once per ``key`` (an environment). A
        measurement that found nothing or failed is taken again from the next stack of ``key``, up to
        ``MEASURE_ATTEMPTS`` times; ``settle`` holds ``project``'s teardown until it is over."""
        with self._cond:
            if key in self._measuring or self._attempts.get(key, 0) >= MEASURE_ATTEMPTS:
                return
            self._measuring.add(key)
            self._attempts[key] = self._attempts.get(key, 0) + 1
            done = self._inflight[project] = threading.Event()

        def work() -> None:
            usage: Mapping[str, int] = {}
            with contextlib.suppress(Exception):  # a figure we could not take: the assumed one stays
                usage = stack_memory(runner, project, timeout=timeout)
            try:
                if sum(usage.values()) > 0:
                    self.recorded(key, usage)
                else:
                    with self._cond:
                        self._measuring.discard(key)
            finally:  # only now: the next stack of ``key``, once this one is down, measures again
                with self._cond:
                    self._inflight.pop(project, None)
                done.set()

        threading.Thread(target=work, name="forge-footprint", daemon=True).start()

    def settle(self, project: str, limit: float = SETTLE_LIMIT) -> None:
        """Wait (at most ``limit`` seconds) for a measurement of ``project`` still under way: a stack taken
        down under it gives no figure, and a run of short trials would never get one."""
        with self._cond:
            done = self._inflight.get(project)
        if done is not None:
            done.wait(limit)

    def figures(self) -> dict[str, float | int | None]:
        """The budget, one stack's footprint (None until measured) and the stacks counted now, in MiB:
        what each ``stack_acquired`` event carries."""
        with self._cond:
            per_stack, held = self.per_stack, self._held
        return {
            "budget_mb": None if self.budget is None else round(self.budget / MIB),
            "per_stack_mb": None if per_stack is None else round(per_stack / MIB, 1),
            "held": held,
            **({"network_limit": self.limit} if self.limit is not None else {}),
        }

    def describe(self) -> dict[str, object]:
        """What summary.json and the report say about the budget."""
        return {
            "budget_mb": None if self.budget is None else round(self.budget / MIB),
            "per_stack_mb": None if self.per_stack is None else round(self.per_stack / MIB, 1),
            "capacity": capacity(self.per_stack, self.budget),
            "footprints_mb": {
                k: {c: round(b / MIB, 1) for c, b in sorted(v.items())} for k, v in self.footprints.items()
            },
        }


# ------------------------------------------------------------------------------------------- workload
def process_cpu() -> float:
    """CPU seconds of this process and of the children it has waited for (docker, compose)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def stacks_wanted(
    *,
    workers: int,
    cores: int,
    cpu_per_held: float | None,
    hold: float,
    provision: float | None,
    demand: int | None = None,
) -> int | None:
    """How many stacks a workload shown to wait warrants, or None when it is not shown to: then the warm
    pool's own rule (``WarmPool._grow``) decides, as for an oracle-only run.

    Shown to wait: at most ``WAITING_CPU`` host CPU per held second, and trials still to serve: with a plan,
    ``demand`` > 0 trials that no stack is handed to or on its way for; without one (pytest), trials held at
    least as long as a provision takes (``hold``, the longest one in flight counting as a lower bound, >=
    ``provision``: ski rental). Such a workload gets as many stacks as the cores keep busy at its CPU per
    held second, at most ``workers``."""
    if cpu_per_held is None or provision is None or cpu_per_held > WAITING_CPU:
        return None
    if demand is None and hold < provision:
        return None
    if demand is not None and demand <= 0:
        return None
    return max(1, min(workers, math.floor(cores / max(cpu_per_held, 1e-3))))


def spares_wanted(*, handed: Sequence[float], reset: float, left: int, room: int | None = None) -> int:
    """How many clean stacks a waiting workload keeps beyond the ones its trials hold, so that a trial that
    asks right as another gives its stack back (a worker's next trial asks at once) gets one already reset.

    ``handed``: when each stack in use now was handed out. Trials that hold their stacks alike give them
    back as close together as they got them, and a stack is clean again ``reset`` seconds after its
    release: so as many spares as the most hand-outs within any ``reset`` seconds (at least one), no more
    than the ``left`` trials still to be handed a stack, nor than the memory budget's ``room`` (None:
    unbounded)."""
    if left <= 0 or not handed:
        return 0
    times = sorted(handed)
    most, start = 1, 0
    for end, t in enumerate(times):
        while t - times[start] > reset:
            start += 1
        most = max(most, end - start + 1)
    wanted = min(most, left)
    return wanted if room is None else max(0, min(wanted, room))


class Workload:
    """Host CPU per held stack-second over a run: fed each stack's hand-out and release, and the clock."""

    def __init__(
        self,
        *,
        cpu: Callable[[], float] = process_cpu,
        clock: Callable[[], float] = time.monotonic,
        cores: int | None = None,
    ) -> None:
        self.cpu = cpu
        self.clock = clock
        self.cores = cores or usable_cores()
        self._start: tuple[float, float] | None = None  # (clock, cpu) at the first hand-out
        self._released = 0.0  # held seconds of stacks given back

    def handed(self) -> None:
        if self._start is None:
            self._start = (self.clock(), self.cpu())

    def released(self, held: float) -> None:
        self._released += max(0.0, held)

    def cpu_per_held(self, in_flight: Sequence[float]) -> float | None:
        """CPU seconds per second of stack holding since the first hand-out, ``in_flight`` being how long
        each stack in use now has been held; None until ``MIN_OBSERVED`` held seconds."""
        if self._start is None:
            return None
        held = self._released + sum(in_flight)
        if held < MIN_OBSERVED:
            return None
        return max(0.0, self.cpu() - self._start[1]) / held
