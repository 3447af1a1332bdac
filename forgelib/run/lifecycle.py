"""The trial state machine: phases, transitions, termination reasons, what is retryable. No I/O.

The orchestrator asks ``advance`` what comes next after every phase; the fold over ``events.jsonl`` and
the summary use ``is_finished``/``status_of``/``is_failed_attempt`` so the rules live in one place.

    PENDING -> PROVISIONING -> ORACLE -> GRADING -> [CAPTURE_LOGS] -> TEARDOWN -> DONE
                    |             |                                   ^
                    |             +--(error/timeout)--> CAPTURE_LOGS -+
                    +--(ProvisionError)--> DONE   (provisioning already captured logs and tore down)

An interruption before a phase skips straight to TEARDOWN when a stack is up, else to DONE.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class Phase(StrEnum):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    ORACLE = "oracle"
    GRADING = "grading"
    CAPTURE_LOGS = "capture_logs"
    TEARDOWN = "teardown"
    DONE = "done"


class Termination(StrEnum):
    COMPLETED = "COMPLETED"  # graded; the grade says pass or fail
    PROVISION_ERROR = "PROVISION_ERROR"  # the stack could not be provisioned; the oracle never ran
    ORACLE_ERROR = "ORACLE_ERROR"  # the oracle exited non-zero (or could not be started)
    ORACLE_TIMEOUT = "ORACLE_TIMEOUT"  # the oracle outlived its timeout and was killed
    INTERNAL_ERROR = "INTERNAL_ERROR"  # a bug in forgelib while running this trial
    INTERRUPTED = "INTERRUPTED"  # Ctrl-C: not finished, `--resume` runs it again


class Outcome(StrEnum):
    """How the phase just run ended."""

    OK = "ok"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    INTERRUPTED = "interrupted"
    CRASHED = "crashed"  # an unexpected exception in our own code


# A provisioning failure is a property of the pack (a broken seed, a bad compose file): running it again
# gives the same answer, so it is not retryable. A timeout or an interruption may not recur.
_RETRYABLE = frozenset({Termination.ORACLE_TIMEOUT, Termination.INTERRUPTED, Termination.INTERNAL_ERROR})


@dataclass(frozen=True)
class Flow:
    """What about the task and the run config shapes the path through the phases."""

    has_oracle: bool
    capture_logs_on_success: bool = False


@dataclass(frozen=True)
class Progress:
    phase: Phase = Phase.PENDING
    termination: Termination | None = None  # set once the end is known; final when phase is DONE
    stack_up: bool = False  # a provisioned stack exists and still needs teardown
    passed: bool | None = None  # the grade, once graded


def start() -> Progress:
    return Progress()


def advance(flow: Flow, p: Progress, outcome: Outcome, *, passed: bool | None = None) -> Progress:
    """The state after the current phase ended with ``outcome`` (``passed``: the grade, after GRADING)."""
    if p.phase is Phase.DONE:
        raise ValueError("a finished trial does not advance")
    if outcome is Outcome.INTERRUPTED:
        # Whatever was running, an interruption keeps only the teardown (when there is something to remove).
        if p.phase is Phase.TEARDOWN or not p.stack_up:
            return replace(p, phase=Phase.DONE, termination=Termination.INTERRUPTED, stack_up=False)
        return replace(p, phase=Phase.TEARDOWN, termination=Termination.INTERRUPTED)
    if outcome is Outcome.CRASHED:
        term = p.termination or Termination.INTERNAL_ERROR
        if p.stack_up and p.phase is not Phase.TEARDOWN:
            return replace(p, phase=Phase.TEARDOWN, termination=term)
        return replace(p, phase=Phase.DONE, termination=term, stack_up=False)

    if p.phase is Phase.PENDING:
        return replace(p, phase=Phase.PROVISIONING)
    if p.phase is Phase.PROVISIONING:
        if outcome is Outcome.OK:
            return replace(p, phase=Phase.ORACLE if flow.has_oracle else Phase.GRADING, stack_up=True)
        # provision_trial captured the logs and tore the stack down before raising: nothing left to do.
        return replace(p, phase=Phase.DONE, termination=Termination.PROVISION_ERROR, stack_up=False)
    if p.phase is Phase.ORACLE:
        if outcome is Outcome.OK:
            return replace(p, phase=Phase.GRADING)
        term = Termination.ORACLE_TIMEOUT if outcome is Outcome.TIMED_OUT else Termination.ORACLE_ERROR
        # Grading a stack the reference solution failed on would only grade the seed; logs explain more.
        return replace(p, phase=Phase.CAPTURE_LOGS, termination=term)
    if p.phase is Phase.GRADING:
        if passed is None:
            raise ValueError("GRADING advances with the grade (passed=True/False)")
        nxt = Phase.CAPTURE_LOGS if (not passed or flow.capture_logs_on_success) else Phase.TEARDOWN
        return replace(p, phase=nxt, termination=Termination.COMPLETED, passed=passed)
    if p.phase is Phase.CAPTURE_LOGS:
        # A failed log capture loses diagnostics, not the trial: teardown happens regardless.
        return replace(p, phase=Phase.TEARDOWN)
    if p.phase is Phase.TEARDOWN:
        # A failed teardown is recorded beside the trial (the reaper owns leftovers); the verdict stands.
        return replace(p, phase=Phase.DONE, stack_up=False)
    raise AssertionError(f"unhandled phase {p.phase}")  # pragma: no cover


def is_retryable(t: Termination) -> bool:
    return t in _RETRYABLE


def is_finished(t: Termination | None) -> bool:
    """Finished trials are final; `--resume` runs again only the rest (never started, interrupted)."""
    return t is not None and t is not Termination.INTERRUPTED


def is_failed_attempt(t: Termination | None) -> bool:
    """The attempt itself broke (no grade was produced) — as opposed to a graded red result."""
    return is_finished(t) and t is not Termination.COMPLETED


def status_of(t: Termination | None, passed: bool | None) -> str:
    """``passed`` | ``failed`` (graded red) | ``error`` (no grade) | ``interrupted`` | ``pending``."""
    if t is None:
        return "pending"
    if t is Termination.INTERRUPTED:
        return "interrupted"
    if t is Termination.COMPLETED:
        return "passed" if passed else "failed"
    return "error"


def error_stage(t: Termination, provision_stage: str | None = None) -> str | None:
    """The stage an error is counted under in the summary (``errors_by_stage``)."""
    if t is Termination.PROVISION_ERROR:
        return provision_stage or "provision"
    if t in (Termination.ORACLE_ERROR, Termination.ORACLE_TIMEOUT):
        return "oracle"
    if t is Termination.INTERNAL_ERROR:
        return "internal"
    return None
