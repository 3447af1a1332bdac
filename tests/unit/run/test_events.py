from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forgelib.run import events as ev
from forgelib.run.lifecycle import Termination


def started(plan: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "kind": ev.RUN_STARTED,
        "run_id": "r1",
        "project": "/p",
        "plan": [{"task": t, "index": i} for t, i in plan],
    }


def finished(task: str, index: int, term: str = "COMPLETED", **kw: Any) -> dict[str, Any]:
    base = {
        "kind": ev.TRIAL_FINISHED,
        "task": task,
        "index": index,
        "termination_reason": term,
        "retryable": False,
        "binary_pass": True,
        "score": 1.0,
        "timings": {"solve": 1.0, "total": 3.0},
    }
    return {**base, **kw}


def state(task: str, index: int, phase: str) -> dict[str, Any]:
    return {"kind": ev.TRIAL_STATE, "task": task, "index": index, "phase": phase}


PLAN = [("a", 0), ("a", 1), ("b", 0)]


def test_log_round_trip_one_line_per_event(tmp_path: Path) -> None:
    path = tmp_path / "run" / ev.EVENTS_FILE
    with ev.EventLog(path) as log:
        log.append(ev.RUN_STARTED, run_id="r1", plan=[{"task": "a", "index": 0}])
        log.append(ev.TRIAL_STATE, task="a", index=0, phase="provisioning", seconds=0.0)
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["kind"] == ev.RUN_STARTED and first["v"] == ev.SCHEMA_VERSION and "ts" in first
    s = ev.fold(ev.read_events(path))
    assert (
        s.run_id == "r1" and s.trials[("a", 0)].phase == "provisioning" and s.trials[("a", 0)].attempts == 1
    )


def test_fold_pending_is_what_did_not_finish() -> None:
    s = ev.fold([started(PLAN), state("a", 0, "provisioning"), finished("a", 0), state("a", 1, "solve")])
    assert s.pending() == [("a", 1), ("b", 0)]
    assert s.trials[("a", 0)].status == "passed"
    assert s.trials[("a", 1)].status == "pending" and s.trials[("a", 1)].phase == "solve"


def test_log_cut_mid_line_is_skipped_and_the_next_writer_starts_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / ev.EVENTS_FILE
    good = [started(PLAN), state("a", 0, "provisioning"), finished("a", 0)]
    cut = json.dumps(finished("a", 1))[:37]  # SIGKILL in the middle of a write
    path.write_text("".join(json.dumps(e) + "\n" for e in good) + cut)

    s = ev.fold(ev.read_events(path))
    assert s.unreadable_lines == 1
    assert s.pending() == [("a", 1), ("b", 0)]

    with ev.EventLog(path) as log:  # a resume appends after the fragment, on its own line
        log.append(ev.RUN_RESUMED, pending=[])
        log.append(ev.TRIAL_FINISHED, **{k: v for k, v in finished("a", 1).items() if k != "kind"})
    s2 = ev.fold(ev.read_events(path))
    assert s2.unreadable_lines == 1 and s2.resumes == 1
    assert s2.pending() == [("b", 0)]


def test_unknown_kinds_and_malformed_events_are_skipped() -> None:
    s = ev.fold(
        [
            started(PLAN),
            {"kind": "agent_thought", "text": "from a newer writer"},
            {"kind": "agent_thought"},
            {"no_kind": True},
            {"kind": ev.TRIAL_FINISHED, "task": "a"},  # known kind, fields missing
            finished("a", 0),
        ]
    )
    assert s.unknown_kinds == {"agent_thought": 2, "None": 1, "trial_finished (malformed)": 1}
    assert s.trials[("a", 0)].finished


def test_interrupted_trials_are_pending_and_rerun_resets_them() -> None:
    events = [
        started(PLAN),
        state("a", 0, "provisioning"),
        finished("a", 0, "INTERRUPTED", binary_pass=False, score=0.0, retryable=True),
        {"kind": ev.RUN_INTERRUPTED},
    ]
    s = ev.fold(events)
    assert s.interrupted and ("a", 0) in s.pending()
    assert s.trials[("a", 0)].status == "interrupted"
    s = ev.fold([*events, {"kind": ev.RUN_RESUMED}, state("a", 0, "provisioning")])
    t = s.trials[("a", 0)]
    assert not s.interrupted and t.attempts == 2 and t.termination is None


def test_summarize_counts_and_timings() -> None:
    prov = "Provisioning failed at reset_recipe: boom"
    s = ev.fold(
        [
            started(PLAN),
            finished("a", 0),
            finished("a", 1, "COMPLETED", binary_pass=False, score=0.5, timings={"solve": 3.0}),
            finished(
                "b",
                0,
                "PROVISION_ERROR",
                binary_pass=False,
                score=0.0,
                error_stage="reset_recipe",
                reasons=[prov],
                timings={"provision": 2.0},
            ),
            {"kind": ev.RUN_FINISHED},
        ]
    )
    sm = ev.summarize(s)
    assert sm["totals"] == {
        "trials": 3,
        "passed": 1,
        "failed": 2,
        "failed_attempts": 1,
        "retried_attempts": 0,
        "not_finished": 0,
        "errors_by_stage": {"reset_recipe": 1},
    }
    assert sm["all_passed"] is False
    assert sm["timings"]["solve"] == {
        "count": 2, "total": 4.0, "mean": 2.0, "median": 2.0, "p95": 3.0, "min": 1.0, "max": 3.0,
    }  # fmt: skip
    trial_b = sm["trials"][2]
    assert trial_b["termination_reason"] == "PROVISION_ERROR" and trial_b["reasons"] == [prov]
    assert s.completed
    json.dumps(sm)  # serialisable as is


def test_termination_values_round_trip() -> None:
    for t in Termination:
        s = ev.fold([started([("a", 0)]), finished("a", 0, t.value)])
        assert s.trials[("a", 0)].termination is t
