"""The trial state machine: phases, transitions, termination reasons, retries. No I/O.

The orchestrator asks ``advance`` what comes next after every phase; the fold over ``events.jsonl`` and
the summary use ``is_finished``/``status_of``/``is_failed_attempt`` so the rules live in one place.

    PENDING -> PROVISIONING -> SOLVE -> GRADING -> [CAPTURE_LOGS] -> RECORD -> TEARDOWN -> DONE
                    |             |         |                                         |
                    |             +---------+--(error/timeout)--> CAPTURE_LOGS        +-(retry)-> PROVISIONING
                    +--(ProvisionError)--> RECORD -> DONE   (provisioning captured logs, tore down)

RECORD writes the attempt's evidence (trial.yaml, grade.yaml, the event) *before* TEARDOWN, so a crash or
Ctrl-C while the stack is being removed never loses a finished trial's result. An attempt that ended with
a retryable termination while retries are left is recorded as a retried attempt; after its teardown the
trial starts again at PROVISIONING on a fresh stack (``attempt`` + 1). An interruption before RECORD
records the trial as INTERRUPTED (``--resume`` runs it again) and still tears down.

SOLVE is whatever solves the trial: the task's oracle or a command agent (``forgelib.run.agent``). Logs
written before the solver became a choice name it ``oracle`` (phase) and ``ORACLE_ERROR``/
``ORACLE_TIMEOUT`` (terminations): both still parse (``Phase("oracle")`` is SOLVE, ``Termination
("ORACLE_ERROR")`` is AGENT_ERROR), so an old run folds, reports and resumes as a new one would.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class Phase(StrEnum):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    SOLVE = "solve"  # the solver (the oracle or an agent) runs
    GRADING = "grading"
    CAPTURE_LOGS = "capture_logs"
    RECORD = "record"
    TEARDOWN = "teardown"
    DONE = "done"

    @classmethod
    def _missing_(cls, value: object) -> Phase | None:
        return cls.SOLVE if value == LEGACY_SOLVE_PHASE else None


# What SOLVE was called in logs written before the solver became a choice.
LEGACY_SOLVE_PHASE = "oracle"


class Termination(StrEnum):
    COMPLETED = "COMPLETED"  # graded; the grade says pass or fail
    PROVISION_ERROR = "PROVISION_ERROR"  # the stack could not be provisioned; the solver never ran
    AGENT_ERROR = "AGENT_ERROR"  # the solver (oracle or agent) exited non-zero, or could not be started
    AGENT_TIMEOUT = "AGENT_TIMEOUT"  # the solver outlived its timeout and was killed (its process group)
    GRADING_ERROR = "GRADING_ERROR"  # grading could not produce a score (a judge failed or timed out)
    ENGINE_LOST = "ENGINE_LOST"  # the Docker engine (or the node running the trial) stopped answering
    INTERNAL_ERROR = "INTERNAL_ERROR"  # a bug in forgelib while running this trial
    INTERRUPTED = "INTERRUPTED"  # Ctrl-C: not finished, `--resume` runs it again

    @classmethod
    def _missing_(cls, value: object) -> Termination | None:
        """An old log's ``ORACLE_ERROR``/``ORACLE_TIMEOUT``: the same ends under their new names."""
        return cls(_LEGACY_TERMINATIONS[value]) if value in _LEGACY_TERMINATIONS else None


# Before the oracle became one solver among others its ends had its name; they mean the same thing.
_LEGACY_TERMINATIONS = {"ORACLE_ERROR": "AGENT_ERROR", "ORACLE_TIMEOUT": "AGENT_TIMEOUT"}


class Outcome(StrEnum):
    """How the phase just run ended."""

    OK = "ok"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LOST = "lost"  # the engine running the phase went away (not the pack's fault)
    INTERRUPTED = "interrupted"
    CRASHED = "crashed"  # an unexpected exception in our own code


# A provisioning failure is a property of the pack (a broken seed, a bad compose file): running it again
# gives the same answer, so it is not retryable. A timeout, a lost engine, a failed judge, a bug or an
# interruption may not recur. (INTERRUPTED is retryable by `--resume`, never by `retries`.)
_RETRYABLE = frozenset(
    {
        Termination.AGENT_TIMEOUT,
        Termination.GRADING_ERROR,
        Termination.ENGINE_LOST,
        Termination.INTERNAL_ERROR,
        Termination.INTERRUPTED,
    }
)


@dataclass(frozen=True)
class Flow:
    """What about the task and the run config shapes the path through the phases."""

    has_solver: bool  # the task's oracle, or the run's agent; without one, grading follows provisioning
    capture_logs_on_success: bool = False
    retries: int = 0  # how many times a retryable attempt is run again on a fresh stack


@dataclass(frozen=True)
class Progress:
    phase: Phase = Phase.PENDING
    termination: Termination | None = None  # set once the attempt's end is known
    stack_up: bool = False  # a provisioned stack exists and still needs teardown
    passed: bool | None = None  # the grade, once graded
    attempt: int = 1  # 1-based; a retry (or a resumed trial) counts on
    retries_left: int = 0
    retry: bool = False  # the attempt being recorded/torn down will be followed by another
    recorded: bool = False  # RECORD wrote this attempt's evidence


def start(flow: Flow | None = None, attempt: int = 1) -> Progress:
    return Progress(attempt=attempt, retries_left=flow.retries if flow is not None else 0)


def should_retry(t: Termination, retries_left: int) -> bool:
    """Run the trial again on a fresh stack? Only for a retryable end, never for an interruption (the run
    is stopping; `--resume` reruns it), and only while retries are left. One rule for every runner of
    attempts (the thread pool here, a cluster that lost a node)."""
    return retries_left > 0 and t is not Termination.INTERRUPTED and is_retryable(t)


# A trial whose cluster node was lost runs again on another node this many times without spending the
# plan's retries: the loss is the cluster's failure, never the pack's, and a run without retries (the
# default) should survive a node going away. Past that, a lost node is an ENGINE_LOST like any other.
FREE_NODE_LOSSES = 1


def retries_after_node_loss(retries_left: int, losses: int) -> int | None:
    """A cluster trial's node was lost (its ``losses``-th loss) while it had ``retries_left`` of the plan's
    retries: the retries its rerun on another node keeps, or None when it is not run again (its lost
    attempt is the verdict). The first ``FREE_NODE_LOSSES`` losses cost nothing; a later one is a retry
    like any other retryable end (``should_retry``)."""
    if losses <= FREE_NODE_LOSSES:
        return retries_left
    if should_retry(Termination.ENGINE_LOST, retries_left):
        return retries_left - 1
    return None


def _ended(p: Progress, term: Termination, *, stack_up: bool | None = None) -> Progress:
    """The attempt's end is known: go record it (deciding now whether another attempt follows)."""
    up = p.stack_up if stack_up is None else stack_up
    return replace(
        p, phase=Phase.RECORD, termination=term, stack_up=up, retry=should_retry(term, p.retries_left)
    )


def _after_teardown(p: Progress) -> Progress:
    if p.retry:
        return Progress(phase=Phase.PROVISIONING, attempt=p.attempt + 1, retries_left=p.retries_left - 1)
    return replace(p, phase=Phase.DONE, stack_up=False)


def advance(flow: Flow, p: Progress, outcome: Outcome, *, passed: bool | None = None) -> Progress:
    """The state after the current phase ended with ``outcome`` (``passed``: the grade, after GRADING)."""
    if p.phase is Phase.DONE:
        raise ValueError("a finished trial does not advance")
    if p.phase is Phase.RECORD:
        # Writing the evidence either worked (OK) or did not (CRASHED: nothing on record, the fold sees an
        # unfinished trial, `--resume` reruns it); either way the stack goes.
        if outcome is Outcome.CRASHED:
            p = replace(p, termination=Termination.INTERNAL_ERROR, retry=False)
        else:
            p = replace(p, recorded=True)
        return replace(p, phase=Phase.TEARDOWN) if p.stack_up else _after_teardown(p)
    if p.phase is Phase.TEARDOWN:
        # A failed or interrupted teardown is recorded beside the trial (the reaper owns leftovers); the
        # verdict stands. An interruption cancels a pending retry: the run is stopping.
        if outcome is Outcome.INTERRUPTED and p.retry:
            return replace(p, phase=Phase.DONE, stack_up=False, retry=False)
        return _after_teardown(p)
    if outcome is Outcome.INTERRUPTED:
        # Whatever was running, an interruption keeps only the record and the teardown.
        return _ended(replace(p, retry=False), Termination.INTERRUPTED)
    if outcome is Outcome.CRASHED:
        return _ended(p, p.termination or Termination.INTERNAL_ERROR)
    if outcome is Outcome.LOST:
        return _ended(p, Termination.ENGINE_LOST)

    if p.phase is Phase.PENDING:
        return replace(p, phase=Phase.PROVISIONING)
    if p.phase is Phase.PROVISIONING:
        if outcome is Outcome.OK:
            return replace(p, phase=Phase.SOLVE if flow.has_solver else Phase.GRADING, stack_up=True)
        # provision_trial captured the logs and tore the stack down before raising: nothing left to do.
        return _ended(p, Termination.PROVISION_ERROR, stack_up=False)
    if p.phase is Phase.SOLVE:
        if outcome is Outcome.OK:
            return replace(p, phase=Phase.GRADING)
        term = Termination.AGENT_TIMEOUT if outcome is Outcome.TIMED_OUT else Termination.AGENT_ERROR
        # Grading a stack the solver failed on would only grade what it left half done; logs explain more.
        return replace(p, phase=Phase.CAPTURE_LOGS, termination=term)
    if p.phase is Phase.GRADING:
        if outcome is not Outcome.OK:  # no score could be produced (a judge failed): logs explain more
            return replace(p, phase=Phase.CAPTURE_LOGS, termination=Termination.GRADING_ERROR)
        if passed is None:
            raise ValueError("GRADING advances with the grade (passed=True/False)")
        if not passed or flow.capture_logs_on_success:
            return replace(p, phase=Phase.CAPTURE_LOGS, termination=Termination.COMPLETED, passed=passed)
        return replace(_ended(p, Termination.COMPLETED), passed=passed)
    if p.phase is Phase.CAPTURE_LOGS:
        # A failed log capture loses diagnostics, not the trial.
        return _ended(p, p.termination or Termination.INTERNAL_ERROR)
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
    if t in (Termination.AGENT_ERROR, Termination.AGENT_TIMEOUT):
        return "solve"
    if t is Termination.GRADING_ERROR:
        return "grading"
    if t is Termination.ENGINE_LOST:
        return "engine"
    if t is Termination.INTERNAL_ERROR:
        return "internal"
    return None


def stage_name(stage: str) -> str:
    """An ``error_stage`` as recorded, under today's name (an old log's ``oracle`` is ``solve``)."""
    return Phase.SOLVE.value if stage == LEGACY_SOLVE_PHASE else stage


# ------------------------------------------------------------------------------------ a task's setup


class SetupStep(StrEnum):
    """A task's ``setup:``, once per run, before its first trial gets a stack (``forgelib.run.setup``):

        PROVISION -> RUN -> CHECKPOINT -> TEARDOWN -> DONE
            |          |         |            ^
            |          +---------+--(failed)--+      (the setup stack goes whatever happened)
            +--(failed)--> DONE                      (provisioning tore its stack down itself)

    Its end decides every trial of the task: the checkpoint they fork (``ok``), or the failure each of them
    is recorded with (a provision error at stage ``setup``, the solver never run)."""

    PROVISION = "provision"
    RUN = "run"
    CHECKPOINT = "checkpoint"
    TEARDOWN = "teardown"
    DONE = "done"


@dataclass(frozen=True)
class SetupProgress:
    step: SetupStep = SetupStep.PROVISION
    stack_up: bool = False
    ok: bool | None = None  # known once a step failed, or once the checkpoint exists
    interrupted: bool = False
    failed_step: SetupStep | None = None


def setup_advance(p: SetupProgress, outcome: Outcome) -> SetupProgress:
    """The setup's state after its current step ended with ``outcome``. A teardown's own failure is
    recorded beside the setup; its verdict stands (the checkpoint was taken before it)."""
    if p.step is SetupStep.DONE:
        raise ValueError("a finished setup does not advance")
    if p.step is SetupStep.TEARDOWN:
        return replace(p, step=SetupStep.DONE, stack_up=False)
    if outcome is not Outcome.OK:
        failed = replace(
            p, ok=False, failed_step=p.step, interrupted=p.interrupted or outcome is Outcome.INTERRUPTED
        )
        if p.step is SetupStep.PROVISION:
            return replace(failed, step=SetupStep.DONE, stack_up=False)
        return replace(failed, step=SetupStep.TEARDOWN)
    if p.step is SetupStep.PROVISION:
        return replace(p, step=SetupStep.RUN, stack_up=True)
    if p.step is SetupStep.RUN:
        return replace(p, step=SetupStep.CHECKPOINT)
    return replace(p, step=SetupStep.TEARDOWN, ok=True)  # CHECKPOINT
