"""A task's ``setup:`` step: run once per run on a stack of its own, checkpointed, the stack torn down.

The first trial of a task with a setup asks ``TaskSetups.result``; it walks ``lifecycle.setup_advance``
(provision the task's setup stack, run the step in its service like the oracle, checkpoint the stack,
tear it down) while the task's other trials wait for the same answer. Every trial of the task then
starts from a fork of that checkpoint (``Backend.provision(checkpoint=...)``), or, when the setup failed,
is recorded as failed with the setup's reason and its output's tail, without a stack. The run goes on
with the other tasks. The checkpoint is the run's: the backend removes it as the run ends.

The setup's record, in the run directory: ``setups/<task>/setup.yaml`` (what happened, how long each step
took, the checkpoint), its output (``setup.stdout``, ``setup.stderr``), the stack's service logs when it
failed (``services/``), and a ``setup_finished`` event (summary.json's ``setups``, the report).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Unpack

from forgelib.errors import ForgeError, Interrupted, ProvisionError
from forgelib.grading.gradedoc import write_yaml
from forgelib.run import events as ev
from forgelib.run.lifecycle import Outcome, SetupProgress, SetupStep, setup_advance
from forgelib.run.oracle import run_oracle
from forgelib.runner import FILE_TAIL, file_tail
from forgelib.spec.models import Task
from forgelib.stacks.stack import Stack, TrialRequest

SETUPS_DIR = "setups"
SETUP_FILE = "setup.yaml"
STAGE = "setup"  # the provision stage a trial of a failed setup is recorded under
TAIL_LINES = 20  # lines of the setup's output a failed trial's reason carries


class EventSink(Protocol):
    def append(self, kind: str, **fields: Any) -> dict[str, Any]: ...


class SetupBackend(Protocol):
    """What a setup needs of the orchestrator's backend (``run.execute.Backend`` has it)."""

    def provision(self, task: Task, **trial: Unpack[TrialRequest]) -> Stack: ...
    def checkpoint(self, trial: Stack, run_id: str) -> str: ...
    def capture_logs(self, trial: Stack, dest_dir: Path, tail_lines: int) -> None: ...
    def teardown(self, trial: Stack, *, graceful: bool = True) -> float: ...


@dataclass(frozen=True)
class SetupResult:
    """How a task's setup ended: its checkpoint, or why it failed (with its output's tail)."""

    task: str
    ok: bool
    checkpoint: str | None
    seconds: float
    timings: dict[str, float]
    dir: Path
    error: str | None = None
    tail: str = ""  # the last lines of the setup's output (stderr, then stdout)
    interrupted: bool = False
    teardown_error: str | None = None

    def reason(self) -> str:
        """A trial's reason when the setup failed: the setup's, then its output's tail."""
        text = f"setup of task {self.task!r} failed: {self.error}"
        return text + (f"\nlast lines of its output:\n{self.tail}" if self.tail else "")

    def record(self) -> dict[str, Any]:
        """setup.yaml, and the ``setup_finished`` event's fields."""
        return {
            "task": self.task, "ok": self.ok, "checkpoint": self.checkpoint,
            "seconds": round(self.seconds, 3), "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "error": self.error,
            "log_tail": self.tail, "interrupted": self.interrupted, "teardown_error": self.teardown_error,
            "dir": str(self.dir),
        }  # fmt: skip


@dataclass
class _Walk:
    """The facts one setup gathers while ``setup_advance`` walks it."""

    task: Task
    dir: Path
    stack: Stack | None = None
    checkpoint: str | None = None
    error: str | None = None
    tail: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    teardown_error: str | None = None
    sent_away: bool = False  # the stack's teardown runs in the background


class TaskSetups:
    """Each task's setup, run once (by the first trial that asks), its result kept for the run."""

    def __init__(
        self,
        backend: SetupBackend,
        events: EventSink,
        *,
        run_id: str,
        run_dir: Path,
        say: Callable[[str], None],
        stopping: Callable[[], bool],
        log_tail_lines: int,
        register: Callable[[Stack], None] | None = None,
        teardown: Callable[[Stack], str | None] | None = None,
        background: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        """``register``: the setup stack is up (the run's live stacks: a stop tears it down); ``teardown``:
        remove it, None or why not (default: the backend's, without a registry); ``background``: run a
        succeeded setup's teardown there (off the trials' path: they need only the checkpoint), else
        inline."""
        self.backend = backend
        self.events = events
        self.run_id = run_id
        self.run_dir = run_dir
        self.say = say
        self.stopping = stopping
        self.log_tail_lines = log_tail_lines
        self._register = register or (lambda stack: None)
        self._teardown_stack = teardown or self._down
        self._background = background
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._done: dict[str, SetupResult] = {}

    def result(self, task: Task) -> SetupResult:
        """``task``'s setup result, running it first when no trial did yet (the others wait for it)."""
        with self._lock:
            lock = self._locks.setdefault(task.name, threading.Lock())
        with lock:
            done = self._done.get(task.name)
            if done is None:
                done = self._done[task.name] = self._run(task)
            return done

    def known(self, result: SetupResult) -> None:
        """``result`` is its task's setup's, run elsewhere (a cluster run's: on one node, for every node's
        trials): the task's trials take it as they would their own run's."""
        with self._lock:
            self._done[result.task] = result

    def _run(self, task: Task) -> SetupResult:
        w = _Walk(task, self.run_dir / SETUPS_DIR / task.name)
        w.dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.say(f"{task.name} setup        running once for the task's trials")
        p = SetupProgress()
        while p.step is not SetupStep.DONE:
            outcome = Outcome.INTERRUPTED if self.stopping() and p.step is not SetupStep.TEARDOWN else None
            if outcome is None:
                step_t0 = time.monotonic()
                outcome = self._step(p, w)
                if not (p.step is SetupStep.TEARDOWN and w.sent_away):  # that one took no time here
                    w.timings[p.step.value] = time.monotonic() - step_t0
                if outcome is not Outcome.OK and self.stopping():
                    outcome = Outcome.INTERRUPTED
            nxt = setup_advance(p, outcome)
            if nxt.ok is False and p.ok is None and w.stack is not None and not nxt.interrupted:
                self._capture_logs(w)
            p = nxt
        res = SetupResult(
            task.name, bool(p.ok), w.checkpoint if p.ok else None, time.monotonic() - t0, w.timings, w.dir,
            error=None if p.ok else w.error or ("interrupted" if p.interrupted else "failed"),
            tail=w.tail, interrupted=p.interrupted, teardown_error=w.teardown_error,
        )  # fmt: skip
        write_yaml(w.dir / SETUP_FILE, res.record())
        self.events.append(ev.SETUP_FINISHED, **res.record())
        verdict = f"checkpoint {res.checkpoint}" if res.ok else f"FAILED: {res.error}"
        self.say(f"{task.name} setup        {res.seconds:7.1f}s {verdict}")
        return res

    def _step(self, p: SetupProgress, w: _Walk) -> Outcome:
        """Run the current step; every failure becomes an outcome and ``w.error``."""
        try:
            if p.step is SetupStep.PROVISION:
                return self._provision(w)
            if p.step is SetupStep.RUN:
                return self._run_step(w)
            if p.step is SetupStep.CHECKPOINT:
                assert w.stack is not None
                w.checkpoint = self.backend.checkpoint(w.stack, self.run_id)
                return Outcome.OK
            return self._teardown(w, p.ok)
        except Interrupted:
            w.error = "interrupted"
            return Outcome.INTERRUPTED
        except ProvisionError as e:
            w.error = f"its stack could not be provisioned ({e.stage}): {e.reason}"
            return Outcome.FAILED
        except ForgeError as e:
            w.error = f"{p.step.value}: {e}"
            return Outcome.FAILED

    def _provision(self, w: _Walk) -> Outcome:
        request: TrialRequest = {"run_id": self.run_id, "trial_index": 0, "trial_dir": w.dir, "setup": True}
        w.stack = self.backend.provision(w.task, **request)
        self._register(w.stack)
        return Outcome.OK

    def _run_step(self, w: _Walk) -> Outcome:
        step = w.task.setup
        assert step is not None and w.stack is not None
        r = run_oracle(w.stack.compose, step, timeout=step.timeout, out_dir=w.dir, stem=STAGE)
        if r.ok:
            return Outcome.OK
        w.error = r.error
        w.tail = _tail(w.dir)
        return Outcome.TIMED_OUT if r.timed_out else Outcome.FAILED

    def _teardown(self, w: _Walk, ok: bool | None) -> Outcome:
        assert w.stack is not None
        stack, w.stack = w.stack, None
        if ok and self._background is not None:

            def down() -> None:
                if why := self._teardown_stack(stack):
                    self.say(
                        f"{w.task.name} setup        WARNING its stack {stack.name} was not removed: {why}"
                    )

            self._background(down)
            w.sent_away = True
            return Outcome.OK
        # A failure is recorded beside the setup; the reaper owns what is left.
        w.teardown_error = self._teardown_stack(stack)
        return Outcome.OK

    def _down(self, stack: Stack) -> str | None:
        try:
            self.backend.teardown(stack)
        except ForgeError as e:
            return str(e)
        return None

    def _capture_logs(self, w: _Walk) -> None:
        assert w.stack is not None
        with contextlib.suppress(ForgeError):  # lost diagnostics, not a lost setup
            self.backend.capture_logs(w.stack, w.dir / "services", self.log_tail_lines)


def _tail(d: Path) -> str:
    """The last ``TAIL_LINES`` lines of the setup's stderr and stdout (each when not empty)."""
    parts = []
    for name in (f"{STAGE}.stderr", f"{STAGE}.stdout"):
        text = file_tail(d / name, FILE_TAIL).strip()
        if text:
            parts.append("\n".join(text.splitlines()[-TAIL_LINES:]))
    return "\n".join(parts)


__all__ = ["SETUPS_DIR", "SETUP_FILE", "STAGE", "SetupResult", "TaskSetups"]
