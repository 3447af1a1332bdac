"""A run recorded before the oracle became one solver among others (tests/fixtures/legacy_run: phase
``oracle``, ORACLE_ERROR / ORACLE_TIMEOUT, ``oracle`` timings, a session killed mid-oracle) still folds,
reports and resumes, under today's names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from forgelib.report.page import write_report
from forgelib.run import events as ev
from forgelib.run.execute import RunPlan, run_project
from forgelib.run.lifecycle import Phase, Termination
from forgelib.run.results import read_trials

from .fakes import FakeBackend, good_answer, widget_task

FIXTURE = Path(__file__).parents[2] / "fixtures" / "legacy_run"
RUN_ID = "20261202T035056Z-a9f3c4"
TASKS = ["read_widget", "broken", "slow", "read_widget_again"]


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    """A copy (the resume writes into it)."""
    shutil.copytree(FIXTURE / RUN_ID, tmp_path / "runs" / RUN_ID)
    return tmp_path / "runs" / RUN_ID


def test_the_fixture_is_in_the_old_format() -> None:
    raw = (FIXTURE / RUN_ID / ev.EVENTS_FILE).read_text()
    assert '"phase": "oracle"' in raw and '"ORACLE_ERROR"' in raw and '"ORACLE_TIMEOUT"' in raw
    assert '"solve"' not in raw and "AGENT_" not in raw


def test_an_old_log_folds_under_todays_names(old_run: Path) -> None:
    state = ev.fold(ev.read_events(old_run / ev.EVENTS_FILE))
    by = {k[0]: r for k, r in state.trials.items()}
    assert state.unknown_kinds == {} and state.unreadable_lines == 1  # the line the kill cut
    assert by["read_widget"].status == "passed" and by["read_widget"].timings["solve"] > 0
    assert "oracle" not in by["read_widget"].timings
    broken = by["broken"]
    assert (broken.status, broken.termination, broken.error_stage) == (
        "error",
        Termination.AGENT_ERROR,
        "solve",
    )
    slow = by["slow"]
    assert slow.status == "passed" and slow.attempts == 2
    assert [(a["termination_reason"], a["error_stage"]) for a in slow.earlier] == [("AGENT_TIMEOUT", "solve")]
    again = by["read_widget_again"]
    assert again.phase == Phase.SOLVE and again.stack_up and not again.finished
    assert state.pending() == [("read_widget_again", 0)]
    totals = ev.summarize(state)["totals"]
    assert totals["errors_by_stage"] == {"solve": 2} and totals["passed"] == 2 and totals["not_finished"] == 1


def test_an_old_run_reports(old_run: Path) -> None:
    page = write_report(old_run).read_text()
    blob = page.split('<script id="data" type="application/json">', 1)[1].split("</script>")[0]
    data = json.loads(blob.replace("<\\/", "</"))
    trials = {t["task"]: t for t in data["trials"]}
    assert trials["broken"]["termination"] == "AGENT_ERROR" and trials["broken"]["stage"] == "solve"
    assert "solve" in [s[0] for s in trials["read_widget"]["bars"][0]["segs"]]
    assert "oracle.stdout" in trials["broken"]["files"]  # the old run's output files are still linked
    assert data["phases"]["solve"]["count"] == 3


def test_an_old_run_resumes_only_what_it_did_not_finish(old_run: Path) -> None:
    tasks = [widget_task(n) for n in TASKS]
    backend = FakeBackend(good_answer)
    plan = RunPlan(tasks=tasks, repeats=1, output=old_run.parent, resume=RUN_ID)
    _, state = run_project(plan, backend, lambda line: None)
    assert backend.provisioned == [("read_widget_again", 0)]
    assert backend.leftovers_discarded == [RUN_ID]  # the killed session's stack
    assert [r.status for r in state.records()] == ["passed", "error", "passed", "passed"]
    assert state.completed and state.resumes == 1
    summary = json.loads((old_run / "summary.json").read_text())
    assert summary["totals"]["errors_by_stage"] == {"solve": 2} and summary["totals"]["passed"] == 3
    # Its trial directories, old and new, read back alike.
    recorded = {t.task: t for t in read_trials(old_run)}
    assert (
        recorded["broken"].status == "error" and recorded["broken"].timings["oracle"] > 0
    )  # as written then
    assert (
        recorded["read_widget_again"].status == "passed" and "solve" in recorded["read_widget_again"].timings
    )
    assert (old_run / "trials" / "read_widget_again" / "0" / "attempts" / "1" / "oracle.stdout").is_file()
