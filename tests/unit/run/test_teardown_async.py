"""A fresh stack's teardown runs beside the worker's next trial, never before it: the next trial gets its
stack while the last one's graceful ``down`` is still going; the verdict is on record before the down; the
run ends only once every stack is down (its ``trial_torn_down`` events precede ``run_finished``)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Unpack

from forgelib.run import events as ev
from forgelib.run.execute import RunPlan, TrialRequest, run_project
from forgelib.spec.models import Task

from .fakes import FakeBackend, FakeHandle, good_answer, widget_task


class _SlowDown(FakeBackend):
    """The first stack's ``down`` lasts until the second trial has its stack (at most 10 s: a teardown on
    the worker's path would sit those out, and the second stack would come up after it)."""

    def __init__(self) -> None:
        super().__init__(good_answer)
        self.second_up = threading.Event()
        self.order: list[str] = []

    def provision(self, task: Task, **trial: Unpack[TrialRequest]) -> FakeHandle:
        handle = super().provision(task, **trial)
        self.order.append(f"up {trial['trial_index']}")
        if trial["trial_index"] == 1:
            self.second_up.set()
        return handle

    def teardown(self, trial: Any, *, graceful: bool = True) -> float:
        self.second_up.wait(10)
        self.order.append(f"down {trial.name}")
        return super().teardown(trial, graceful=graceful)


def test_the_next_trial_does_not_wait_for_the_last_ones_teardown(tmp_path: Path) -> None:
    backend = _SlowDown()
    plan = RunPlan(tasks=[widget_task()], repeats=2, output=tmp_path / "runs", workers=1)
    run_dir, state = run_project(plan, backend, lambda line: None)
    assert backend.order[:2] == ["up 0", "up 1"], backend.order  # trial 1 up while trial 0 came down
    assert len(backend.order) == 4 and all(o.startswith("down") for o in backend.order[2:])
    kinds = [e["kind"] for e in ev.read_events(run_dir / ev.EVENTS_FILE)]
    assert kinds.count(ev.TRIAL_TORN_DOWN) == 2 and state.untorn() == []
    assert max(i for i, k in enumerate(kinds) if k == ev.TRIAL_TORN_DOWN) < kinds.index(ev.RUN_FINISHED)
    assert [r.status for r in state.records()] == ["passed", "passed"]
