"""A check that cannot be decided says so wherever a result is shown: grade.yaml, summary.json, the table
``forge run`` prints and the report's data. It is ``undecided`` with its reason, never ``passed: false``,
and a share of the score that nothing decided is null, never 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from forgelib.report.data import build
from forgelib.run import events as ev
from forgelib.run.cli import render_table
from forgelib.run.execute import RunPlan, run_project
from forgelib.run.grading import CheckOutcome, checks_component, combine, grade
from forgelib.run.regrade import Recorded
from forgelib.run.results import check_of, grade_doc

from .fakes import FakeBackend, good_answer
from .test_trace_grading import task

NO_TRACE = "cannot be decided: the trial has no trace.jsonl (no tool calls were recorded)"


def outcome(name: str, *, passed: bool = False, decided: bool = True, gate: bool = False) -> CheckOutcome:
    error = None if decided else "cannot be decided: no trace"
    return CheckOutcome(name, "trace", 1.0, gate, passed, "seen", "equals 'x'", error, decided=decided)


def test_grade_yaml_says_undecided_with_the_reason_and_no_score_share() -> None:
    checks = [outcome("ok", passed=True), outcome("bad"), outcome("open", decided=False)]
    doc = grade_doc(grade(checks, 0.5))
    ok, bad, open_ = doc["checks"]
    assert (ok["passed"], ok["result"], ok["reason"]) == (True, "passed", None)
    assert (bad["passed"], bad["result"], bad["reason"]) == (
        False,
        "failed",
        "expected equals 'x', observed 'seen'",
    )
    assert (open_["passed"], open_["result"], open_["reason"]) == (
        None,
        "undecided",
        "cannot be decided: no trace",
    )
    assert open_["decided"] is False  # as before, for readers that know only that key
    assert doc["components"] == {"ok": 0.5, "bad": 0.0, "open": None}
    assert doc["undecided"] == ["check 'open' cannot be decided: no trace"]
    # The file reads back into the outcomes it was written from (forge grade, the benchmarks).
    assert [check_of(c) for c in doc["checks"]] == checks
    assert Recorded.from_doc(doc).checks == tuple(checks)


def test_a_weighted_component_with_nothing_decided_is_null_not_zero() -> None:
    g = combine(
        [outcome("gate", decided=False, gate=True)],
        [checks_component("state", 1.0, [outcome("s", passed=True)]),
         checks_component("trace", 2.0, [outcome("t", decided=False)])],
        1.0,
    )  # fmt: skip
    doc = grade_doc(g)
    assert g.binary_pass and doc["score"] == 1.0
    assert doc["components"] == {"state": 1.0, "trace": None}
    assert [c["result"] for c in doc["checks"]] == ["undecided", "passed", "undecided"]
    assert all(c["passed"] is None for c in doc["checks"] if c["result"] == "undecided")


def test_nothing_decided_is_red_and_still_undecided_per_check() -> None:
    doc = grade_doc(grade([outcome("t", decided=False)], 1.0))
    assert doc["binary_pass"] is False and doc["components"] == {"t": None}
    assert doc["checks"][0]["result"] == "undecided"


@pytest.fixture
def run_without_trace(tmp_path: Path) -> Path:
    """Two trials of a task whose oracle leaves no trace: the state check passes, three trace checks (one
    a gate) cannot be decided."""
    plan = RunPlan(tasks=[task()], repeats=2, output=tmp_path / "runs")
    run_dir, _ = run_project(plan, FakeBackend(good_answer), lambda line: None)
    return run_dir


def test_a_run_writes_undecided_checks_into_every_result(run_without_trace: Path) -> None:
    run_dir = run_without_trace
    g = yaml.safe_load((run_dir / "trials" / "traced" / "0" / "grade.yaml").read_text())
    assert g["binary_pass"] is True and g["score"] == 1.0
    assert {c["name"]: (c["result"], c["passed"], c["reason"]) for c in g["checks"]} == {
        "out_file": ("passed", True, None),
        "read_it": ("undecided", None, NO_TRACE),
        "wrote_what_it_read": ("undecided", None, NO_TRACE),
        "no_writes": ("undecided", None, NO_TRACE),
    }
    assert g["components"] == {
        "out_file": 1.0,
        "read_it": None,
        "wrote_what_it_read": None,
        "no_writes": None,
    }

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["all_passed"] is True
    for t in summary["trials"]:
        assert t["checks"] == [
            {"name": "out_file", "kind": "check", "type": "file", "weight": 1.0, "result": "passed",
             "reason": None},
            {"name": "read_it", "kind": "check", "type": "trace", "weight": 1.0, "result": "undecided",
             "reason": NO_TRACE},
            {"name": "wrote_what_it_read", "kind": "check", "type": "trace", "weight": 1.0,
             "result": "undecided", "reason": NO_TRACE},
            {"name": "no_writes", "kind": "gate", "type": "trace", "weight": 1.0, "result": "undecided",
             "reason": NO_TRACE},
        ]  # fmt: skip

    state = ev.fold(ev.read_events(run_dir / ev.EVENTS_FILE))
    assert ev.summarize(state)["trials"] == summary["trials"]  # the log alone says it
    data = build(state)
    for t in data["trials"]:
        assert [(c["name"], c["result"], c["reason"]) for c in t["checks"]] == [
            (c["name"], c["result"], c["reason"]) for c in summary["trials"][0]["checks"]
        ]


def test_the_table_counts_undecided_checks_and_lists_each_with_its_reason(run_without_trace: Path) -> None:
    summary = json.loads((run_without_trace / "summary.json").read_text())
    lines = render_table(summary).splitlines()
    assert lines[0].split() == ["TASK", "IDX", "STATUS", "SCORE", "TERMINATION", "REASON"]
    assert lines[1].split() == ["traced", "0", "passed", "1.00", "COMPLETED", "3", "undecided"]
    assert lines[2].split()[-2:] == ["3", "undecided"]
    assert lines[3:7] == [
        "undecided (neither passed nor failed; left out of the score):",
        f"  traced[0,1] check 'read_it': {NO_TRACE}",
        f"  traced[0,1] check 'wrote_what_it_read': {NO_TRACE}",
        f"  traced[0,1] gate 'no_writes': {NO_TRACE}",
    ]
    assert lines[-1].startswith("run ") and "2/2 passed" in lines[-1]


def test_a_log_from_before_checks_were_logged_folds_with_none(tmp_path: Path) -> None:
    log: list[dict[str, Any]] = [
        {"kind": ev.RUN_STARTED, "run_id": "r", "plan": [{"task": "a", "index": 0}]},
        {"kind": ev.TRIAL_FINISHED, "task": "a", "index": 0, "termination_reason": "COMPLETED",
         "binary_pass": True, "score": 1.0, "reasons": []},
    ]  # fmt: skip
    state = ev.fold(log)
    assert ev.summarize(state)["trials"][0]["checks"] == [] and build(state)["trials"][0]["checks"] == []
    assert "undecided" not in render_table(ev.summarize(state))
