"""A check that cannot be decided says so wherever a result is shown: grade.yaml, summary.json, the table
``forge run`` prints and the report's data. It is ``undecided`` with its reason, never ``passed: false``,
and a share of the score that nothing decided is null, never 0."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.runlog import T0, ev_started, trial_events, write_log

from forgelib.cli.run import render_table
from forgelib.grading.gradedoc import check_of, grade_doc
from forgelib.grading.regrade import Recorded
from forgelib.grading.score import CheckOutcome, checks_component, combine, grade
from forgelib.report.data import build
from forgelib.report.page import write_report
from forgelib.run import events as ev
from forgelib.run.execute import RunPlan, run_project

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


# ------------------------------------------------------------------ report.html read as HTML, no script run


class StaticPage(HTMLParser):
    """What a reader without JavaScript sees of the report: the results table's rows (by ``data-trial``),
    each with its cells' text and its checks (name, result, reason), and every tag that appears."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[dict[str, Any]] = []
        self.tags: list[str] = []
        self._in_rows = False
        self._cell: list[str] | None = None
        self._check: dict[str, Any] | None = None
        self._why: list[str] | None = None
        self._script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        self._script = tag == "script"
        if tag == "tbody" and a.get("id") == "rows":
            self._in_rows = True
        elif self._in_rows and tag == "tr":
            self.rows.append(
                {"trial": a.get("data-trial"), "status": a.get("data-status"), "cells": [], "checks": []}
            )
        elif self._in_rows and tag == "td":
            self._cell = []
            self.rows[-1]["cells"].append(self._cell)
        elif self._in_rows and tag == "li" and a.get("class") == "check":
            self._check = {"name": a.get("data-check"), "result": a.get("data-result"), "reason": None}
            self.rows[-1]["checks"].append(self._check)
        elif self._check is not None and tag == "div" and a.get("class") == "why":
            self._why = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_rows = False
        elif tag == "li":
            self._check = None
        elif tag == "div" and self._why is not None and self._check is not None:
            self._check["reason"] = "".join(self._why)
            self._why = None
        elif tag == "script":
            self._script = False

    def handle_data(self, data: str) -> None:
        if self._script:
            return
        if self._cell is not None:
            self._cell.append(data)
        if self._why is not None:
            self._why.append(data)

    @classmethod
    def of(cls, html: str) -> StaticPage:
        page = cls()
        page.feed(html)
        page.close()
        return page


def cell_text(row: dict[str, Any], i: int) -> str:
    return "".join(row["cells"][i]).strip()


def test_report_html_without_javascript_shows_every_trial_and_check(run_without_trace: Path) -> None:
    summary = json.loads((run_without_trace / "summary.json").read_text())
    page = StaticPage.of(write_report(run_without_trace).read_text())
    assert [(cell_text(r, 0), cell_text(r, 1), r["status"]) for r in page.rows] == [
        (f"{t['task']}[{t['index']}]", t["status"], t["status"]) for t in summary["trials"]
    ]
    for row, trial in zip(page.rows, summary["trials"], strict=True):
        assert row["checks"] == [{k: c[k] for k in ("name", "result", "reason")} for c in trial["checks"]]
        assert cell_text(row, 2) == "1.00"
        assert "1 passed · 3 undecided" in cell_text(row, 9)
        assert "failed" not in cell_text(row, 9)  # undecided is never shown as failed


def test_hostile_names_and_reasons_are_text_in_the_static_table(tmp_path: Path) -> None:
    evil = "<img src=x onerror=alert(1)></script><script>alert(2)</script>&amp; <!--FORGE:rows-->"
    log = [ev_started([("t", 0)]), *trial_events("t", 0, T0 + 1, "0", outcome="failed")]
    (finished,) = [e for e in log if e["kind"] == ev.TRIAL_FINISHED]
    finished["reasons"] = [f"check {evil!r} failed"]
    finished["checks"] = [
        {"name": evil, "kind": "gate", "type": "sql", "weight": 1.0, "result": "failed", "reason": evil},
        {"name": "t2", "kind": "check", "type": "trace", "weight": 1.0, "result": "undecided",
         "reason": f"cannot be decided: {evil}"},
    ]  # fmt: skip
    run_dir = tmp_path / "r"
    write_log(run_dir, log)
    html = write_report(run_dir).read_text()
    page = StaticPage.of(html)
    assert html.count("</script>") == 2  # nothing closes the data block or opens a script
    markup = re.sub(r'<script id="data" type="application/json">.*?</script>', "", html, flags=re.S)
    assert "<img" not in markup and "<!--FORGE:" not in markup and "&lt;img src=x" in markup
    assert "img" not in page.tags and page.tags.count("script") == 2  # the data block and the page's own
    (row,) = page.rows
    assert row["checks"] == [
        {"name": evil, "result": "failed", "reason": evil},
        {"name": "t2", "result": "undecided", "reason": f"cannot be decided: {evil}"},
    ]
    assert evil in cell_text(row, 8)  # the reason, as text
