"""The benchmarks' shared code reads what forge writes: a trial directory written by forge's own writer,
and the command lines forge's runner logs."""

from __future__ import annotations

from pathlib import Path

from benchmarks import phases_bench as pb
from forgelib.run.grading import failed_grade
from forgelib.run.lifecycle import Termination
from forgelib.run.results import TrialResult, trial_dir, write_trial


def _write(run_dir: Path, index: int, *, passed: bool) -> None:
    grade = failed_grade(["x"], 1.0)
    if passed:
        grade = type(grade)(**{**grade.__dict__, "binary_pass": True, "score": 1.0, "reasons": ()})
    r = TrialResult(
        run_id="r", task="t", index=index, termination=Termination.COMPLETED, grade=grade,
        started_at=100.0, finished_at=104.5, timings={"provision": 2.0, "oracle": 1.0, "teardown": 0.5},
    )  # fmt: skip
    write_trial(trial_dir(run_dir, "t", index), r)


def test_trials_read_back_as_forge_wrote_them(tmp_path: Path) -> None:
    _write(tmp_path, 0, passed=True)
    _write(tmp_path, 1, passed=False)
    trials = pb.read_trials(tmp_path)
    assert [(t["_task"], t["_index"]) for t in trials] == [("t", "0"), ("t", "1")]
    assert [pb.trial_passed(t) for t in trials] == [True, False]
    assert pb.trial_timings(trials[0]) == {"provision": 2.0, "oracle": 1.0, "teardown": 0.5}
    assert pb.trial_total(trials[0]) == 4.5  # wall_seconds, as forge recorded it


def test_command_kind_names_what_forge_ran() -> None:
    base = ["docker", "compose", "--ansi", "never", "--project-name", "p", "--file", "/c.yaml"]
    assert pb.command_kind([*base, "up", "--detach", "--wait", "db"]) == "compose up"
    assert pb.command_kind([*base, "exec", "-T", "--env", "A=1", "db", "psql", "-q"]) == "compose exec psql"
    assert pb.command_kind(["docker", "image", "inspect", "x"]) == "docker image inspect"
    assert pb.command_kind(["psql"]) == "psql" and pb.command_kind([]) == "?"


def test_statistics() -> None:
    assert pb.median([3.0, 1.0, 2.0]) == 2.0
    assert pb.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and pb.percentile([1.0, 5.0], 100) == 5.0
    assert pb.flatten({"a": 1, "b": {"c": 2}, "ok": True}) == {"a": 1.0, "b.c": 2.0}
