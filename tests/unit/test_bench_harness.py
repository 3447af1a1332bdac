"""The benchmarks' shared library (benchmarks/harness.py): a ``forge run`` child's results read with forge's
own readers, the command lines forge's runner logs, statistics and the report table."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from benchmarks import harness as bs
from forgelib.cli.exits import LOG_FORMAT
from forgelib.run.results import RecordedTrial
from forgelib.runner import SubprocessRunner

# A stand-in for `python -m forgelib`: writes one trial with forge's own writers where `--output` says.
FAKE_FORGE = """
import sys
from pathlib import Path
from forgelib.run import events as ev
from forgelib.grading.score import failed_grade
from forgelib.run.lifecycle import Termination
from forgelib.run.results import TrialResult, trial_dir, write_summary, write_trial
run_dir = Path(sys.argv[sys.argv.index("--output") + 1]) / "run-1"
run_dir.mkdir(parents=True)
(run_dir / ev.EVENTS_FILE).write_text('{"kind": "run_started", "run_id": "run-1", "plan": []}\\n')
grade = failed_grade(["x"], 1.0)
r = TrialResult(run_id="run-1", task="t", index=0, termination=Termination.COMPLETED, grade=grade,
                started_at=1.0, finished_at=3.0, timings={"provision": 1.5})
write_trial(trial_dir(run_dir, "t", 0), r)
write_summary(run_dir, {"run_id": "run-1", "timings": {}})
print(open(sys.argv[sys.argv.index("--config") + 1]).read())
"""


def test_a_forge_child_is_measured_and_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "fake_forge.py"
    script.write_text(FAKE_FORGE)
    monkeypatch.setattr(bs, "FORGE_ARGV", [bs.sys.executable, str(script)])
    config = tmp_path / "dev.yaml"
    config.write_text("the config")
    run = bs.run_forge(config, repeats=1, workdir=tmp_path, timeout=120)
    assert run.rc == 0 and run.stdout.strip() == "the config" and run.wall > 0
    assert run.argv[2:7] == ["run", "--config", str(config), "--repeats", "1"]
    assert run.run_id == "run-1" and run.summary == {"run_id": "run-1", "timings": {}}
    [trial] = run.trials()
    assert (trial.task, trial.index, trial.wall_seconds, trial.binary_pass) == ("t", 0, 2.0, False)
    assert run.passed() == 0
    with pytest.raises(SystemExit, match="--workers 1"):  # an arm that must pass stops the benchmark
        bs.checked_run(config, repeats=1, workers=1, root=tmp_path)


def _trial(timings: dict[str, float]) -> RecordedTrial:
    return RecordedTrial("t", 0, "passed", True, 1.0, timings, None, {}, {}, ())


def test_phase_medians_sum_a_kind_per_trial_and_keep_the_kinds_order() -> None:
    trials = [_trial({"recipe:db": 1.0, "recipe:cache": 2.0, "oracle": 5.0}), _trial({"recipe:db": 1.0})]
    assert bs.phase_medians(trials, ["oracle", "recipe"]) == {"oracle": 5.0, "recipe": 2.0}
    assert bs.phase_medians(trials, ["recipe"], each=["recipe"]) == {
        "recipe": 2.0, "recipe:cache": 2.0, "recipe:db": 1.0,
    }  # fmt: skip


def test_phase_medians_count_a_reused_stacks_reset_done_ahead() -> None:
    ahead = {"reset:db": 1.5, "fingerprint:db": 0.2, "seconds": 1.8, "ended_at": 1.7e9}
    t = RecordedTrial("t", 1, "passed", True, 1.0, {"oracle": 5.0}, None, {"reset_ahead": ahead}, {}, ())
    assert bs.phase_medians([t], ["reset", "oracle"], each=["reset"]) == {
        "reset": 1.5, "reset:db": 1.5, "oracle": 5.0,
    }  # fmt: skip


def test_command_log_lines_read_back_as_the_runner_logs_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="forgelib"):
        SubprocessRunner().run([bs.sys.executable, "-c", "pass"])
    log = tmp_path / "forge.log"
    fmt = logging.Formatter(LOG_FORMAT)
    log.write_text("\n".join(fmt.format(r) for r in caplog.records) + "\n")
    [cmd] = bs.read_commands(log)
    assert cmd.rc == "0" and cmd.argv[0] == bs.sys.executable and cmd.seconds >= 0


def test_command_kind_names_what_forge_ran() -> None:
    base = ["docker", "compose", "--ansi", "never", "--project-name", "p", "--file", "/c.yaml"]
    assert bs.command_kind([*base, "up", "--detach", "--wait", "db"]) == "compose up"
    assert bs.command_kind([*base, "exec", "-T", "--env", "A=1", "db", "psql", "-q"]) == "compose exec psql"
    assert bs.command_kind(["docker", "image", "inspect", "x"]) == "docker image inspect"
    assert bs.command_kind(["psql"]) == "psql" and bs.command_kind([]) == "?"


def test_statistics_and_the_table() -> None:
    assert bs.median([3.0, 1.0, 2.0]) == 2.0
    assert bs.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and bs.percentile([1.0, 5.0], 100) == 5.0
    assert bs.verdict(1.0, 1.1) == "OK" and bs.verdict(1.2, 1.1) == "OVER TARGET"
    assert bs.table([{"a": 1.5, "bb": "x"}, {"a": 200.0}]).splitlines() == [
        "a      bb", "-----  --", "1.500  x", "200",
    ]  # fmt: skip


def test_a_strategy_copy_of_a_pack_resets_its_sql_dump_services_that_way_and_loads(tmp_path: Path) -> None:
    import yaml

    from forgelib.spec.loader import load_project_config, load_run_config

    pack = bs.REPO / "examples/multi_service_postgres_reset"
    config = pack / "run_configs/dev.yaml"
    assert bs.with_strategy(config, "exact", tmp_path) == config  # the default: the pack as it is
    copy = bs.with_strategy(config, "template", tmp_path)
    assert copy == tmp_path / f"{pack.name}-template" / "run_configs/dev.yaml"
    doc = yaml.safe_load((copy.parents[1] / "project.yaml").read_text())
    services = doc["default_environment"]["services"].values()
    resets = [s["reset"] for s in services if isinstance((s or {}).get("reset"), dict)]
    assert resets and all(r.get("strategy") == "template" for r in resets)
    loaded = load_run_config(copy)
    assert loaded.project == copy.parents[1]
    assert load_project_config(loaded.project / "project.yaml")  # the copy is a valid project


def test_restore_rows_read_the_default_strategys_resets_by_kind_against_issue_41s_goals() -> None:
    from benchmarks import warm_bench

    rows = [
        {
            "pack": "cache", "strategy": "exact", "workers": 1, "reused_trials": 15, "trial warm/fresh": 0.3,
            "reset_median_s": {"reset:app-db": 0.4, "reset:redis": 0.25},
        },
        {"pack": "cache", "strategy": "template", "workers": 1, "reset_median_s": {"reset:app-db": 0.01}},
        {"pack": "readiness (postgres runner)", "rounds": 5},
    ]  # fmt: skip
    (row,) = warm_bench._restore_rows(rows)
    assert row["restore_median_s"] == {"sql_dump (reset:app-db)": 0.4, "redis_dump (reset:redis)": 0.25}
    assert row["restore_goal"].startswith("MISSED")  # redis over its 0.2 s, though postgres is within 0.5 s
    assert row["trial_goal"] == "<= 0.25 MISSED" and row["n (reused trials)"] == 15
    rows[0]["reset_median_s"] = {"reset:app-db": 0.4, "reset:redis": 0.01}
    rows[0]["trial warm/fresh"] = 0.2
    (row,) = warm_bench._restore_rows(rows)
    assert row["restore_goal"].startswith("OK") and row["trial_goal"] == "<= 0.25 OK"
