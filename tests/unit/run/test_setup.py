"""A task's ``setup:`` on the fake backend: run once per run for all its trials, each trial forking its
checkpoint; a failing setup fails every trial of its task with the setup's reason and output, the other
tasks run; the setup's record is in the run directory and summary.json. And its state machine."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from forgelib.report.page import write_report
from forgelib.run.execute import RunPlan, run_project
from forgelib.run.lifecycle import Outcome, SetupProgress, SetupStep, setup_advance
from forgelib.runner import Result
from forgelib.spec.models import Oracle, Task

from .fakes import SETUP_INDEX, FakeBackend, good_answer, ok, widget_task

SETUP = Oracle(service="app-db", command=("sh", "-c", "load-data"), timeout=30)


def _with_setup(name: str = "read_widget") -> Task:
    return dataclasses.replace(widget_task(name), setup=SETUP)


def _run(tmp_path: Path, tasks: list[Task], backend: FakeBackend, **kw: Any) -> tuple[Path, Any]:
    plan = RunPlan(tasks=tasks, repeats=kw.pop("repeats", 8), output=tmp_path / "runs", **kw)
    return run_project(plan, backend, lambda line: None)


def _setup_fails(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
    if argv == SETUP.command:
        return ok("loaded 10 rows\n", rc=3, stderr="ERROR: relation widgets does not exist\n")
    return good_answer(service, argv, kw)


def test_the_setup_runs_once_and_every_trial_forks_its_checkpoint(tmp_path: Path, fake_backend: Any) -> None:
    backend = fake_backend()
    run_dir, state = _run(tmp_path, [_with_setup(), widget_task("plain")], backend, workers=3)
    assert [r.status for r in state.records()] == ["passed"] * 16
    setups = [r for r in backend.requests if r.get("setup")]
    assert [r["task"] for r in setups] == ["read_widget"]
    assert backend.checkpoints == [f"proj-{state.run_id}-read_widget-setup".lower()]
    setup_stack = backend.stacks[("read_widget", SETUP_INDEX)]
    assert [c[:2] for c in setup_stack.calls] == [("app-db", SETUP.command)]
    forks = {r["trial_index"]: r.get("checkpoint") for r in backend.requests if r["task"] == "read_widget"}
    forks.pop(0)  # the setup stack's request (trial_index 0, setup=True) and trial 0's share the key
    assert set(forks.values()) == {"ck-000000000001"}
    assert all(r.get("checkpoint") is None for r in backend.requests if r["task"] == "plain")
    assert sum(r.get("checkpoint") == "ck-000000000001" for r in backend.requests) == 8
    # its stack came down after the checkpoint; its record is in the run directory and the summary
    assert f"proj-{state.run_id}-read_widget-setup".lower() in backend.torn_down
    record = yaml.safe_load((run_dir / "setups" / "read_widget" / "setup.yaml").read_text())
    assert record["ok"] is True and record["checkpoint"] == "ck-000000000001"
    assert set(record["timings"]) == {"provision", "run", "checkpoint"}  # its teardown: beside the trials
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["setups"]["read_widget"]["checkpoint"] == "ck-000000000001"
    assert list(summary["setups"]) == ["read_widget"]
    trial = yaml.safe_load((run_dir / "trials" / "read_widget" / "3" / "trial.yaml").read_text())
    assert "setup_wait" in trial["timings"]
    page = write_report(run_dir).read_text()  # the report shows it, without its script
    assert "setup of task <code>read_widget</code>: checkpoint <code>ck-000000000001</code>" in page
    assert "href='setups/read_widget/setup.yaml'" in page


def test_a_failing_setup_fails_its_tasks_trials_with_its_reason_and_the_run_goes_on(
    tmp_path: Path, fake_backend: Any
) -> None:
    backend = fake_backend(_setup_fails)
    run_dir, state = _run(tmp_path, [_with_setup(), widget_task("plain")], backend, repeats=3, workers=2)
    by_task = {(r.task, r.index): r for r in state.records()}
    assert [by_task[("plain", i)].status for i in range(3)] == ["passed"] * 3
    for i in range(3):
        r = by_task[("read_widget", i)]
        assert r.status == "error" and r.termination is not None
        assert r.termination.value == "PROVISION_ERROR" and r.error_stage == "setup"
        assert "setup of task 'read_widget' failed" in r.reasons[0]
        assert "relation widgets does not exist" in r.reasons[0] and "loaded 10 rows" in r.reasons[0]
    # run once, never checkpointed, its stack torn down; no trial of the task got a stack
    assert [r["task"] for r in backend.requests if r.get("setup")] == ["read_widget"]
    assert backend.checkpoints == []
    assert f"proj-{state.run_id}-read_widget-setup".lower() in backend.torn_down
    assert not [r for r in backend.requests if r["task"] == "read_widget" and not r.get("setup")]
    d = run_dir / "setups" / "read_widget"
    assert "relation widgets" in (d / "setup.stderr").read_text()
    assert (d / "services" / "app-db.log").is_file()  # the stack's logs, taken before its teardown
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["setups"]["read_widget"]["ok"] is False
    assert summary["totals"]["errors_by_stage"] == {"setup": 3}
    page = write_report(run_dir).read_text()
    assert "setup of task <code>read_widget</code>: <b class='error'>failed</b>" in page
    assert summary["all_passed"] is False


def test_a_setup_stack_that_cannot_be_provisioned_fails_the_tasks_trials(
    tmp_path: Path, fake_backend: Any
) -> None:
    from forgelib.errors import ProvisionError

    backend = fake_backend(fail={("read_widget", SETUP_INDEX): ProvisionError("reset_recipe", "bad seed")})
    _, state = _run(tmp_path, [_with_setup()], backend, repeats=2)
    assert {r.status for r in state.records()} == {"error"}
    assert all("could not be provisioned (reset_recipe): bad seed" in r.reasons[0] for r in state.records())
    assert backend.checkpoints == [] and backend.torn_down == []  # provisioning removed its own stack


def _walk(outcomes: list[Outcome]) -> tuple[list[SetupStep], SetupProgress]:
    p = SetupProgress()
    steps = [p.step]
    for o in outcomes:
        p = setup_advance(p, o)
        steps.append(p.step)
    return steps, p


def test_the_setup_walks_provision_run_checkpoint_teardown() -> None:
    steps, p = _walk([Outcome.OK] * 4)
    assert steps == ["provision", "run", "checkpoint", "teardown", "done"]
    assert p.ok is True and not p.stack_up


@pytest.mark.parametrize(
    ("outcomes", "steps", "failed"),
    [
        ([Outcome.FAILED], ["provision", "done"], "provision"),
        ([Outcome.OK, Outcome.TIMED_OUT, Outcome.OK], ["provision", "run", "teardown", "done"], "run"),
        (
            [Outcome.OK, Outcome.OK, Outcome.FAILED, Outcome.FAILED],
            ["provision", "run", "checkpoint", "teardown", "done"],
            "checkpoint",
        ),
    ],
)
def test_a_failed_step_still_tears_the_setup_stack_down(
    outcomes: list[Outcome], steps: list[str], failed: str
) -> None:
    walked, p = _walk(outcomes)
    assert walked == steps and p.ok is False and p.failed_step == failed and not p.interrupted


def test_an_interrupted_setup_tears_down_and_says_so() -> None:
    walked, p = _walk([Outcome.OK, Outcome.INTERRUPTED, Outcome.OK])
    assert walked == ["provision", "run", "teardown", "done"] and p.interrupted and p.ok is False
    with pytest.raises(ValueError):
        setup_advance(p, Outcome.OK)


def test_a_stop_during_the_setup_tears_its_stack_down_and_takes_no_checkpoint(
    tmp_path: Path, fake_backend: Any
) -> None:
    from forgelib.run.setup import TaskSetups

    stop = [False]
    backend = fake_backend(on_provision=lambda task, index: stop.__setitem__(0, True))
    events: list[tuple[str, dict[str, Any]]] = []

    class Sink:
        def append(self, kind: str, **fields: Any) -> dict[str, Any]:
            events.append((kind, fields))
            return fields

    setups = TaskSetups(
        backend, Sink(), run_id="r1", run_dir=tmp_path, say=lambda line: None,
        stopping=lambda: stop[0], log_tail_lines=10,
    )  # fmt: skip
    task = _with_setup()
    res = setups.result(task)
    assert res.interrupted and not res.ok and res.checkpoint is None
    assert backend.checkpoints == [] and backend.torn_down == ["proj-r1-read_widget-setup"]
    assert backend.stacks[("read_widget", SETUP_INDEX)].calls == []  # the step itself never ran
    assert setups.result(task) is res and len(events) == 1  # asked again: the same answer, not a rerun
