"""``events.jsonl``: the append-only record of a run, and the one fold over it.

Every trial state change is one JSON line, flushed and fsync'd before the writer moves on, so a run killed
with SIGKILL loses at most the line being written. ``fold`` turns the lines into ``RunState``; the summary,
the CLI report and ``--resume`` all read that one value. A last line cut mid-write and event kinds from a
newer writer are skipped (counted), never fatal.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from forgelib.run.lifecycle import (
    LEGACY_SOLVE_PHASE,
    Phase,
    Termination,
    error_stage,
    is_failed_attempt,
    is_finished,
    is_retryable,
    stage_name,
    status_of,
)

SCHEMA_VERSION = 1
EVENTS_FILE = "events.jsonl"

RUN_STARTED = "run_started"  # run_id, project, config, plan: [{task, index}], settings, origin
RUN_RESUMED = "run_resumed"  # pending: [{task, index}], origin
# task, index, phase, seconds (time spent in the phase just left), worker, attempt
TRIAL_STATE = "trial_state"
# The verdict, written before the stack is torn down: task, index, attempt, termination_reason, retryable,
# binary_pass, score, error_stage, reasons, checks (each check's name, kind, type, weight, result,
# reason), timings.
TRIAL_FINISHED = "trial_finished"
# An attempt that ended retryably and is run again on a fresh stack: the same fields as trial_finished.
# Whatever runs attempts (the thread pool, a cluster that lost a node) records a retried one this way.
TRIAL_ATTEMPT = "trial_attempt"
TRIAL_TORN_DOWN = "trial_torn_down"  # task, index, attempt, seconds, error: the attempt's stack is gone
RUN_INTERRUPTED = "run_interrupted"
# task, index, service, golden, reason: a golden failed its restore or state check and was discarded; the
# trial fell back to seeding that service the normal way (informational: the fold only counts them)
GOLDEN_DISCARDED = "golden_discarded"
STACK_REPLACED = "stack_replaced"  # task, index, stack, reason: a warm stack not provably clean was replaced
# task, index, stack, reason: once per run and environment, its ephemeral services are recreated by compose
# every trial on warm stacks (e.g. several replicas), not started from spares: a known, slower path
# (informational)
WARM_EPHEMERAL_RECREATED = "warm_ephemeral_recreated"
# task, index, decision (reuse / spare / first / grow / ahead: a warm pool's; fresh), memory_wait, start_wait
# (a fresh stack's wait for a start place: admission.Admission.starting), evicted (a warm stack of another
# environment torn down to make room), stacks, busy, held (stacks counted against the memory budget),
# budget_mb, per_stack_mb, ready (run/ready.py); a warm pool's also asked_at (epoch), reset_ahead (seconds
# the stack's reset took when its last trial gave it back), reset_ended_at (epoch), reset_wait (seconds this
# trial waited for that reset to end): how a trial got its stack
STACK_ACQUIRED = "stack_acquired"
RUN_FINISHED = "run_finished"
# task, ok, checkpoint, seconds, timings (provision, run, checkpoint, teardown), error, log_tail,
# interrupted, teardown_error, dir: a task's setup step ended (run/setup.py); its trials fork the checkpoint
SETUP_FINISHED = "setup_finished"

TrialKey = tuple[str, int]  # (task name, trial index)
Observer = Callable[[Mapping[str, Any]], None]


def origin() -> dict[str, str]:
    """Where a session of the run ran (``run_started``/``run_resumed``): the report says it."""
    from forgelib import __version__

    return {
        "host": socket.gethostname(),
        "forgelib": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "argv": " ".join(["forge", *sys.argv[1:]]),
    }


class EventLog:
    """Appends events to ``path``; thread-safe (workers share one log).

    ``observer`` (the live progress display) sees every event in log order: the lines already in the file
    when the log is opened (a resumed run), then each appended one, called under the log's lock.
    """

    def __init__(self, path: Path, observer: Observer | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._observer = observer
        path.parent.mkdir(parents=True, exist_ok=True)
        if observer is not None and path.is_file():
            for e in read_events(path):
                observer(e)
        self._f = open(path, "a+b")  # noqa: SIM115 - closed by close()/__exit__
        # A previous writer killed mid-line left a fragment without a newline: end it, so our first
        # event starts on its own line (the fold skips the fragment).
        self._f.seek(0, os.SEEK_END)
        if self._f.tell() > 0:
            self._f.seek(-1, os.SEEK_END)
            if self._f.read(1) != b"\n":
                self._f.write(b"\n")
                self._sync()

    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"v": SCHEMA_VERSION, "kind": kind, "ts": round(time.time(), 3), **fields}
        line = (json.dumps(event, sort_keys=False, default=str) + "\n").encode()
        with self._lock:
            self._f.write(line)
            self._sync()
            if self._observer is not None:
                self._observer(event)
        return event

    def _sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        with self._lock:
            self._f.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """The events in ``path``; a line that is not a JSON object (a write cut short) is skipped."""
    with open(path, "rb") as f:
        for raw in f:
            yield from parse_line(raw)


def parse_line(raw: bytes | str) -> list[dict[str, Any]]:
    try:
        obj = json.loads(raw)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return [{"kind": "_unreadable"}]
    return [obj] if isinstance(obj, dict) else [{"kind": "_unreadable"}]


@dataclass
class Attempt:
    """One start of a trial, as the log saw it: who ran it, when each phase began, how it ended.

    ``phases`` are (phase, wall-clock start) in order. ``ended`` is the verdict (``trial_finished`` or
    ``trial_attempt``); the teardown that follows it ends at ``torn_down`` (``trial_torn_down``). An
    attempt with neither is still running, or was cut off by a kill.
    """

    session: int  # 0: the first session of the run; n: the n-th resume
    worker: str | None = None
    phases: list[tuple[str, float]] = field(default_factory=list)
    ended: float | None = None
    termination: Termination | None = None
    error_stage: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    number: int | None = None  # 1-based, as the writer counted it (None: a log from before retries)
    retried: bool = False  # ended retryably and was run again (a ``trial_attempt`` event)
    reason: str = ""  # a retried attempt's first reason
    torn_down: float | None = None  # when its stack was recorded as removed

    @property
    def busy(self) -> bool:
        """Its worker is still on it: no verdict yet, or the verdict's teardown not yet recorded (a log
        from before ``trial_torn_down`` tore down before the verdict, so a verdict there is the end)."""
        if self.ended is None:
            return True
        tearing = (
            bool(self.phases) and self.phases[-1][0] == Phase.TEARDOWN and self.phases[-1][1] >= self.ended
        )
        return tearing and self.torn_down is None

    def summary(self) -> dict[str, Any]:
        term = self.termination
        return {
            "attempt": self.number,
            "termination_reason": term.value if term else None,
            "retryable": is_retryable(term) if term else None,
            "error_stage": self.error_stage,
            "reason": self.reason,
            "dir": f"attempts/{self.number}",
        }


@dataclass
class Session:
    """One ``forge run`` process working on the run: the first, or a ``--resume``."""

    kind: str  # RUN_STARTED | RUN_RESUMED
    started: float | None
    origin: Mapping[str, Any] = field(default_factory=dict)
    ended: float | None = None
    end: str | None = None  # RUN_FINISHED | RUN_INTERRUPTED | None (killed, or still running)
    last: float | None = None  # the latest event of the session (where a killed session stopped)


@dataclass
class TrialRecord:
    task: str
    index: int
    phase: str = Phase.PENDING.value
    termination: Termination | None = None
    retryable: bool | None = None
    binary_pass: bool | None = None
    score: float | None = None
    error_stage: str | None = None
    reasons: tuple[str, ...] = ()
    # Each check of the verdict: name, kind (check | gate), type, weight, result, reason
    # (results.check_line); empty in a log from before checks were logged.
    checks: tuple[Mapping[str, Any], ...] = ()
    timings: dict[str, float] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)  # time to ready and what it waited on
    attempts: int = 0  # how many times it was started (a retried or resumed trial: 2 or more)
    history: list[Attempt] = field(default_factory=list)  # one per start, for the timeline
    worker: str | None = None  # who ran (or runs) the latest attempt
    stack_up: bool = False  # provisioned and not yet recorded as torn down

    @property
    def earlier(self) -> list[dict[str, Any]]:
        """The retried attempts (``trial_attempt`` events), oldest first, as summary.json shows them."""
        return [a.summary() for a in self.history if a.retried]

    @property
    def finished(self) -> bool:
        return is_finished(self.termination)

    @property
    def status(self) -> str:
        return status_of(self.termination, self.binary_pass)

    @property
    def failed_attempt(self) -> bool:
        return is_failed_attempt(self.termination)


@dataclass
class RunState:
    run_id: str | None = None
    started: Mapping[str, Any] = field(default_factory=dict)  # the run_started event
    plan: list[TrialKey] = field(default_factory=list)
    trials: dict[TrialKey, TrialRecord] = field(default_factory=dict)
    interrupted: bool = False  # the last session ended with Ctrl-C (cleared by a resume)
    completed: bool = False  # a session reached run_finished with nothing left pending
    resumes: int = 0
    sessions: list[Session] = field(default_factory=list)
    stacks_replaced: int = 0  # warm stacks replaced because they could not be proven clean
    unknown_kinds: dict[str, int] = field(default_factory=dict)
    goldens_discarded: int = 0
    unreadable_lines: int = 0
    acquired: list[dict[str, Any]] = field(default_factory=list)  # the stack_acquired events, in order
    setups: dict[str, dict[str, Any]] = field(default_factory=dict)  # task -> its last setup_finished

    def pending(self) -> list[TrialKey]:
        """Trials in plan order that did not finish: never started, cut off by a kill, interrupted."""
        return [k for k in self.plan if not self.trials[k].finished]

    def records(self) -> list[TrialRecord]:
        return [self.trials[k] for k in self.plan]

    def untorn(self) -> list[TrialKey]:
        """Finished trials whose stack was never recorded as removed (teardown cut by a kill or Ctrl-C)."""
        return [k for k in self.plan if self.trials[k].finished and self.trials[k].stack_up]


def fold(events: Iterable[Mapping[str, Any]]) -> RunState:
    s = RunState()
    for e in events:
        apply(s, e)
    return s


def _key(e: Mapping[str, Any]) -> TrialKey:
    return (str(e["task"]), int(e["index"]))


def _trial(s: RunState, e: Mapping[str, Any]) -> TrialRecord:
    k = _key(e)
    if k not in s.trials:  # an event for a trial outside the plan: track it rather than crash
        s.plan.append(k)
        s.trials[k] = TrialRecord(*k)
    return s.trials[k]


def _phase(raw: Any) -> str:
    """A phase as recorded, under today's name (an old log's ``oracle`` is ``solve``); one this reader
    does not know (a newer writer's) is kept as written."""
    try:
        return Phase(raw).value
    except ValueError:
        return str(raw)


def _stage(e: Mapping[str, Any], term: Termination) -> str | None:
    recorded = e.get("error_stage")
    return stage_name(str(recorded)) if recorded else error_stage(term)


def _timings(e: Mapping[str, Any]) -> dict[str, float]:
    """A verdict's timings; an old log's ``oracle`` (the solver's seconds) under its name today, ``solve``."""
    return {
        _phase(k) if k == LEGACY_SOLVE_PHASE else str(k): float(v)
        for k, v in (e.get("timings") or {}).items()
    }


def _ts(e: Mapping[str, Any]) -> float | None:
    ts = e.get("ts")
    return float(ts) if isinstance(ts, int | float) else None


def apply(s: RunState, e: Mapping[str, Any]) -> None:
    """Fold one more event into ``s`` (``fold`` is this over the whole log; the live display, per event)."""
    kind = e.get("kind")
    try:
        if kind == RUN_STARTED:
            s.run_id = str(e["run_id"])
            s.started = dict(e)
            s.plan = [_key(t) for t in e.get("plan", [])]
            s.trials = {k: TrialRecord(*k) for k in s.plan}
            s.sessions = [Session(RUN_STARTED, _ts(e), dict(e.get("origin") or {}))]
        elif kind == RUN_RESUMED:
            s.resumes += 1
            s.interrupted = False
            s.completed = False
            s.sessions.append(Session(RUN_RESUMED, _ts(e), dict(e.get("origin") or {})))
        elif kind == TRIAL_STATE:
            t = _trial(s, e)
            phase = _phase(e["phase"])
            ts = _ts(e)
            if phase == Phase.PROVISIONING:
                t.attempts += 1
                t.termination, t.binary_pass, t.score, t.reasons, t.checks = None, None, None, (), ()
                worker = e.get("worker")
                t.worker = None if worker is None else str(worker)
                number = e.get("attempt")
                t.history.append(
                    Attempt(max(0, len(s.sessions) - 1), t.worker, number=int(number) if number else None)
                )
            elif phase in (Phase.SOLVE, Phase.GRADING):  # entered only once a stack is up
                t.stack_up = True
            if t.history and ts is not None:
                t.history[-1].phases.append((phase, ts))
            t.phase = phase
        elif kind == TRIAL_ATTEMPT:
            t = _trial(s, e)
            term = Termination(e["termination_reason"])
            reasons = e.get("reasons") or ()
            if not t.history or t.history[-1].ended is not None:  # a writer that logged no start
                t.history.append(Attempt(max(0, len(s.sessions) - 1), e.get("worker")))
            a = t.history[-1]
            a.ended, a.termination, a.retried = _ts(e), term, True
            a.error_stage = _stage(e, term)
            a.timings = _timings(e)
            a.reason = str(reasons[0]) if reasons else ""
            a.number = int(e.get("attempt") or a.number or len(t.history))
        elif kind == TRIAL_TORN_DOWN:
            t = _trial(s, e)
            t.stack_up = False
            t.timings["teardown"] = float(e.get("seconds") or 0.0)
            number = e.get("attempt")
            for a in reversed(t.history):
                if number is None or a.number in (None, int(number)):
                    a.torn_down = _ts(e)
                    break
        elif kind == TRIAL_FINISHED:
            t = _trial(s, e)
            t.phase = Phase.DONE.value
            t.termination = Termination(e["termination_reason"])
            t.retryable = bool(e.get("retryable"))
            t.binary_pass = e.get("binary_pass")
            t.score = e.get("score")
            t.error_stage = _stage(e, t.termination)
            t.reasons = tuple(e.get("reasons") or ())
            t.checks = tuple(dict(c) for c in e.get("checks") or ())
            t.timings = _timings(e)
            t.ready = {str(k): float(v) for k, v in (e.get("ready") or {}).items()}
            if t.history and t.history[-1].ended is None:
                a = t.history[-1]
                a.ended, a.termination, a.error_stage, a.timings = (
                    _ts(e),
                    t.termination,
                    t.error_stage,
                    t.timings,
                )
            if t.termination is Termination.PROVISION_ERROR:
                t.stack_up = False  # provisioning removed its stack before reporting
        elif kind == STACK_REPLACED:
            s.stacks_replaced += 1
        elif kind == RUN_INTERRUPTED:
            s.interrupted = True
            _end_session(s, e)
        elif kind == RUN_FINISHED:
            s.completed = not s.pending()
            _end_session(s, e)
        elif kind == GOLDEN_DISCARDED:
            s.goldens_discarded += 1
        elif kind == STACK_ACQUIRED:
            s.acquired.append(dict(e))
        elif kind == SETUP_FINISHED:
            s.setups[str(e["task"])] = {k: v for k, v in e.items() if k not in ("kind", "ts", "v")}
        elif kind == WARM_EPHEMERAL_RECREATED:
            pass  # the record is the event itself: nothing a trial's state depends on
        elif kind == "_unreadable":
            s.unreadable_lines += 1
        else:
            s.unknown_kinds[str(kind)] = s.unknown_kinds.get(str(kind), 0) + 1
    except (KeyError, TypeError, ValueError):
        # A known kind with fields we cannot read (a newer writer changed it): skip, like an unknown kind.
        s.unknown_kinds[f"{kind} (malformed)"] = s.unknown_kinds.get(f"{kind} (malformed)", 0) + 1
    if s.sessions and (ts := _ts(e)) is not None:
        s.sessions[-1].last = ts


def _end_session(s: RunState, e: Mapping[str, Any]) -> None:
    if s.sessions and s.sessions[-1].end is None:
        s.sessions[-1].ended, s.sessions[-1].end = _ts(e), str(e["kind"])


def summarize(s: RunState) -> dict[str, Any]:
    """summary.json: totals and per-phase timing statistics, from the fold alone."""
    recs = s.records()
    errors: dict[str, int] = {}
    for r in recs:
        # Every broken attempt counts, the retried ones too.
        stages = [a.get("error_stage") for a in r.earlier if a.get("termination_reason") != "COMPLETED"]
        if r.failed_attempt:
            stages.append(r.error_stage)
        for stage in stages:
            errors[stage or "unknown"] = errors.get(stage or "unknown", 0) + 1
    phases: dict[str, list[float]] = {}
    for r in recs:
        for name, secs in r.timings.items():
            phases.setdefault(name, []).append(secs)
    return {
        "run_id": s.run_id,
        "project": s.started.get("project"),
        "config": s.started.get("config"),
        "totals": {
            "trials": len(recs),
            "passed": sum(r.status == "passed" for r in recs),
            "failed": sum(r.finished and r.status != "passed" for r in recs),
            "failed_attempts": sum(errors.values()),
            "retried_attempts": sum(len(r.earlier) for r in recs),
            "not_finished": sum(not r.finished for r in recs),
            "errors_by_stage": dict(sorted(errors.items())),
        },
        "all_passed": bool(recs) and all(r.status == "passed" for r in recs),
        "interrupted": s.interrupted,
        "resumes": s.resumes,
        "stacks": {
            "mode": (s.started.get("settings") or {}).get("stacks", "fresh"),
            "replaced": s.stacks_replaced,
        },
        # What solved the trials (run_started's settings; a log from before agents: each task's oracle).
        "solver": (s.started.get("settings") or {}).get("solver") or {"kind": "oracle"},
        "timings": {name: timing_stats(v) for name, v in sorted(phases.items())},
        "trials": [
            {
                "task": r.task,
                "index": r.index,
                "status": r.status,
                "termination_reason": r.termination.value if r.termination else None,
                "retryable": r.retryable,
                "binary_pass": r.binary_pass,
                "score": r.score,
                "attempts": r.attempts,
                "reasons": list(r.reasons),
                "checks": [dict(c) for c in r.checks],
                "earlier_attempts": list(r.earlier),
            }
            for r in recs
        ],
        "skipped_events": {"unknown_kinds": dict(s.unknown_kinds), "unreadable_lines": s.unreadable_lines},
        "goldens_discarded": s.goldens_discarded,
        "ready": ready_summary(recs),
        "pool": pool_summary(s.acquired),
        "setups": {task: dict(rec) for task, rec in sorted(s.setups.items())},
    }


def ready_summary(recs: Iterable[TrialRecord]) -> dict[str, Any]:
    """Time to ready over the trials that got a stack: statistics, and the seconds spent on each thing
    waited on (summed over trials), ``reused`` apart (a warm stack reset in place)."""
    readies = [r.ready for r in recs if r.ready]
    if not readies:
        return {}
    waited = {
        k: round(sum(x.get(k, 0.0) for x in readies), 3) for k in ("queue", "memory", "provisioning", "reset")
    }
    # A reused warm stack: marked so since the pool resets stacks ahead (no reset on the trial's path);
    # an older log's: a reset on the trial's path and little provisioning.
    reused = [
        x["seconds"]
        for x in readies
        if x.get("reused")
        or ("reused" not in x and x.get("reset", 0.0) > 0 and x.get("provisioning", 0.0) < x["seconds"] / 2)
    ]
    out: dict[str, Any] = {**timing_stats([x["seconds"] for x in readies]), "waited_on": waited}
    if reused:
        out["reused"] = timing_stats(reused)
    return out


def pool_summary(acquired: list[dict[str, Any]]) -> dict[str, Any]:
    """How trials got their stacks (``stack_acquired``): each decision's count, evictions, the trials the
    memory budget held back and for how long, how long trials queued, the most stacks at once."""
    if not acquired:
        return {}
    decisions: dict[str, int] = {}
    for a in acquired:
        decisions[str(a.get("decision"))] = decisions.get(str(a.get("decision")), 0) + 1
    memory = [float(a.get("memory_wait") or 0.0) for a in acquired]
    queue = [float((a.get("ready") or {}).get("queue") or 0.0) for a in acquired]
    resets = [float(a.get("reset_wait") or 0.0) for a in acquired]
    starts = [float(a.get("start_wait") or 0.0) for a in acquired]
    last = acquired[-1]
    return {
        "decisions": dict(sorted(decisions.items())),
        "evictions": sum(1 for a in acquired if a.get("evicted")),
        "queued": sum(1 for q in queue if q > 0.05),
        "queue_seconds": timing_stats(queue),
        "memory_waits": sum(1 for m in memory if m > 0),
        "memory_wait_seconds": round(sum(memory), 3),
        # fresh stacks that queued for a start place (at most as many come up at once as there are cores)
        "start_waits": sum(1 for s in starts if s > 0.05),
        "start_wait_seconds": round(sum(starts), 3),
        # a warm stack reset when given back, before the trial asked (or while it waited: reset_wait)
        "resets_ahead": sum(1 for a in acquired if a.get("reset_ahead") is not None),
        "reset_waits": sum(1 for r in resets if r > 0),
        "reset_wait_seconds": round(sum(resets), 3),
        "peak_stacks": max(int(a.get("held") or a.get("stacks") or 0) for a in acquired),
        "budget_mb": last.get("budget_mb"),
        "per_stack_mb": next((a["per_stack_mb"] for a in reversed(acquired) if a.get("per_stack_mb")), None),
    }


def timing_stats(values: list[float]) -> dict[str, float | int]:
    v = sorted(values)
    n = len(v)
    mid = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    return {
        "count": n,
        "total": round(sum(v), 3),
        "mean": round(sum(v) / n, 3),
        "median": round(mid, 3),
        "p95": round(v[max(0, -(-95 * n // 100) - 1)], 3),  # nearest rank
        "min": round(v[0], 3),
        "max": round(v[-1], 3),
    }
