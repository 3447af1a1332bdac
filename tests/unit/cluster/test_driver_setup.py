"""``forge run --cluster`` with a task's ``setup:`` on a stand-in for Ray (no cluster, no engine): the setup
runs once on one slot, its checkpoint is exported there and adopted by one slot of every other node, every
trial's order carries the setup's result, a node the copy failed on gets none of the task's trials, a
failed setup is copied nowhere, and the slots holding the checkpoint end the run last.

The real thing (two nodes, two engines) is tests/integration/test_cluster.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from forgelib.cluster.driver import Cluster, ClusterExecutor, SlotRef
from forgelib.cluster.node import SetupReturn, TrialOrder, TrialReturn
from forgelib.run import events as ev
from forgelib.run.execute import Settings
from forgelib.run.setup import SetupResult
from forgelib.spec.loader import load_project_config
from forgelib.spec.models import Task
from tests.unit.cluster.test_driver_retries import Events, FakeRay, Ref

PROJECT = Path(__file__).resolve().parents[2] / "fixtures" / "setup_project"
CK = "ck-aaaaaaaaaaaa"


@dataclass
class SetupSlot:
    node: str
    log: list[tuple[str, str]]  # (node, call)
    setup_ok: bool = True
    adopt_error: str | None = None
    orders: list[TrialOrder] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.setup = SimpleNamespace(remote=self._setup)
        self.export = SimpleNamespace(remote=self._export)
        self.adopt = SimpleNamespace(remote=self._adopt)
        self.run = SimpleNamespace(remote=self._run)
        self.drain = SimpleNamespace(remote=lambda *a: Ref([]))
        self.stop = SimpleNamespace(remote=lambda *a: Ref())
        self.no_more = SimpleNamespace(remote=lambda *a: Ref())
        self.end = SimpleNamespace(remote=lambda *a: (self.log.append((self.node, "end")), Ref())[1])

    def _setup(self, bundle: object, order: TrialOrder, code: str) -> Ref:
        self.log.append((self.node, "setup"))
        d = Path("/node/run/setups") / order.task
        result = SetupResult(order.task, self.setup_ok, CK if self.setup_ok else None, 1.0, {}, d,
                             error=None if self.setup_ok else "run: exit 1")  # fmt: skip
        return Ref(SetupReturn({"id": self.node}, result), ticks=1)

    def _export(self, run_id: str, driver: str, checkpoint: str) -> Ref:
        self.log.append((self.node, f"export {checkpoint}"))
        return Ref("the copy")

    def _adopt(self, bundle: object, order: TrialOrder, code: str, copy: Ref) -> Ref:
        self.log.append((self.node, f"adopt {copy.value}"))
        return Ref(
            TrialReturn({"id": self.node}, error=self.adopt_error, marks={"bytes": 10.0, "adopt": 0.5})
        )

    def _run(self, bundle: object, order: TrialOrder, code: str) -> Ref:
        self.orders.append(order)
        return Ref(TrialReturn({"id": self.node}, started=False), ticks=1)


@pytest.fixture(scope="module")
def task() -> Task:
    return load_project_config(PROJECT).task("slow_setup")


def run(tmp_path: Path, task: Task, slots: list[SetupSlot], trials: int = 4) -> tuple[Any, Events]:
    refs = [SlotRef(s.node, 0, s) for s in slots]
    cluster = SimpleNamespace(
        ray=FakeRay(), slots=refs, driver="drv", bundle_ref=None, code="c", alive=lambda node: True,
        other_code_slots=lambda: [], used={}, holders=set(), started=lambda slot: True,
    )  # fmt: skip
    events = Events()
    settings = Settings(run_id="r1", run_dir=tmp_path / "run")
    executor = ClusterExecutor(cluster, events, settings, lambda line: None)  # type: ignore[arg-type]
    executor.run([(task, i) for i in range(trials)])
    return cluster, events


def test_the_setup_runs_once_and_its_checkpoint_reaches_every_other_node(tmp_path: Path, task: Task) -> None:
    log: list[tuple[str, str]] = []
    slots = [SetupSlot("n1", log), SetupSlot("n2", log), SetupSlot("n3", log)]
    cluster, _ = run(tmp_path, task, slots)
    assert [c for c in log if c[1] == "setup"] == [("n1", "setup")]
    assert ("n1", f"export {CK}") in log
    assert {c for c in log if c[1].startswith("adopt")} == {
        ("n2", "adopt the copy"),
        ("n3", "adopt the copy"),
    }
    orders = [o for s in slots for o in s.orders]
    assert len(orders) == 4 and {s.node for s in slots if s.orders} == {"n1", "n2", "n3"}
    assert all(o.setup is not None and o.setup.ok and o.setup.checkpoint == CK for o in orders)
    # the setup's record is the driver's, with what the copy cost
    record = (tmp_path / "run" / "setups" / task.name / "setup.yaml").read_text()
    assert "copies:" in record and "nodes: 2" in record
    assert cluster.holders == {("n1", 0), ("n2", 0), ("n3", 0)}


def test_a_node_the_copy_failed_on_runs_none_of_the_tasks_trials(tmp_path: Path, task: Task) -> None:
    log: list[tuple[str, str]] = []
    slots = [SetupSlot("n1", log), SetupSlot("n2", log), SetupSlot("n3", log, adopt_error="no such image")]
    run(tmp_path, task, slots, trials=6)
    assert not slots[2].orders and len(slots[0].orders) + len(slots[1].orders) == 6


def test_a_failed_setup_is_copied_nowhere_and_every_trial_carries_its_failure(
    tmp_path: Path, task: Task
) -> None:
    log: list[tuple[str, str]] = []
    slots = [SetupSlot("n1", log, setup_ok=False), SetupSlot("n2", log)]
    run(tmp_path, task, slots)
    assert [c[1] for c in log] == ["setup"]
    orders = [o for s in slots for o in s.orders]
    assert len(orders) == 4 and all(o.setup is not None and not o.setup.ok for o in orders)


def test_the_slots_holding_the_checkpoint_end_the_run_last() -> None:
    log: list[tuple[str, str]] = []
    slots = {(n, 0): SlotRef(n, 0, SetupSlot(n, log)) for n in ("n1", "n2", "n3", "n4")}
    ray = SimpleNamespace(get=lambda ref: None, exceptions=FakeRay.exceptions)
    fake = SimpleNamespace(used=slots, holders={("n1", 0), ("n3", 0)}, started=lambda s: True, ray=ray,
                           driver="drv")  # fmt: skip
    Cluster.end(fake, "r1")  # type: ignore[arg-type]
    ended = [n for n, call in log if call == "end"]
    assert sorted(ended[:2]) == ["n2", "n4"] and sorted(ended[2:]) == ["n1", "n3"]


def test_the_setup_finished_event_names_the_drivers_copy_of_its_files(tmp_path: Path, task: Task) -> None:
    log: list[tuple[str, str]] = []
    slot = SetupSlot("n1", log)
    finished = {"task": task.name, "ok": True, "checkpoint": CK, "dir": "/node/run/setups/slow_setup"}
    once = [[("event", (ev.SETUP_FINISHED, finished))]]
    slot.drain = SimpleNamespace(remote=lambda *a: Ref(once.pop() if once else []))
    _, events = run(tmp_path, task, [slot], trials=1)
    (rec,) = [e for e in events.lines if e["kind"] == ev.SETUP_FINISHED]
    assert rec["dir"] == str(tmp_path / "run" / "setups" / task.name)


class InterruptingRay(FakeRay):
    """Ctrl-C lands in the driver's first wait; the slot's answer comes after it."""

    def __init__(self) -> None:
        self.pressed = False

    def wait(self, refs: list[Ref], num_returns: int, timeout: float) -> tuple[list[Ref], list[Ref]]:
        if not self.pressed:
            self.pressed = True
            raise KeyboardInterrupt
        return super().wait(refs, num_returns, timeout)


def test_ctrl_c_during_the_setup_stops_its_slot_keeps_its_record_and_sends_no_trial(
    tmp_path: Path, task: Task
) -> None:
    log: list[tuple[str, str]] = []
    slot = SetupSlot("n1", log, setup_ok=False)
    stops: list[int] = []
    slot.stop = SimpleNamespace(remote=lambda run_id, level, driver: (stops.append(level), Ref())[1])
    refs = [SlotRef("n1", 0, slot), SlotRef("n2", 0, SetupSlot("n2", log))]
    cluster = SimpleNamespace(
        ray=InterruptingRay(), slots=refs, driver="drv", bundle_ref=None, code="c", alive=lambda node: True,
        other_code_slots=lambda: [], used={}, holders=set(), started=lambda slot: True,
    )  # fmt: skip
    events = Events()
    executor = ClusterExecutor(
        cluster, events, Settings(run_id="r1", run_dir=tmp_path / "run"), lambda line: None
    )  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        executor.run([(task, 0), (task, 1)])
    assert stops == [1] and [c[1] for c in log] == ["setup"]  # stopped, waited for, nothing copied
    assert not slot.orders and ev.RUN_INTERRUPTED in [e["kind"] for e in events.lines]
    assert cluster.used == {("n1", 0): refs[0]}  # so the run's end ends it there
