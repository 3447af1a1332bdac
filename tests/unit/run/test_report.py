"""The report's data from synthetic event logs (a resumed run, a failed one, a killed one, an old log),
the page it is inlined into, and the executor's additions to the log that the report reads."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.runlog import T0, ev_started, synthetic_run, trial_events, write_log

from forgelib.errors import ForgeError
from forgelib.report.data import build, category
from forgelib.report.page import REPORT_FILE, render, write_report
from forgelib.run import events as ev
from forgelib.run.execute import RunPlan, run_project

from .fakes import FakeBackend, widget_task

STEPS = {"compose_config": 0.5, "up_seeded": 2.0, "recipe:app-db": 1.0, "up_rest": 0.5}


def page_data(html: str) -> dict[str, Any]:
    m = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S)
    assert m, "no data block in the page"
    return dict(json.loads(m.group(1)))


def test_a_resumed_run_shows_both_sessions_and_both_attempts() -> None:
    plan = [("a", 0), ("a", 1)]
    log = [ev_started(plan, workers=2)]
    log += trial_events("a", 0, T0 + 1, "0", steps=STEPS)
    log += trial_events("a", 1, T0 + 1, "1", steps=STEPS, outcome="interrupted")
    log.append({"v": 1, "kind": ev.RUN_INTERRUPTED, "ts": T0 + 20})
    log.append({"v": 1, "kind": ev.RUN_RESUMED, "ts": T0 + 100, "pending": [], "origin": {"host": "other"}})
    log += trial_events("a", 1, T0 + 101, "0", steps=STEPS)
    log.append({"v": 1, "kind": ev.RUN_FINISHED, "ts": T0 + 120})
    d = build(ev.fold(log))

    assert [(s["kind"], s["started"], s["end"], s["origin"].get("host")) for s in d["sessions"]] == [
        ("started", T0, "interrupted", "box"),
        ("resumed", T0 + 100, "finished", "other"),
    ]
    assert d["run"]["resumes"] == 1 and d["run"]["completed"]
    assert d["totals"]["attempts"] == 3 and d["totals"]["retried"] == 1
    a1 = d["trials"][1]
    assert a1["status"] == "passed" and a1["attempts"] == 2 and a1["worker"] == "0"
    first, second = a1["bars"]
    assert (first["session"], first["worker"], first["termination"]) == (0, "1", "INTERRUPTED")
    assert (second["session"], second["worker"], second["termination"]) == (1, "0", "COMPLETED")
    # The interrupted attempt went provisioning -> oracle -> record -> teardown (no grading).
    cats = ["provision", "recipes", "provision", "solve", "record", "teardown"]
    assert [s[0] for s in first["segs"]] == cats
    torn = [e["ts"] for e in log if e["kind"] == ev.TRIAL_TORN_DOWN and e["index"] == 1]
    assert not first["open"] and first["end"] == torn[0]  # its stack's removal (trial_torn_down)


def test_a_bar_is_the_attempt_phase_by_phase_with_the_recipe_inside_provisioning() -> None:
    log = [ev_started([("a", 0)]), *trial_events("a", 0, T0 + 1, "0", steps=STEPS, oracle=2.0, grading=0.5)]
    (t,) = build(ev.fold(log))["trials"]
    (b,) = t["bars"]
    # provisioning = 4.0 s of steps + 0.1 s unaccounted; the recipe at 2.5 s into it, lasting 1.0 s; the
    # verdict is recorded before the teardown, which ends when trial_torn_down says so.
    p0 = T0 + 1
    assert b["segs"] == [
        ["provision", p0, p0 + 2.5],
        ["recipes", p0 + 2.5, p0 + 3.5],
        ["provision", p0 + 3.5, p0 + 4.1],
        ["solve", p0 + 4.1, p0 + 6.1],
        ["grading", p0 + 6.1, p0 + 6.6],
        ["record", p0 + 6.6, p0 + 6.65],
        ["teardown", p0 + 6.65, p0 + 7.65],
    ]
    assert (b["start"], b["end"], b["open"], b["attempt"]) == (p0, p0 + 7.65, False, 1)
    assert t["total"] == pytest.approx(6.65) and t["timings"]["teardown"] == 1.0
    assert category("recipe:app-db") == "recipes" and category("up_rest") == "provision"


def test_a_failed_run_names_the_stage_of_each_failure() -> None:
    plan = [("a", 0), ("a", 1), ("a", 2), ("a", 3)]
    log = [ev_started(plan)]
    log += trial_events("a", 0, T0 + 1, "0", outcome="provision_error")
    log += trial_events("a", 1, T0 + 10, "0", outcome="oracle_error")
    log += trial_events("a", 2, T0 + 20, "0", outcome="failed")
    log += trial_events("a", 3, T0 + 30, "0")
    log.append({"v": 1, "kind": ev.RUN_FINISHED, "ts": T0 + 40})
    state = ev.fold(log)
    d = build(state)
    got = [(t["status"], t["termination"], t["stage"]) for t in d["trials"]]
    assert got == [
        ("error", "PROVISION_ERROR", "reset_recipe"),
        ("error", "AGENT_ERROR", "solve"),
        ("failed", "COMPLETED", "graded"),
        ("passed", "COMPLETED", None),
    ]
    # The page's totals are summary.json's (one fold).
    assert {k: d["totals"][k] for k in ev.summarize(state)["totals"]} == ev.summarize(state)["totals"]
    assert d["totals"]["errors_by_stage"] == {"reset_recipe": 1, "solve": 1}
    assert d["trials"][0]["reasons"][0].startswith("Provisioning failed at reset_recipe")
    # A failed provisioning has no oracle segment; the oracle error captured logs before teardown.
    assert {s[0] for s in d["trials"][0]["bars"][0]["segs"]} == {"provision", "recipes", "record"}
    tail = [s[0] for s in d["trials"][1]["bars"][0]["segs"]][-4:]
    assert tail == ["solve", "capture_logs", "record", "teardown"]
    assert d["phases"]["solve"]["count"] == 3 and len(d["phases"]["solve"]["values"]) == 3


def test_a_retried_attempt_is_its_own_bar_and_counts_as_a_failed_attempt() -> None:
    log = [ev_started([("a", 0)])]
    log += trial_events("a", 0, T0 + 1, "0", outcome="oracle_timeout", retried=True)
    log += trial_events("a", 0, log[-1]["ts"] + 0.1, "0", attempt=2)
    log.append({"v": 1, "kind": ev.RUN_FINISHED, "ts": log[-1]["ts"] + 1})
    d = build(ev.fold(log))
    (t,) = d["trials"]
    assert (t["status"], t["attempts"]) == ("passed", 2)
    first, second = t["bars"]
    assert (first["attempt"], first["retried"], first["termination"], first["stage"]) == (
        1, True, "AGENT_TIMEOUT", "solve",
    )  # fmt: skip
    assert (second["attempt"], second["retried"], second["termination"]) == (2, False, "COMPLETED")
    assert first["end"] <= second["start"]  # the retry starts after the first attempt's stack is gone
    assert t["earlier"] == [
        {"attempt": 1, "termination_reason": "AGENT_TIMEOUT", "retryable": True, "error_stage": "solve",
         "reason": "oracle timed out after 60 s", "dir": "attempts/1"},
    ]  # fmt: skip
    assert d["totals"]["failed_attempts"] == 1 and d["totals"]["retried_attempts"] == 1


def test_a_log_from_before_record_and_torn_down_ends_bars_at_the_verdict() -> None:
    log = [ev_started([("a", 0)]), *trial_events("a", 0, T0 + 1, "0", old=True)]
    (b,) = build(ev.fold(log))["trials"][0]["bars"]
    assert [s[0] for s in b["segs"]][-2:] == ["grading", "teardown"]
    assert not b["open"] and b["end"] == log[-1]["ts"] and b["attempt"] is None


def test_a_killed_session_leaves_an_open_bar_ending_at_its_last_event() -> None:
    log = [ev_started([("a", 0), ("a", 1)])]
    log += trial_events("a", 0, T0 + 1, "0")
    log += [e for e in trial_events("a", 1, T0 + 10, "0") if e["kind"] == ev.TRIAL_STATE][
        :2
    ]  # killed in oracle
    d = build(ev.fold(log))
    (b,) = d["trials"][1]["bars"]
    assert b["open"] and b["termination"] is None and b["end"] == log[-1]["ts"]
    assert [s[0] for s in b["segs"]][-1] == "solve"
    assert d["trials"][1]["status"] == "pending" and d["totals"]["not_finished"] == 1
    assert d["sessions"][0]["end"] is None and d["sessions"][0]["last"] == log[-1]["ts"]


def test_an_old_log_without_workers_or_origin_still_builds() -> None:
    log: list[dict[str, Any]] = [
        {"kind": ev.RUN_STARTED, "run_id": "r", "plan": [{"task": "a", "index": 0}]},
        {"kind": ev.TRIAL_STATE, "task": "a", "index": 0, "phase": "provisioning"},
        {"kind": ev.TRIAL_FINISHED, "task": "a", "index": 0, "termination_reason": "COMPLETED",
         "binary_pass": True, "score": 1.0, "timings": {"total": 3.0}},
        {"kind": "from_a_newer_forge"},
    ]  # fmt: skip
    d = build(ev.fold(log))
    (t,) = d["trials"]
    assert t["status"] == "passed" and t["worker"] is None and t["bars"][0]["start"] is None
    assert d["sessions"][0]["origin"] == {} and d["skipped_events"]["unknown_kinds"] == {
        "from_a_newer_forge": 1
    }
    assert "<script" in render(d)


def test_the_page_is_self_contained_and_carries_the_data(tmp_path: Path) -> None:
    log = [ev_started([("a", 0)]), *trial_events("a", 0, T0 + 1, "0", outcome="failed")]
    log[-1]["reasons"] = ["observed '</script><script>alert(1)</script>'"]
    state = ev.fold(log)
    html = render(build(state))
    # No network: nothing to fetch, and the page's policy forbids fetching anything.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "default-src 'none'" in html
    assert html.count("</script>") == 2  # a reason cannot close the data block early
    assert page_data(html) == json.loads(json.dumps(build(state)))


def test_write_report_links_the_trial_files_relative_to_the_page(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r1"
    write_log(run_dir, [ev_started([("a", 0)]), *trial_events("a", 0, T0 + 1, "0", outcome="failed")])
    trial = run_dir / "trials" / "a" / "0"
    (trial / "services").mkdir(parents=True)
    for name in ("trial.yaml", "grade.yaml", "oracle.stdout", "services/app-db.log"):
        (trial / name).write_text("x")

    inside = write_report(run_dir)
    assert inside == run_dir / REPORT_FILE
    (t,) = page_data(inside.read_text())["trials"]
    assert t["dir"] == "trials/a/0"
    assert t["files"] == ["trial.yaml", "grade.yaml", "oracle.stdout", "services/app-db.log"]

    elsewhere = write_report(run_dir, output=tmp_path / "pages" / "r1.html")
    (t,) = page_data(elsewhere.read_text())["trials"]
    assert t["dir"] == "../runs/r1/trials/a/0"
    assert all((elsewhere.parent / t["dir"] / f).is_file() for f in t["files"])


def test_write_report_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(ForgeError, match=r"not a forge run directory \(events.jsonl is missing\)"):
        write_report(tmp_path)
    write_log(tmp_path, [{"kind": ev.TRIAL_STATE, "task": "a", "index": 0, "phase": "oracle"}])
    with pytest.raises(ForgeError, match="does not start with a run_started event"):
        write_report(tmp_path)


def test_a_thousand_trials_fold_into_a_thousand_rows_and_their_bars() -> None:
    log = synthetic_run(1000)
    d = build(ev.fold(log))
    assert len(d["trials"]) == 1000
    attempts = sum(1 for e in log if e["kind"] == ev.TRIAL_STATE and e["phase"] == "provisioning")
    assert sum(len(t["bars"]) for t in d["trials"]) == attempts == d["totals"]["attempts"]
    assert {b["worker"] for t in d["trials"] for b in t["bars"]} == {"0", "1", "2", "3"}
    for t in d["trials"]:  # every bar's segments are ordered and touch end to start
        for b in t["bars"]:
            ends = [(s[1], s[2]) for s in b["segs"]]
            assert all(a[1] == pytest.approx(b2[0]) for a, b2 in itertools.pairwise(ends))
            assert ends[0][0] == b["start"] and ends[-1][1] == pytest.approx(b["end"])


def test_the_executor_records_workers_and_origin_shows_every_event_and_writes_the_report(
    tmp_path: Path, fake_backend: Any
) -> None:
    backend: FakeBackend = fake_backend()
    seen: list[dict[str, Any]] = []
    plan = RunPlan(tasks=[widget_task()], repeats=2, workers=2, output=tmp_path / "runs", report=write_report)
    lines: list[str] = []
    run_dir, _state = run_project(plan, backend, lines.append, observer=lambda e: seen.append(dict(e)))
    on_disk = list(ev.read_events(run_dir / ev.EVENTS_FILE))
    assert seen == on_disk  # the observer saw every event, in log order
    assert on_disk[0]["origin"]["forgelib"] and on_disk[0]["origin"]["host"]
    workers = {e["worker"] for e in on_disk if e["kind"] == ev.TRIAL_STATE}
    assert workers and workers <= {"0", "1"}
    report = run_dir / REPORT_FILE
    assert f"report: {report}" in lines
    data = page_data(report.read_text())
    assert [t["key"] for t in data["trials"]] == ["read_widget[0]", "read_widget[1]"]
    assert data["totals"]["passed"] == 2 and all(t["bars"][0]["worker"] in workers for t in data["trials"])

    # A resume replays the log to the observer before its own events.
    seen.clear()
    again = RunPlan(tasks=[widget_task()], repeats=2, output=tmp_path / "runs", resume=run_dir.name)
    run_project(again, fake_backend(), lines.append, observer=lambda e: seen.append(dict(e)))
    assert seen == list(ev.read_events(run_dir / ev.EVENTS_FILE))
    assert seen[-2]["kind"] == ev.RUN_RESUMED and seen[-2]["origin"]["host"]


def test_a_trials_tool_calls_and_solver_output_are_on_the_page(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r1"
    write_log(run_dir, [ev_started([("a", 0), ("a", 1)]), *trial_events("a", 0, T0 + 1, "0"),
                        *trial_events("a", 1, T0 + 20, "0")])  # fmt: skip
    trial = run_dir / "trials" / "a" / "0"
    trial.mkdir(parents=True)
    calls = [
        {"seq": 1, "tool": "sql_query", "arguments": {"service": "app-db", "query": "select " + "x" * 300},
         "started": T0 + 5, "ended": T0 + 5.1, "ok": True, "result": "[]", "error": None},
        {"seq": 2, "tool": "write_file", "arguments": {"service": "runner", "path": "/n"},
         "started": T0 + 5.2, "ended": T0 + 5.3, "ok": False, "result": None, "error": "no such service"},
    ]  # fmt: skip
    (trial / "trace.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls) + '{"seq": 3, "to')
    (trial / "agent.stdout").write_text("x" * 5000 + "the end\n")
    (trial / "agent.stderr").write_text("")  # empty: nothing to show
    damaged = run_dir / "trials" / "a" / "1"
    damaged.mkdir(parents=True)
    (damaged / "trace.jsonl").write_text("not json\n{}\n")

    first, second = page_data(write_report(run_dir).read_text())["trials"]
    assert first["calls_total"] == 2  # the torn last line (a kill mid-write) is not a call
    (seq, tool, started, ended, ok, args, err), bad = first["calls"]
    assert (seq, tool, started, ended, ok, err) == (1, "sql_query", T0 + 5, T0 + 5.1, True, "")
    assert len(args) == 160 and args.endswith("…")
    assert bad[1] == "write_file" and bad[4] is False and bad[6] == "no such service"
    assert list(first["output"]) == ["agent.stdout"] and first["output"]["agent.stdout"].endswith("the end\n")
    assert len(first["output"]["agent.stdout"]) == 2048
    assert {"trace.jsonl", "agent.stdout", "agent.stderr"} <= set(first["files"])
    assert second["calls"] == [] and "trace.jsonl:1: not a JSON trace record" in second["calls_error"]
