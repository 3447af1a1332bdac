"""The orchestrator grades trace checks from the trace.jsonl in the trial's directory (written there while
the trial's solver ran), on a fake backend; without one they are undecided, on disk too."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from forgelib.run.execute import RunPlan, run_project
from forgelib.runner import Result
from forgelib.spec.loader import deep_freeze
from forgelib.spec.models import Check, Oracle, Task

from .fakes import FakeBackend, good_answer, make_task

READ = {"tool": "sql_query", "args": {"service": "^app-db$", "query": "(?i)select"}}
WROTE = {"tool": "write_file", "args": {"path": "^/work/out.txt$"}}
BOUND = {"from": READ, "capture": "(base\\w+)", "into": WROTE, "arg": "content"}
UPDATE = {"tool": "sql_query", "args": {"query": "(?i)update"}}


def task() -> Task:
    return make_task(
        "traced",
        oracle=Oracle(service="runner", command=("python3", "/pack/agent.py"), timeout=30),
        checks=[
            Check("out_file", "file", {"service": "runner", "path": "/work/out.txt", "equals": "baseline"}),
            Check("read_it", "trace", deep_freeze({"called": READ})),
            Check("wrote_what_it_read", "trace", deep_freeze({"bound": BOUND})),
            Check("no_writes", "trace", deep_freeze({"not_called": UPDATE}), gate=True),
        ],
    )


def line(n: int, tool: str, arguments: dict[str, Any], result: str) -> str:
    call = {"seq": n, "tool": tool, "arguments": arguments, "started": n, "ended": n + 0.1}
    return json.dumps({**call, "ok": True, "result": result, "error": None}) + "\n"


def calls(*queries: str) -> str:
    """The trace of a solver that ran ``queries`` and then wrote /work/out.txt."""
    rows = '{"rows": [["baseline"]]}'
    text = "".join(
        line(n, "sql_query", {"service": "app-db", "query": q}, rows) for n, q in enumerate(queries, 1)
    )
    note = {"service": "runner", "path": "/work/out.txt", "content": "baseline"}
    return text + line(len(queries) + 1, "write_file", note, "ok")


def run_with(tmp_path: Path, trace: str | None) -> dict[str, Any]:
    def answer(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
        if argv[0] == "python3" and trace is not None:  # the solver: its tool server writes the trace
            (trial_dir,) = tmp_path.glob("runs/*/trials/traced/0")
            (trial_dir / "trace.jsonl").write_text(trace)
        return good_answer(service, argv, kw)

    plan = RunPlan(tasks=[task()], repeats=1, output=tmp_path / "runs")
    run_dir, _ = run_project(plan, FakeBackend(answer), print)
    d = run_dir / "trials" / "traced" / "0"
    return {f: yaml.safe_load((d / f"{f}.yaml").read_text()) for f in ("grade", "metrics")}


def test_trace_checks_are_graded_from_the_trials_trace(tmp_path: Path) -> None:
    got = run_with(tmp_path, calls("select name from widgets"))["grade"]
    assert got["binary_pass"] is True and got["score"] == 1.0 and "undecided" not in got
    assert {c["name"]: (c["passed"], c["decided"]) for c in got["checks"]} == {
        "out_file": (True, True), "read_it": (True, True), "wrote_what_it_read": (True, True),
        "no_writes": (True, True),
    }  # fmt: skip


def test_a_forbidden_call_in_the_trace_fails_the_gate(tmp_path: Path) -> None:
    got = run_with(tmp_path, calls("select name from widgets", "UPDATE widgets SET name = 'x'"))["grade"]
    assert got["binary_pass"] is False and got["score"] == 0.75  # flat checks: a gate weighs too
    assert got["reasons"][0].startswith("gate 'no_writes' failed")


def test_without_a_trace_the_trace_checks_are_undecided_and_the_state_check_grades(tmp_path: Path) -> None:
    got = run_with(tmp_path, None)
    g, m = got["grade"], got["metrics"]
    assert g["binary_pass"] is True and g["score"] == 1.0 and g["components"]["read_it"] is None
    assert len(g["undecided"]) == 3
    assert all("cannot be decided: the trial has no trace.jsonl" in u for u in g["undecided"])
    assert m["checks_undecided"] == 3 and m["gates_failed"] == 0
