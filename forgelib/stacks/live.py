"""Signal-safe teardown for ``forge run`` and ``forge provision``: Ctrl-C and SIGTERM never leave a stack up.

Three pieces, small on purpose:

* ``LiveStacks`` — the one registry of the stacks that are up right now, each with its teardown. Whoever
  brought a stack up registers it (``add``) and tears it down through the registry (``teardown``), so a
  stack is torn down once however many parties (the worker, the signal path's sweep) ask: a second caller
  waits for the first, then finds it gone.
* ``interruptible(stacks)`` — a context manager for the main thread. Inside it SIGTERM takes the same path
  as SIGINT. The first signal requests a graceful stop (``StopState.requested``; no new stack can be
  registered) and raises ``KeyboardInterrupt`` in the main thread; when that (or any exception) leaves the
  block, every live stack is torn down gracefully, and the block raises ``Interrupted`` (exit 130). A second
  signal raises ``KeyboardInterrupt`` again, which aborts the graceful teardown in flight (the runner kills
  its ``compose down``) and redoes it, and the rest, without waits (``graceful=False``: e.g.
  ``down --timeout 0``). Further signals are ignored with a note: the hurried teardown is already the
  fastest, and SIGKILL leaves labelled leftovers that ``forge reap`` (or the next ``forge run``) removes.
* ``StopState.guard(runner)`` — a runner that, once a stop is requested, refuses to *launch* anything
  (calls tagged ``up``/``run``/``exec``/``cp``/``start``...) but lets teardown and inspection through
  (``down``, ``rm``, ``logs``, ``ps``, ``inspect``). On each signal the guarded runner kills its in-flight
  launches (a worker blocked in ``up --wait`` or a long oracle ``exec`` cannot otherwise be interrupted:
  signals reach only the main thread); the second signal kills graceful ``down``s too, for the hurried
  sweep to redo without waits. The runner knows what each child is from the tag its caller gave it
  (``ComposeProject`` tags each call with its verb), not from /proc.

How ``forge run`` (``run/execute.py``) uses it::

    stacks = LiveStacks()
    with interruptible(stacks) as stop:        # raises Interrupted(130) after tearing down on a signal
        runner = stop.guard(runner)
        ...                                    # workers: stacks.add(name, teardown) once provisioned,
                                               # stacks.teardown(name) in their teardown phase

``forge provision`` wraps its one ``backend.provision`` call the same way (``--keep``: the stack is never
registered, so a Ctrl-C after provisioning does not remove what the user asked to keep). Catch
``Interrupted`` around the block to record the interruption in the event log, then re-raise.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Unpack

from forgelib.errors import CommandError, Interrupted
from forgelib.runner import Result, Runner, RunOptions

Teardown = Callable[[bool], object]  # called with graceful=True, or False to skip waits (down -t 0)

# Tags (compose verbs) of commands that start something. After a stop these are refused; everything else
# (down, rm, kill, stop, logs, ps, inspect, port...) passes, so teardown and log capture keep working.
LAUNCH_VERBS = frozenset({"up", "run", "exec", "create", "start", "restart", "cp", "build", "pull"})
# Teardown verbs a second signal kills too: a graceful `down` waits out each container's stop timeout.
HURRY_VERBS = frozenset({"down", "stop"})


@dataclass
class TeardownReport:
    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # name -> why
    hurried: bool = False  # a second signal switched to graceful=False


@dataclass
class LiveEntry:
    teardown: Teardown
    lock: threading.Lock = field(default_factory=threading.Lock)  # one teardown of this stack at a time


class LiveStacks:
    """The stacks that are up now, each with its teardown; safe to use from any thread."""

    def __init__(self) -> None:
        # RLock: teardown_all may be re-entered from a signal handler frame in the same (main) thread
        self._lock = threading.RLock()
        self._stacks: dict[str, LiveEntry] = {}
        # a plain bool, set from the signal handler without taking a lock (a handler must never block)
        self.closed = False
        self.hurried = False  # likewise: a second signal; every teardown from now on skips graceful waits
        self.swept = TeardownReport()  # what the stop's sweeps removed or could not, for its summary

    def add(self, name: str, teardown: Teardown, *, started: bool = False) -> None:
        """Register a stack; after a stop request, refuse (nothing new starts) — unless ``started``: it is up
        already, and whoever brought it up tears it down next through ``teardown(name)``."""
        with self._lock:
            if self.closed and not started:
                raise Interrupted(f"stop requested: not starting stack {name}")
            self._stacks[name] = LiveEntry(teardown)

    def discard(self, name: str) -> None:
        with self._lock:
            self._stacks.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._stacks)

    def teardown(self, name: str, graceful: bool = True) -> str | None:
        """Tear ``name`` down unless someone already did; None, or why it failed.

        A failure while stopping keeps the stack registered, so the stop's hurried sweep redoes it instead of
        believing it gone (a second Ctrl-C killed its graceful ``down``); otherwise the stack is forgotten
        (its labels let ``forge reap`` remove it later). An interrupt (``KeyboardInterrupt``) propagates and
        leaves it registered.
        """
        with self._lock:
            entry = self._stacks.get(name)
        if entry is None:
            return None
        with entry.lock:
            graceful = graceful and not self.hurried
            with self._lock:
                if self._stacks.get(name) is not entry:
                    return None  # torn down while we waited
            try:
                entry.teardown(graceful)
            except Exception as e:  # noqa: BLE001 - reported to the caller, never raised past the registry
                if not self.closed:
                    self._forget(name, entry)
                return str(e) or type(e).__name__
            self._forget(name, entry)
            return None

    def _forget(self, name: str, entry: LiveEntry) -> None:
        with self._lock:
            if self._stacks.get(name) is entry:
                del self._stacks[name]

    def teardown_all(self, *, graceful: bool = True) -> TeardownReport:
        """Tear down every live stack (and any registered meanwhile), one at a time, in the calling thread.

        A ``KeyboardInterrupt`` during a graceful teardown switches to ``graceful=False`` and redoes that
        stack; one during a hurried teardown abandons that stack (``forge reap`` removes it later). A
        stack stays registered until its teardown returned, so an interrupt can never lose one.
        """
        self.closed = True
        self.hurried |= not graceful
        report = TeardownReport(hurried=not graceful)
        done: set[str] = set()
        current: str | None = None
        while True:
            try:
                with self._lock:
                    todo = [n for n in sorted(self._stacks) if n not in done]
                if not todo:
                    break
                current = todo[0]
                why = self.teardown(current, graceful)
                if why is None:
                    report.removed.append(current)
                else:
                    report.failed[current] = why.splitlines()[0]
                    self.discard(current)
                done.add(current)
            except KeyboardInterrupt:
                if graceful:
                    graceful, report.hurried, self.hurried = False, True, True  # redo `current` without waits
                elif current is not None:
                    report.failed[current] = "abandoned: interrupted again"
                    self.discard(current)
                    done.add(current)
        self.swept.removed.extend(report.removed)
        self.swept.failed.update(report.failed)
        self.swept.hurried |= report.hurried
        return report


class StopState:
    """Whether a stop was requested; written by the signal handler, read by any thread."""

    def __init__(self) -> None:
        self.signals = 0  # plain int: the handler (main thread) is its only writer
        self.signal_name = ""
        # Set while the main thread sits in library code that an exception can corrupt (concurrent.futures'
        # ``wait`` takes each future's lock in a Python loop; a KeyboardInterrupt between two acquires leaves
        # a lock held, and the worker finishing that future hangs forever). The handler then only records the
        # signal (and kills, as always); the main thread polls ``requested`` and raises at a safe point.
        self.defer = False
        # ``kill_tagged`` of each runner ``guard`` wrapped (a SubprocessRunner): their launches die on a stop
        self._killers: list[Callable[[Iterable[str]], list[int]]] = []

    @property
    def requested(self) -> bool:
        return self.signals > 0

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals inside the block are recorded (and kill, as always) but raise nothing: see ``defer``."""
        self.defer = True
        try:
            yield
        finally:
            self.defer = False

    @property
    def hurry(self) -> bool:
        return self.signals > 1

    def request(self, name: str = "SIGINT") -> list[int]:
        """Record a stop and kill the guarded runners' in-flight launches (and, from the second on, their
        graceful ``down``s); the pids killed. Called from the signal handler: no locks."""
        self.signals += 1
        self.signal_name = self.signal_name or name
        tags = LAUNCH_VERBS | HURRY_VERBS if self.hurry else LAUNCH_VERBS
        return [pid for kill in list(self._killers) for pid in kill(tags)]

    def check(self) -> None:
        """Raise ``Interrupted`` if a stop was requested (for worker threads, between phases)."""
        if self.requested:
            raise Interrupted(f"stop requested ({self.signal_name})")

    def guard(self, runner: Runner) -> Runner:
        kill = getattr(runner, "kill_tagged", None)
        if kill is not None:
            self._killers.append(kill)
        return StopAwareRunner(runner, self)


@dataclass
class StopAwareRunner:
    """A runner that refuses to launch anything once a stop was requested; teardown still works."""

    inner: Runner
    state: StopState

    def run(self, argv: Sequence[str], **options: Unpack[RunOptions]) -> Result:
        tag = options.get("tag", "")
        if self.state.requested and tag in LAUNCH_VERBS:
            raise Interrupted(f"stop requested ({self.state.signal_name}): not running `{tag}`")
        try:
            res = self.inner.run(argv, **options)
        except CommandError as e:
            self._killed(tag, e)
            raise
        if res.rc != 0:
            self._killed(tag, None)
        return res

    def _killed(self, tag: str, error: CommandError | None) -> None:
        """A launch that failed once a stop was requested was (as far as anyone can tell) killed by it: an
        interruption, never a failure of what it ran. Callers that turn a ``CommandError`` into a verdict
        (a golden that could not be captured, a seed that did not apply) then never blame it for Ctrl-C."""
        if self.state.requested and tag in LAUNCH_VERBS:
            raise Interrupted(f"stop requested ({self.state.signal_name}): `{tag}` was stopped") from error


def _note(text: str) -> None:
    print(f"forge: {text}", file=sys.stderr, flush=True)


@contextmanager
def interruptible(stacks: LiveStacks) -> Iterator[StopState]:
    """SIGINT/SIGTERM → graceful stop and teardown of ``stacks``, then ``Interrupted`` (see module doc).

    Outside the main thread signal handlers cannot be installed; the block still tears down on any
    exception. On a normal exit nothing is torn down (``forge provision --keep`` leaves its stack up).
    """
    state = StopState()

    def handler(signum: int, frame: FrameType | None) -> None:
        # Only plain assignments and lock-free kills here: the handler runs between two bytecodes of the
        # main thread, which may hold any lock at that moment.
        state.request(signal.Signals(signum).name)
        stacks.closed = True
        stacks.hurried = stacks.hurried or state.hurry
        if state.signals == 1:
            _note(f"{state.signal_name}: stopping; tearing down live stacks (again to skip graceful waits)")
            if not state.defer:
                raise KeyboardInterrupt
            return
        if state.signals == 2:
            _note("skipping graceful waits; still removing what can be removed")
            if not state.defer:
                raise KeyboardInterrupt
            return
        _note(f"still removing {len(stacks.names())} stack(s); SIGKILL leaves them to `forge reap`")

    previous: dict[signal.Signals, Any] = {}  # whatever was installed: a callable, SIG_DFL, SIG_IGN
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    try:
        try:
            yield state
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt) and not state.requested:
                state.request("SIGINT")  # a KeyboardInterrupt raised without our handler (not main thread)
            stacks.teardown_all(graceful=not state.hurry)
            if not isinstance(e, KeyboardInterrupt | Interrupted):
                raise  # a bug or a user error: stacks are down, the original error is what matters
            raise Interrupted(_summary(state, stacks.swept)) from None
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _summary(state: StopState, report: TeardownReport) -> str:
    parts = [f"interrupted by {state.signal_name or 'SIGINT'}"]
    if report.removed:
        parts.append(f"tore down {len(report.removed)} live stack(s): {', '.join(report.removed)}")
    if report.failed:
        failed = "; ".join(f"{n}: {why}" for n, why in sorted(report.failed.items()))
        parts.append(f"could not tear down {failed} — run `forge reap` once this process has exited")
    return "; ".join(parts)


__all__ = ["LiveStacks", "StopAwareRunner", "StopState", "TeardownReport", "interruptible"]
