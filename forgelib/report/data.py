"""The report's data: one JSON-able value built from the run's folded event log (``events.fold``).

Nothing else feeds it.

The page (``page.py``) only lays this value out, so every number it shows is here and comes from
``events.jsonl``: totals and per-phase statistics from ``events.summarize`` (the same as summary.json),
the timeline from each attempt's phase-start timestamps, provisioning's inner steps from the trial's
timings in the order they were recorded. The only things read besides the log are which result files exist,
to link them (``files``), and what a trial's solver left (``details``: its tool calls from trace.jsonl and
the tails of its output), shown beside its phases.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from forgelib.run.events import Attempt, RunState, Session, TrialRecord, summarize, timing_stats
from forgelib.run.lifecycle import Phase

# The timeline's colours: provisioning is split into the stack itself and the seeds going in.
CATEGORIES = ("provision", "recipes", "solve", "grading", "capture_logs", "record", "teardown")
# Timing keys that are provisioning's inner steps applying state (a seed recipe, a reset, a restore).
_STATE_STEPS = ("recipe", "reset", "restore", "golden", "seed")
# Timing keys that are not provisioning's inner steps: the phases themselves and the trial's total.
_NOT_STEPS = frozenset({*(p.value for p in Phase), "provision", "total"})

# (task, index) -> the trial's directory relative to the page, and its files' names relative to that
FileLister = Callable[[str, int], tuple[str, list[str]]]
# (task, index) -> {"calls": [[seq, tool, started, ended, ok, args, error]...], "calls_total", "output"}
DetailReader = Callable[[str, int], Mapping[str, Any]]


def category(step: str) -> str:
    """The timeline colour of a provisioning step (``recipe:app-db`` -> recipes)."""
    return "recipes" if step.startswith(_STATE_STEPS) else "provision"


def build(
    state: RunState, files: FileLister | None = None, details: DetailReader | None = None
) -> dict[str, Any]:
    summary = summarize(state)
    trials = [_trial(r, state.sessions, files, details) for r in state.records()]
    return {
        "run": {
            "run_id": state.run_id,
            "project": summary["project"],
            "config": summary["config"],
            "settings": dict(state.started.get("settings") or {}),
            "solver": summary["solver"],
            "completed": state.completed,
            "interrupted": state.interrupted,
            "resumes": state.resumes,
        },
        "sessions": [_session(s) for s in state.sessions],
        "totals": {
            **summary["totals"],
            "attempts": sum(r.attempts for r in state.records()),
            "retried": sum(r.attempts > 1 for r in state.records()),
        },
        "all_passed": summary["all_passed"],
        "timings": summary["timings"],
        "ready": summary["ready"],
        "pool": summary["pool"],
        "phases": distributions(state.records()),
        "skipped_events": summary["skipped_events"],
        "setups": summary["setups"],
        "trials": trials,
    }


def _session(s: Session) -> dict[str, Any]:
    return {
        "kind": "resumed" if s.kind == "run_resumed" else "started",
        "started": s.started,
        "ended": s.ended,
        "end": {"run_finished": "finished", "run_interrupted": "interrupted"}.get(s.end or ""),
        "last": s.last,
        "origin": dict(s.origin),
    }


def _trial(
    r: TrialRecord, sessions: list[Session], files: FileLister | None, details: DetailReader | None
) -> dict[str, Any]:
    trial_files = files(r.task, r.index) if files else ("", [])
    extra = details(r.task, r.index) if details else {}
    return {
        "calls": list(extra.get("calls") or []),
        "calls_total": int(extra.get("calls_total") or 0),
        "calls_error": extra.get("calls_error"),  # a trace that could not be read, and why
        "output": dict(extra.get("output") or {}),
        "key": f"{r.task}[{r.index}]",
        "task": r.task,
        "index": r.index,
        "status": r.status,
        "termination": r.termination.value if r.termination else None,
        "stage": stage(r),
        "score": r.score,
        "reasons": list(r.reasons),
        # Every check of the verdict: name, kind (check | gate), type, weight, result (passed | failed |
        # undecided) and reason (none: the trial was not graded, or its log is older than checks in it).
        "checks": [dict(c) for c in r.checks],
        "attempts": r.attempts,
        "earlier": r.earlier,  # the retried attempts, as summary.json lists them
        "worker": r.worker,
        "phase": r.phase,
        "total": r.timings.get("total"),
        "timings": {k: round(v, 3) for k, v in r.timings.items()},
        "bars": [bar(a, sessions) for a in r.history],
        "dir": trial_files[0],
        "files": trial_files[1],
    }


def stage(r: TrialRecord) -> str | None:
    """Where a trial that did not pass went wrong: its error stage, or ``graded`` (it ran, checks said no)."""
    if r.failed_attempt:
        return r.error_stage or "unknown"
    if r.status == "failed":
        return "graded"
    return None


def bar(a: Attempt, sessions: list[Session]) -> dict[str, Any]:
    """One attempt on the timeline: its phases as [category, start, end] segments (wall-clock seconds).

    The last phase ends when the stack was recorded as removed (``trial_torn_down``), or, in a log from
    before that event, at the verdict. An attempt still busy (its session was killed, or is still running)
    ends at its session's latest event and is marked ``open``.
    """
    session = sessions[a.session] if a.session < len(sessions) else None
    if a.torn_down is not None:
        end: float | None = max(a.torn_down, a.ended or a.torn_down)
    elif not a.busy:
        end = a.ended
    else:
        end = session.last if session else None
    if end is None and a.phases:
        end = a.phases[-1][1]
    segs: list[list[Any]] = []
    for i, (phase, start) in enumerate(a.phases):
        stop = a.phases[i + 1][1] if i + 1 < len(a.phases) else end
        assert stop is not None  # a.phases is not empty here
        if phase == Phase.PROVISIONING:
            segs.extend(_provision_steps(a.timings, start, stop))
        else:
            segs.append([phase, start, stop])
    return {
        "session": a.session,
        "worker": a.worker,
        "start": a.phases[0][1] if a.phases else None,
        "end": end,
        "open": a.busy,
        "attempt": a.number,
        "retried": a.retried,
        "termination": a.termination.value if a.termination else None,
        "stage": a.error_stage,
        "segs": [[c, round(s, 3), round(e, 3)] for c, s, e in segs],
    }


def _provision_steps(timings: Mapping[str, float], start: float, stop: float) -> list[list[Any]]:
    """Provisioning's segment split into its recorded steps, laid end to end from its start (they run one
    after the other); time the steps do not account for (host-side checks) stays ``provision``."""
    out: list[list[Any]] = []
    t = start
    for step, secs in timings.items():
        if step in _NOT_STEPS or step.startswith("total"):
            continue
        end = min(stop, t + max(0.0, secs))
        _add(out, category(step), t, end)
        t = end
    _add(out, "provision", t, stop)
    return out


def _add(out: list[list[Any]], cat: str, start: float, end: float) -> None:
    if end <= start:
        return
    if out and out[-1][0] == cat and out[-1][2] == start:
        out[-1][2] = end  # neighbouring steps of one colour are one segment
    else:
        out.append([cat, start, end])


def distributions(records: list[TrialRecord]) -> dict[str, dict[str, Any]]:
    """Per phase, every finished trial's seconds (for the histograms) and their statistics.

    ``recipes`` is the sum of a trial's state-applying steps; the other phases are their timings as
    recorded (``provision`` includes its recipes, as in summary.json).
    """
    values: dict[str, list[float]] = {}
    for r in records:
        if not r.timings:
            continue
        recipes = [v for k, v in r.timings.items() if k not in _NOT_STEPS and category(k) == "recipes"]
        if recipes:
            values.setdefault("recipes", []).append(sum(recipes))
        for name in ("provision", "solve", "grading", "capture_logs", "teardown", "total"):
            if name in r.timings:
                values.setdefault(name, []).append(r.timings[name])
    order = ["provision", "recipes", "solve", "grading", "capture_logs", "teardown", "total"]
    return {
        name: {**timing_stats(values[name]), "values": [round(v, 3) for v in values[name]]}
        for name in order
        if values.get(name)
    }
