"""`forge run` on a real engine, on tests/fixtures/run_project (postgres reset from a sql_dump seed, an
oracle writing a file, file + sql checks).

A passing run with repeats 2; a broken seed (PROVISION_ERROR accounting, the exact reasons, zero
leftovers); workers 2 == workers 1; a run killed with SIGKILL after its first trial, then resumed; an oracle
that times out on its first attempt only, retried on a fresh stack; a kill in the middle of a teardown
(the verdict was already on disk; the resume does not rerun it and removes the stack).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster import wait_for
from support.interrupt import orphans_ended, processes_mentioning

from forgelib.cli.grade import main_grade
from forgelib.cli.run import RunOptions, main_run
from forgelib.docker import labels as lab
from forgelib.run import events as ev
from forgelib.runner import SubprocessRunner

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

PROJECT = Path(__file__).resolve().parents[1] / "fixtures" / "run_project"
DEV = PROJECT / "run_configs" / "dev.yaml"
BROKEN = PROJECT / "run_configs" / "broken.yaml"
RETRY = PROJECT / "run_configs" / "retry.yaml"
SLOW_TEARDOWN = PROJECT / "run_configs" / "slow_teardown.yaml"


def forge_run(config: Path, output: Path, **kw: Any) -> tuple[int, Path]:
    """``main_run`` in-process; returns the exit code and the (newest, or resumed) run directory."""
    args: dict[str, Any] = {
        "repeats": None, "workers": None, "resume": None, "as_json": False, "junit": None, **kw,
    }  # fmt: skip
    rc = main_run(RunOptions(str(config), output=str(output), **args))
    runs = sorted(p for p in output.iterdir() if p.is_dir())
    run_dir = output / kw["resume"] if kw.get("resume") else runs[-1]
    return rc, run_dir


def leftovers(runner: SubprocessRunner, run_id: str) -> dict[str, list[str]]:
    return lab.resources_with_labels(runner, {lab.RUN: run_id})


def outcomes(run_dir: Path) -> list[tuple[Any, ...]]:
    """What must not depend on scheduling: per trial, its status, score, reasons and observations."""
    out = []
    for trial in sorted((run_dir / "trials").glob("*/*/trial.yaml")):
        t = yaml.safe_load(trial.read_text())
        g = yaml.safe_load((trial.parent / "grade.yaml").read_text())
        seen = [(c["name"], c["passed"], c["observed"]) for c in g["checks"]]
        out.append(
            (t["task"], t["index"], t["status"], t["termination_reason"], g["score"], g["reasons"], seen)
        )
    return out


@pytest.fixture(scope="module")
def passing_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    out = tmp_path_factory.mktemp("runs")
    yield forge_run(DEV, out, junit=str(out / "junit.xml"))


def test_passing_run_with_repeats_2(passing_run: tuple[int, Path], runner: SubprocessRunner) -> None:
    rc, run_dir = passing_run
    assert rc == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["totals"] == {
        "trials": 2,
        "passed": 2,
        "failed": 0,
        "failed_attempts": 0,
        "retried_attempts": 0,
        "not_finished": 0,
        "errors_by_stage": {},
    }
    # its short trials' first stack was measured before its teardown went on (Admission.settle)
    assert summary["pool"]["per_stack_mb"] and summary["pool"]["per_stack_mb"] > 0, summary["pool"]
    for idx in (0, 1):
        d = run_dir / "trials" / "write_file" / str(idx)
        trial = yaml.safe_load((d / "trial.yaml").read_text())
        assert trial["status"] == "passed" and trial["termination_reason"] == "COMPLETED"
        assert {"up_seeded", "recipe:app-db", "up_rest", "solve", "grading", "teardown"} <= set(
            trial["timings"]
        )
        grade = yaml.safe_load((d / "grade.yaml").read_text())
        assert grade["binary_pass"] is True and grade["score"] == 1.0
        assert [(c["name"], c["observed"]) for c in grade["checks"]] == [
            ("out_file", "baseline"),
            ("seeded_row", "baseline"),  # the sql_dump seed was applied on this trial's fresh app-db
        ]
    assert (run_dir.parent / "junit.xml").read_text().count("<testcase") == 2
    assert lab.is_empty(leftovers(runner, run_dir.name))


def test_forge_grade_rescores_the_finished_run_under_a_changed_rubric(
    passing_run: tuple[int, Path], tmp_path: Path
) -> None:
    """No trial is run again: the stacks are gone, the recorded observations and traces decide."""
    _, run_dir = passing_run
    assert main_grade(str(run_dir)) == 0  # the rubric as it was: the same verdicts
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project)
    rubric = project / "tasks" / "write_file" / "grading.yaml"
    rubric.write_text(
        rubric.read_text().replace('equals: "baseline"}', 'equals: "renamed"}', 1)
        + "  - name: never_observed\n    file: {service: runner, path: /work/other.txt, equals: x}\n"
        + "  - name: read_the_row\n    trace: {called: {tool: sql_query, args: {query: widgets}}}\n"
    )
    assert main_grade(str(run_dir), project=str(project)) == 1
    for idx in (0, 1):
        d = run_dir / "trials" / "write_file" / str(idx)
        assert yaml.safe_load((d / "grade.yaml").read_text())["binary_pass"] is True  # untouched
        first, second = sorted((d / "regrades").iterdir())
        assert yaml.safe_load(first.read_text())["grade"]["binary_pass"] is True
        doc = yaml.safe_load(second.read_text())
        assert doc["rubric"]["path"] == str(rubric.resolve())
        checks = {c["name"]: c for c in doc["grade"]["checks"]}
        # out_file: the recorded 'baseline' against the new matcher; seeded_row as recorded
        assert (checks["out_file"]["passed"], checks["out_file"]["observed"]) == (False, "baseline")
        assert checks["seeded_row"]["passed"] and checks["seeded_row"]["decided"]
        assert not checks["never_observed"]["decided"] and not checks["read_the_row"]["decided"]
        assert doc["grade"]["score"] == pytest.approx(2 / 3, abs=1e-6) and len(doc["grade"]["undecided"]) == 2


def test_broken_seed_is_a_provision_error(
    tmp_path: Path, runner: SubprocessRunner, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, run_dir = forge_run(BROKEN, tmp_path, as_json=True)
    assert rc == 1
    summary = json.loads(capsys.readouterr().out)  # --json: the summary alone on stdout
    assert summary["totals"]["failed_attempts"] == 1
    assert summary["totals"]["errors_by_stage"] == {"reset_recipe": 1}
    d = run_dir / "trials" / "broken_seed" / "0"
    trial = yaml.safe_load((d / "trial.yaml").read_text())
    assert trial["termination_reason"] == "PROVISION_ERROR" and trial["retryable"] is False
    assert trial["oracle"] is None  # the oracle never ran
    reason = trial["error"]["reason"]
    prefix = "reset recipe for service 'app-db' (seed 'broken', kind 'sql_dump') failed: "
    assert reason.startswith(prefix) and 'syntax error at or near "SELEC"' in reason
    grade = yaml.safe_load((d / "grade.yaml").read_text())
    assert grade["binary_pass"] is False and grade["score"] == 0.0
    assert grade["reasons"] == [f"Provisioning failed at reset_recipe: {reason}"]
    assert (d / "services" / "app-db.log").is_file()
    assert lab.is_empty(leftovers(runner, run_dir.name))


def test_workers_2_gives_the_same_results_as_workers_1(
    passing_run: tuple[int, Path], tmp_path: Path, runner: SubprocessRunner
) -> None:
    _, serial = passing_run
    rc, parallel = forge_run(DEV, tmp_path, workers=2)
    assert rc == 0
    assert outcomes(parallel) == outcomes(serial)
    spans = [yaml.safe_load(p.read_text()) for p in sorted((parallel / "trials").glob("*/*/trial.yaml"))]
    assert (
        spans[0]["started_at"] < spans[1]["finished_at"] and spans[1]["started_at"] < spans[0]["finished_at"]
    )
    assert lab.is_empty(leftovers(runner, parallel.name))


def _log_with_a_verdict(proc: subprocess.Popen[bytes], output: Path) -> Path:
    """The forge child's events.jsonl once a trial's verdict is in it (the child still running)."""

    def log() -> Path | None:
        runs = [p for p in output.iterdir() if p.is_dir()]
        return runs[0] / ev.EVENTS_FILE if runs else None

    def verdict() -> bool:
        path = log()
        return path is not None and path.exists() and ev.TRIAL_FINISHED in path.read_text()

    wait_for("a trial's verdict in the forge child's log", verdict, proc, timeout=300)
    path = log()
    assert path is not None
    return path


def test_resume_after_kill_finishes_only_what_was_missing(tmp_path: Path, runner: SubprocessRunner) -> None:
    # The real command, as a user (or CI) runs it; SIGKILL leaves no chance to clean up or log.
    argv = [sys.executable, "-m", "forgelib", "run", "--config", str(DEV), "--repeats", "2"]
    argv += ["--output", str(tmp_path)]
    proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        log = _log_with_a_verdict(proc, tmp_path)
    finally:
        proc.kill()
        proc.wait()
    run_id = log.parent.name
    killed = ev.fold(ev.read_events(log))
    assert [k for k in killed.plan if killed.trials[k].finished] == [("write_file", 0)]
    orphans_ended(run_id)  # so that the resume's reaper sees the final state of what they left

    rc, run_dir = forge_run(DEV, tmp_path, resume=run_id)
    assert rc == 0
    events = list(ev.read_events(log))
    resumed_at = next(i for i, e in enumerate(events) if e["kind"] == ev.RUN_RESUMED)
    rerun = sorted(
        {
            e["index"]
            for e in events[resumed_at:]
            if e["kind"] == ev.TRIAL_STATE and e["phase"] == "provisioning"
        }
    )
    assert rerun == [1]  # trial 0 finished before the kill: not run again
    state = ev.fold(events)
    assert [r.status for r in state.records()] == ["passed"] * 2
    assert state.trials[("write_file", 0)].attempts == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["totals"]["passed"] == 2 and summary["resumes"] == 1
    assert lab.is_empty(leftovers(runner, run_id))


def test_an_oracle_timeout_is_retried_on_a_fresh_stack(
    tmp_path: Path, runner: SubprocessRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "marker"  # outlives every stack: the oracle's first attempt leaves a file here
    marker.mkdir()
    monkeypatch.setenv("FORGE_TEST_MARKER_DIR", str(marker))
    rc, run_dir = forge_run(RETRY, tmp_path / "runs", junit=str(tmp_path / "j.xml"))
    assert rc == 0
    state = ev.fold(ev.read_events(run_dir / ev.EVENTS_FILE))
    (rec,) = state.records()
    assert rec.status == "passed" and rec.attempts == 2
    assert [a["termination_reason"] for a in rec.earlier] == ["AGENT_TIMEOUT"]
    d = run_dir / "trials" / "retry_once" / "0"
    first = yaml.safe_load((d / "attempts" / "1" / "trial.yaml").read_text())
    final = yaml.safe_load((d / "trial.yaml").read_text())
    assert first["termination_reason"] == "AGENT_TIMEOUT" and first["retried"] is True
    assert (d / "attempts" / "1" / "services" / "runner.log").is_file()  # the failed attempt's evidence
    assert final["attempt"] == 2 and final["status"] == "passed"
    assert (d / "oracle.stderr").read_text() == "retried: wrote out.txt\n"  # streamed by the runner
    assert final["compose_project"] != first["compose_project"]  # a fresh stack, not the old one
    assert "-retry_once-0-a2" in final["compose_project"]
    assert (marker / "attempted").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["totals"]["retried_attempts"] == 1 and summary["all_passed"] is True
    assert lab.is_empty(leftovers(runner, run_dir.name))


def test_a_kill_during_teardown_keeps_the_verdict_and_resume_removes_the_stack(
    tmp_path: Path, runner: SubprocessRunner
) -> None:
    # The stack's one service ignores SIGTERM for 300 s, so forge is certainly still tearing it down when
    # the trial's verdict appears in the log: that is when it gets SIGKILL.
    argv = [sys.executable, "-m", "forgelib", "run", "--config", str(SLOW_TEARDOWN)]
    argv += ["--output", str(tmp_path)]
    proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        log = _log_with_a_verdict(proc, tmp_path)
    finally:
        proc.kill()  # SIGKILL: no chance to clean up or log
        proc.wait()
    run_id = log.parent.name
    for pid in processes_mentioning(run_id.lower()):  # the killed run's own `docker compose down`
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed = ev.fold(ev.read_events(log))
    assert killed.trials[("slow_teardown", 0)].status == "passed"  # on record before the teardown
    assert killed.untorn() == [("slow_teardown", 0)]
    d = log.parent / "trials" / "slow_teardown" / "0"
    assert yaml.safe_load((d / "grade.yaml").read_text())["binary_pass"] is True
    assert yaml.safe_load((d / "trial.yaml").read_text())["status"] == "passed"
    assert not lab.is_empty(leftovers(runner, run_id))  # the killed teardown left the stack

    rc, _ = forge_run(SLOW_TEARDOWN, tmp_path, resume=run_id)
    assert rc == 0
    events = list(ev.read_events(log))
    resumed_at = next(i for i, e in enumerate(events) if e["kind"] == ev.RUN_RESUMED)
    assert not [e for e in events[resumed_at:] if e["kind"] == ev.TRIAL_STATE]  # not run again
    assert lab.is_empty(leftovers(runner, run_id))  # ... and its stack is gone
