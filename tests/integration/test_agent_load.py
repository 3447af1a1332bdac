"""Agent-shaped load on the real engine (issue 30): the postgres pack's task solved by the simulated agent
(benchmarks/sim_agent.py: a "model" sleep before each real tool call, then the task's own solver).

* Warm, 6 trials at workers 3: the trials hold their stacks for ~12 s at little CPU, so the pool provisions
  ahead until there is a stack per worker; every acquisition is a ``stack_acquired`` event and
  summary.json tells the decisions, the queueing and each trial's time to ready. A stack given back is
  reset in the background: every reused stack's reset (and verification) ended before the trial that got
  it was handed it, none on a trial's path.
* Fresh, a memory budget below one stack: the trials queue for memory (each stack counts until its
  teardown is over), one stack at a time, and every trial is still graded.
* Fresh, one start place: the stacks come up one at a time, the other trials queue for the place
  (``start_wait``, their time to ready's ``queue``).

Nothing labelled with either run is left afterwards.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks import agent_pack
from forgelib.cli.run import RunOptions, main_run
from forgelib.docker import labels as lab
from forgelib.runner import SubprocessRunner

pytestmark = pytest.mark.integration


def _run(config: Path, out: Path, runner: SubprocessRunner) -> tuple[int, Path]:
    rc = main_run(RunOptions(str(config), output=str(out), as_json=True))
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return rc, run_dir


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


def _no_leftovers(runner: SubprocessRunner, run_dir: Path) -> None:
    left = lab.resources_with_labels(runner, {lab.RUN: run_dir.name})
    assert lab.is_empty(left), f"leaked: {left}"


def test_a_waiting_workload_gets_a_warm_stack_per_worker(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    config = agent_pack.make("postgres", tmp_path / "pack", latency="6", calls=2, repeats=6, workers=3)
    rc, run_dir = _run(config, tmp_path / "runs", runner)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert rc == 0 and summary["totals"]["passed"] == 6, summary["totals"]
        acquired = _events(run_dir, "stack_acquired")
        assert len(acquired) == 6
        pool = summary["pool"]
        # Grown to a stack per worker (for a waiting trial: ahead, or by the pool's own rule where the
        # run's CPU figure is not yet in; which one depends on the machine's speed, and the choice
        # itself is tests/unit/test_admission.py's and test_warm.py's) ...
        d = pool["decisions"]
        assert pool["peak_stacks"] >= 3 and d.get("first") == 1, pool
        assert d.get("ahead", 0) + d.get("grow", 0) == 2, pool
        # ... and the second wave gets stacks already clean: the first wave's, reset when given back, or
        # spares provisioned while the first wave waited on its model (6 trials, 3 workers).
        assert d.get("reuse", 0) + d.get("spare", 0) == 3 and pool["evictions"] == 0, pool
        assert pool["resets_ahead"] == d.get("reuse", 0), pool
        assert pool["per_stack_mb"] and pool["per_stack_mb"] > 0 and pool["budget_mb"] > 0, pool
        assert pool["memory_waits"] == 0
        ready = summary["ready"]
        assert ready["count"] == 6 and ready.get("reused", {}).get("count", 0) == d.get("reuse", 0), ready
        for e in acquired:
            if e["decision"] != "reuse":
                continue
            # The stack's reset ended before the trial was handed it: at once (the trial asked after it)
            # or after waiting for that very reset (`reset_wait`, counted as `reset` in its ready time).
            r = e["ready"]
            handed_at = e["asked_at"] + r["queue"] + r["memory"] + r["reset"]
            assert e["reset_ahead"] > 0 and e["reset_ended_at"] <= handed_at + 0.01, e
            assert r["reset"] == pytest.approx(e.get("reset_wait", 0.0), abs=0.002), e
        for i in range(6):
            trial = yaml.safe_load((run_dir / "trials" / "read_widget" / str(i) / "trial.yaml").read_text())
            r = trial["ready"]
            assert r["seconds"] == trial["timings"]["provision"]
            assert r["queue"] + r["memory"] + r["provisioning"] + r["reset"] == pytest.approx(
                r["seconds"], abs=0.01
            )
            # No reset step on any trial's path; a reused stack carries the one done before it.
            assert not [k for k in trial["timings"] if k.startswith(("reset:", "fingerprint:"))], trial
            reused = trial["stack"]["reuse"] > 0
            assert bool(r.get("reused")) == reused, trial
            assert ("reset:app-db" in trial["stack"].get("reset_ahead", {})) == reused, trial
        assert "stack_acquired" not in summary["skipped_events"]["unknown_kinds"]
    finally:
        _no_leftovers(runner, run_dir)


@contextlib.contextmanager
def _three_fresh_trials(
    tmp_path: Path, runner: SubprocessRunner, **options: Any
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Three fresh trials asked at once (workers 3, a 1 s agent), all graded: the run's summary and its
    ``stack_acquired`` events; nothing of the run left afterwards."""
    config = agent_pack.make(
        "postgres", tmp_path / "pack", latency="1", calls=1, repeats=3, workers=3, stacks="fresh", **options
    )
    rc, run_dir = _run(config, tmp_path / "runs", runner)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        assert rc == 0 and summary["totals"]["passed"] == 3, summary["totals"]
        assert summary["pool"]["decisions"] == {"fresh": 3}, summary["pool"]
        yield summary, _events(run_dir, "stack_acquired")
    finally:
        _no_leftovers(runner, run_dir)


def test_a_memory_budget_below_one_stack_queues_trials_and_grades_them_all(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The memory ledger is shared by every forge process on the engine: this run's own, so that what other
    # tests' stacks hold meanwhile does not change how long these trials wait.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with _three_fresh_trials(tmp_path, runner, memory_budget_mb=64) as (summary, acquired):
        pool = summary["pool"]
        # The budget admits one stack at a time, counted until it is down: the other two waited for memory,
        # and never two stacks at once.
        assert pool["memory_waits"] == 2 and pool["peak_stacks"] == 1 and pool["budget_mb"] == 64, pool
        assert summary["ready"]["waited_on"]["memory"] > 0
        waits = sorted(e["memory_wait"] for e in acquired)
        assert waits[0] == 0 and waits[1] > 0 and waits[2] > waits[1]


def test_fresh_stacks_come_up_one_per_place_and_the_others_queue(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from forgelib.stacks import session

    monkeypatch.setattr(session, "usable_cores", lambda: 1)  # one start place, whatever this box has
    # Start places are shared by every forge process on the engine: this run's own, so that another test's
    # stacks coming up meanwhile cannot take the place the first trial must find free.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with _three_fresh_trials(tmp_path, runner) as (summary, acquired):
        pool = summary["pool"]
        # Room for all three in memory: one stack came up at a time, and the other two queued for the
        # place, the last one for two bring-ups.
        assert pool["memory_waits"] == 0 and pool["start_waits"] == 2 and pool["queued"] == 2, pool
        waits = sorted(e["start_wait"] for e in acquired)
        assert waits[0] == 0 and waits[1] > 0 and waits[2] > waits[1]
        assert summary["ready"]["waited_on"]["queue"] >= waits[1] + waits[2] - 0.01
