"""The CLI's option handling and report, and the JUnit shape for every trial status."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from forgelib.cli.run import build_plan, main_run, render_table
from forgelib.errors import ForgeError, UsageError
from forgelib.grading.score import CheckOutcome, Grade
from forgelib.run import events as ev
from forgelib.run.lifecycle import Termination
from forgelib.run.results import RecordedTrial, TrialResult, read_trials, trial_dir, write_junit, write_trial
from forgelib.spec.models import EnvironmentManifest, Project, RunConfig, Timeouts

from .fakes import widget_task


def project(tmp_path: Path) -> Project:
    env = EnvironmentManifest((tmp_path / "compose.yaml",), {})
    tasks = (widget_task("a"), widget_task("b"))
    return Project("p", tmp_path, tmp_path / "project.yaml", "", {}, env, tasks)


def config(tmp_path: Path, **kw: Any) -> RunConfig:
    return RunConfig(path=tmp_path / "run_configs" / "dev.yaml", project=tmp_path, **kw)


def test_options_override_the_config(tmp_path: Path) -> None:
    cfg = config(
        tmp_path, tasks=("b",), repeats=2, workers=1, output=tmp_path / "out", timeouts=Timeouts(oracle=9)
    )
    p = build_plan(cfg, project(tmp_path))
    assert ([t.name for t in p.tasks], p.repeats, p.workers, p.output) == (["b"], 2, 1, tmp_path / "out")
    assert p.timeouts.oracle == 9
    p = build_plan(cfg, project(tmp_path), repeats=5, workers=3, output=str(tmp_path / "o2"), junit="j.xml")
    assert (p.repeats, p.workers, p.output) == (5, 3, tmp_path / "o2")
    assert p.junit is not None and p.junit.name == "j.xml" and p.junit.is_absolute()
    assert (p.retries, build_plan(config(tmp_path, retries=2), project(tmp_path)).retries) == (0, 2)
    assert build_plan(config(tmp_path, retries=2), project(tmp_path), retries=0).retries == 0  # 0 overrides
    everything = build_plan(config(tmp_path), project(tmp_path))
    assert [t.name for t in everything.tasks] == ["a", "b"]
    assert everything.output == tmp_path / "runs"  # no output anywhere: <project>/runs


def test_unknown_task_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ForgeError, match="no task named 'c'; tasks: a, b"):
        build_plan(config(tmp_path, tasks=("c",)), project(tmp_path))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"repeats": 0}, "--repeats must be at least 1"),
        ({"workers": 0}, "--workers must be at least 1"),
        ({"retries": -1}, "--retries must be between 0 and 100"),
        ({"repeats": 2, "resume": "r1"}, "--repeats cannot change a resumed run's plan"),
    ],
)
def test_usage_errors_before_anything_is_loaded(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        main_run("/nonexistent/dev.yaml", **kw)


def _state() -> ev.RunState:
    def fin(task: str, idx: int, term: str, passed: bool, reasons: list[str]) -> dict[str, Any]:
        return {
            "kind": ev.TRIAL_FINISHED, "task": task, "index": idx, "termination_reason": term,
            "binary_pass": passed, "score": 1.0 if passed else 0.0, "reasons": reasons,
            "timings": {"total": 2.5}, "error_stage": "reset_recipe" if term == "PROVISION_ERROR" else None,
        }  # fmt: skip

    plan = [{"task": "t", "index": i} for i in range(5)]
    return ev.fold(
        [
            {"kind": ev.RUN_STARTED, "run_id": "r1", "plan": plan},
            fin("t", 0, "COMPLETED", True, []),
            fin("t", 1, "COMPLETED", False, ["check 'x' failed: expected equals 'a', observed 'b'"]),
            fin("t", 2, "PROVISION_ERROR", False, ["Provisioning failed at reset_recipe: boom"]),
            fin("t", 3, "INTERRUPTED", False, ["interrupted before the trial finished"]),
        ]
    )


def test_junit_one_testcase_per_trial(tmp_path: Path) -> None:
    path = write_junit(tmp_path / "ci" / "junit.xml", _state())
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "5",
        "failures": "1",
        "errors": "1",
        "skipped": "2",
    }
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [f"t[{i}]" for i in range(5)]
    assert cases[0].find("*") is None and cases[0].get("time") == "2.500"
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("message", "").startswith("check 'x' failed")
    error = cases[2].find("error")
    assert error is not None and error.get("type") == "PROVISION_ERROR"
    assert cases[3].find("skipped") is not None and cases[4].find("skipped") is not None


def test_report_table(tmp_path: Path) -> None:
    text = render_table(ev.summarize(_state()))
    lines = text.splitlines()
    assert lines[0].split() == ["TASK", "IDX", "STATUS", "SCORE", "TERMINATION", "REASON"]
    assert lines[3].split()[:5] == ["t", "2", "error", "0.00", "PROVISION_ERROR"]
    assert lines[5].split()[:5] == ["t", "4", "pending", "-", "-"]
    assert lines[-1] == (
        "run r1: 1/5 passed, 2 failed (1 failed attempts; errors by stage: reset_recipe: 1), 2 not finished"
    )


def test_a_trial_reads_back_as_its_writer_wrote_it(tmp_path: Path) -> None:
    check = CheckOutcome("row", "sql", 1.0, False, True, "baseline", "equals 'baseline'")
    grade = Grade(binary_pass=True, score=1.0, threshold=1.0, checks=(check,))
    for index in (10, 2):  # read back by index, not by the directory's name
        r = TrialResult(
            run_id="r", task="t", index=index, termination=Termination.COMPLETED, grade=grade,
            started_at=100.0, finished_at=104.5, timings={"provision": 2.0, "recipe:db": 0.5},
            compose_project=f"p{index}", stack={"mode": "warm", "reuse": True},
            snapshots={"db": {"outcome": "restored"}},
        )  # fmt: skip
        write_trial(trial_dir(tmp_path, "t", index), r)
    got = read_trials(tmp_path)
    assert [t.index for t in got] == [2, 10]
    assert got[0] == RecordedTrial(
        task="t", index=2, status="passed", binary_pass=True, wall_seconds=4.5,
        timings={"provision": 2.0, "recipe:db": 0.5}, compose_project="p2",
        stack={"mode": "warm", "reuse": True}, snapshots={"db": {"outcome": "restored"}}, checks=(check,),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("options", "loads"),
    [({}, False), ({"stacks": "warm"}, True), ({"snapshots": True}, True)],
)
def test_only_a_run_that_connects_to_services_loads_the_client_libraries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], loads: bool
) -> None:
    # Fresh stacks are seeded with the services' own tools; psycopg/redis (≈ 0.85 s of CPU to import) are
    # for warm resets and golden checks only, loaded before the first trial when the run will use them.
    import forgelib.cli.run as run_cli

    loaded: list[bool] = []
    monkeypatch.setattr(run_cli.clients, "load", lambda: loaded.append(True))
    monkeypatch.setattr(run_cli, "heal_leftovers", lambda runner, say: None)
    monkeypatch.setattr(run_cli, "make_backend", lambda *a, **kw: object())
    monkeypatch.setattr(run_cli, "run_project", lambda plan, *a, **kw: (tmp_path, ev.RunState()))
    pack = Path(__file__).parents[3] / "examples/multi_service_postgres_reset/run_configs/dev.yaml"
    main_run(str(pack), output=str(tmp_path), as_json=True, **options)
    assert bool(loaded) is loads
