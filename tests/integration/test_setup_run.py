"""`forge run` with a task's `setup:` on a real engine (tests/fixtures/setup_project).

A slow setup (it sleeps, then writes a row to postgres and a file to a seeded volume) runs once for 8
trials: it counts its runs in a host directory, and every trial's checks read its row and its file, and
only its own writes beside them (the forks are independent). A failing setup fails every trial of its task
with its reason and output, while another task runs. A run killed -9 after its checkpoint was taken leaves
the checkpoint to `forge reap --run`. On warm stacks (postgres, redis and a tree), one stack serves the
trials one after the other: a hostile oracle records what it sees first, then vandalises rows, tables,
roles, keys and files, and every trial's first observation is the setup's end state. Nothing of any run is
left on the engine afterwards: no container, network, volume, nor a checkpoint image.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster import wait_for
from support.interrupt import orphans_ended

from forgelib.cli.run import RunOptions, main_run
from forgelib.docker import argv as dk
from forgelib.docker import labels as lab
from forgelib.run import events as ev
from forgelib.runner import SubprocessRunner
from forgelib.stacks.snapshots import checkpoints as ckstore

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

PROJECT = Path(__file__).resolve().parents[1] / "fixtures" / "setup_project"
SETUP = PROJECT / "run_configs" / "setup.yaml"
BROKEN = PROJECT / "run_configs" / "broken.yaml"
WARM = PROJECT / "run_configs" / "warm.yaml"


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The host directory the setup counts its runs in (compose mounts it in runner)."""
    d = tmp_path / "marker"
    d.mkdir()
    d.chmod(0o777)  # the container writes as its own user
    monkeypatch.setenv("FORGE_TEST_MARKER_DIR", str(d))
    return d


def forge_run(config: Path, output: Path, **kw: Any) -> tuple[int, Path]:
    rc = main_run(RunOptions(str(config), output=str(output), **kw))
    [run_dir] = [p for p in output.iterdir() if p.is_dir()]
    return rc, run_dir


def nothing_left(runner: SubprocessRunner, run_id: str, checkpoint: str | None) -> None:
    """No container, network or volume of the run, no image labelled with it, no tag of its checkpoint."""
    assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))
    images = runner.run(
        dk.ls("image", quiet=True, filters=["--filter", f"label={lab.RUN}={run_id}"]), timeout=60
    )
    assert images.stdout.strip() == ""
    if checkpoint is not None:
        tags = runner.run(dk.ls("image", format="{{.Tag}}", filters=[ckstore.REPOSITORY]), timeout=60)
        assert not [t for t in tags.stdout.split() if t.startswith(checkpoint)]


def _trials(run_dir: Path, task: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    out = []
    for d in sorted((run_dir / "trials" / task).iterdir(), key=lambda p: int(p.name)):
        out.append(
            (yaml.safe_load((d / "trial.yaml").read_text()), yaml.safe_load((d / "grade.yaml").read_text()))
        )
    return out


def test_a_slow_setup_runs_once_and_all_8_trials_start_from_it(
    tmp_path: Path, marker: Path, runner: SubprocessRunner
) -> None:
    rc, run_dir = forge_run(SETUP, tmp_path / "runs")
    summary = json.loads((run_dir / "summary.json").read_text())
    setup = summary["setups"]["slow_setup"]
    assert rc == 0, summary["trials"]
    assert (marker / "setup.log").read_text().splitlines() == ["setup ran"]  # once, not 8 times
    assert setup["ok"] is True and setup["checkpoint"].startswith("ck-")
    assert set(setup["timings"]) == {"provision", "run", "checkpoint"}  # its teardown: beside the trials
    assert (run_dir / "setups" / "slow_setup" / "setup.stdout").read_text() == "setup done\n"
    trials = _trials(run_dir, "slow_setup")
    assert len(trials) == 8
    for trial, grade in trials:
        assert trial["status"] == "passed", grade["reasons"]
        assert {svc: rec["outcome"] for svc, rec in trial["snapshots"].items()} == {
            "app-db": "forked",
            "runner": "forked",
        }
        assert {rec["checkpoint"] for rec in trial["snapshots"].values()} == {setup["checkpoint"]}
        # the setup's row and file, and beside them only the seed's and this trial's own
        assert [(c["name"], c["observed"]) for c in grade["checks"]] == [
            ("setup_row", "1"),
            ("setup_file", "prepared"),
            ("own_rows_only", "baseline,prepared,trial"),
            ("seed_file", "seeded"),
        ]
    nothing_left(runner, run_dir.name, setup["checkpoint"])


def test_a_failing_setup_fails_its_trials_with_its_reason_and_the_run_goes_on(
    tmp_path: Path, marker: Path, runner: SubprocessRunner
) -> None:
    rc, run_dir = forge_run(BROKEN, tmp_path / "runs")
    assert rc == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    setup = summary["setups"]["broken_setup"]
    assert setup["ok"] is False and setup["checkpoint"] is None
    assert "in service 'runner' exited 4" in setup["error"]
    assert "the widget feed is unreachable" in setup["log_tail"]
    assert summary["totals"]["errors_by_stage"] == {"setup": 2}
    for trial, grade in _trials(run_dir, "broken_setup"):
        assert (trial["status"], trial["termination_reason"]) == ("error", "PROVISION_ERROR")
        assert trial["error"]["stage"] == "setup" and trial["compose_project"] is None
        reason = grade["reasons"][0]
        assert "setup of task 'broken_setup' failed" in reason
        assert "the widget feed is unreachable" in reason and "loading widgets" in reason
    assert [t["status"] for t, _ in _trials(run_dir, "plain")] == ["passed", "passed"]
    # the failed setup's stack logs were kept, and its stack went
    assert (run_dir / "setups" / "broken_setup" / "services" / "runner.log").is_file()
    nothing_left(runner, run_dir.name, None)


def test_warm_stacks_start_from_the_setup_and_every_reuse_is_reset_to_it(
    tmp_path: Path, marker: Path, runner: SubprocessRunner
) -> None:
    rc, run_dir = forge_run(WARM, tmp_path / "runs")
    summary = json.loads((run_dir / "summary.json").read_text())
    setup = summary["setups"]["warm_setup"]
    assert rc == 0, summary["trials"]
    assert (marker / "setup.log").read_text().splitlines() == ["setup ran"]
    state = (marker / "setup-state.txt").read_text()
    # the setup's row, key and files are in what it saw (the observation is not vacuous)
    assert "baseline,prepared" in state and "setup:key string" in state
    assert "prepared.txt 644 root 9" in state and "sub/nested.txt 640 root 7" in state
    trials = _trials(run_dir, "warm_setup")
    assert len(trials) == 4
    stacks = [trial["stack"] for trial, _ in trials]
    assert {s["mode"] for s in stacks} == {"warm"}
    # one stack, reused by every trial after the first, none replaced: each reuse was reset and proven
    # clean against the checkpoint's fingerprints
    assert len({s["name"] for s in stacks}) == 1, stacks
    assert [s["reuse"] for s in stacks] == [0, 1, 2, 3] and not any(s["replaced"] for s in stacks)
    for trial, grade in trials:
        assert trial["status"] == "passed", grade["reasons"]
        assert {svc: rec["checkpoint"] for svc, rec in trial["snapshots"].items()} == {
            "app-db": setup["checkpoint"],
            "cache": setup["checkpoint"],
            "runner": setup["checkpoint"],
        }
    seen = sorted(marker.glob("trial-*.txt"), key=lambda p: int(p.stem.split("-")[1]))
    assert len(seen) == 4
    for path in seen:  # every trial first saw exactly the setup's end state, whatever the one before did
        assert path.read_text() == state, path.name
    nothing_left(runner, run_dir.name, setup["checkpoint"])


# engine_alone: the killed run's stacks and checkpoint belong to a dead owner, so any other forge process
# (every `forge run` heals the engine at start) may reap them before this test's own `forge reap` does
@pytest.mark.engine_alone
def test_a_run_killed_after_its_checkpoint_leaves_it_to_forge_reap(
    tmp_path: Path, marker: Path, runner: SubprocessRunner
) -> None:
    output = tmp_path / "runs"
    output.mkdir()
    argv = [sys.executable, "-m", "forgelib", "run", "--config", str(SETUP), "--repeats", "2"]
    proc = subprocess.Popen(
        [*argv, "--output", str(output)], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:

        def setup_done() -> bool:
            logs = list(output.glob(f"*/{ev.EVENTS_FILE}"))
            return bool(logs) and ev.SETUP_FINISHED in logs[0].read_text()

        wait_for("the setup's end in the forge child's log", setup_done, proc, timeout=600)
    finally:
        proc.kill()
        proc.wait()
    [log] = list(output.glob(f"*/{ev.EVENTS_FILE}"))
    run_id = log.parent.name
    state = ev.fold(ev.read_events(log))
    checkpoint = state.setups["slow_setup"]["checkpoint"]
    assert checkpoint and ckstore.load(runner, checkpoint).manifest["project"] == "setup_project"
    orphans_ended(run_id)
    res = subprocess.run(
        [sys.executable, "-m", "forgelib", "reap", "--run", run_id],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert checkpoint in res.stdout  # the run's own checkpoint went with its stacks
    nothing_left(runner, run_id, checkpoint)
