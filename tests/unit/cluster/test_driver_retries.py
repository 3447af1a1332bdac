"""The cluster driver's reruns of trials whose node was lost, on a stand-in for Ray (no cluster, no engine):
which orders go to which node with how many of the plan's retries, and what is recorded on the driver.

The real thing (nodes killed under a running ``forge run --cluster``) is tests/integration/test_cluster.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from forgelib.cluster.driver import NODE_LOST, ClusterExecutor, SlotRef
from forgelib.cluster.node import TrialOrder, TrialReturn
from forgelib.errors import ForgeError
from forgelib.run import events as ev
from forgelib.run.execute import Settings
from forgelib.spec.loader import load_project_config
from forgelib.spec.models import Task

PACK = Path(__file__).resolve().parents[3] / "examples" / "multi_service_postgres_reset"


class RayError(Exception):
    pass


class RayTaskError(RayError):
    pass


@dataclass(eq=False)  # hashable by identity, as the driver keys its in-flight trials by ref
class Ref:
    """An object ref: ready after ``ticks`` more ``wait`` calls; its value, or the error ``get`` raises."""

    value: Any = None
    error: Exception | None = None
    ticks: int = 0


class FakeRay:
    exceptions = SimpleNamespace(RayError=RayError, RayTaskError=RayTaskError)

    def wait(self, refs: list[Ref], num_returns: int, timeout: float) -> tuple[list[Ref], list[Ref]]:
        for r in refs:
            r.ticks -= 1
        done = [r for r in refs if r.ticks < 0]
        return done, [r for r in refs if r not in done]

    def get(self, ref: Ref) -> Any:
        if ref.error is not None:
            raise ref.error
        return ref.value


# What a node does with one order: ("lost", events drained before) or ("passed", events).
Script = tuple[str, list[tuple[str, dict[str, Any]]]]


@dataclass
class FakeSlot:
    """A slot actor: ``run`` answers from the script; ``drain`` hands over the events of the running order
    once, and fails like a lost slot's call after its node was lost."""

    node: str
    scripts: list[Script]
    orders: list[tuple[str, TrialOrder]]
    events: list[tuple[str, tuple[str, dict[str, Any]]]] = field(default_factory=list)
    lost: bool = False
    told: list[tuple[str, int]] | None = None  # (node, orders sent so far) at each `no_more`

    def _no_more(self, run_id: str, driver: str) -> Ref:
        if self.told is not None:
            self.told.append((self.node, len(self.orders)))
        return Ref(error=RayError("the actor died") if self.lost else None)

    def __post_init__(self) -> None:
        self.run = SimpleNamespace(remote=self._run)
        self.drain = SimpleNamespace(remote=self._drain)
        self.stop = SimpleNamespace(remote=lambda *a: Ref())
        self.no_more = SimpleNamespace(remote=self._no_more)

    def _run(self, bundle: object, order: TrialOrder, code: str) -> Ref:
        self.orders.append((self.node, order))
        outcome, events = self.scripts.pop(0)
        self.events = [("event", (kind, {"node": self.node, **f})) for kind, f in events]
        if outcome == "lost":
            self.lost = True
            return Ref(error=RayError("NodeDiedError: the node died"), ticks=1)  # after one drain
        return Ref(TrialReturn({"id": self.node}, status=outcome), ticks=1)

    def _drain(self, run_id: str, driver: str) -> Ref:
        if self.lost and not self.events:
            return Ref(error=RayError("the actor died"))
        items, self.events = self.events, []
        return Ref(items)


class Events:
    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.lines.append({"kind": kind, **fields})
        return self.lines[-1]


@pytest.fixture(scope="module")
def task() -> Task:
    return load_project_config(PACK).tasks[0]


def run_cluster(
    tmp_path: Path,
    task: Task,
    retries: int,
    scripts: list[Script],
    nodes: int = 3,
    stacks: str = "fresh",
    told: list[tuple[str, int]] | None = None,
) -> tuple[list[tuple[str, int]], Events, Callable[[], list[str]]]:
    """One trial through a ClusterExecutor over ``nodes`` one-slot nodes; each order takes the next script.
    Returns the orders (node, retries sent), the driver's events, and the trial's shelved attempts;
    ``told`` gets each slot's ``no_more`` call."""
    orders: list[tuple[str, TrialOrder]] = []
    slots = [SlotRef(f"n{i}", 0, FakeSlot(f"n{i}", scripts, orders, told=told)) for i in range(1, nodes + 1)]
    cluster = SimpleNamespace(
        ray=FakeRay(), slots=slots, driver="drv", bundle_ref=None, code="c",
        alive=lambda node: False, other_code_slots=lambda: [], used={}, started=lambda slot: True,
    )  # fmt: skip
    events = Events()
    settings = Settings(run_id="r1", run_dir=tmp_path / "run", retries=retries)
    executor = ClusterExecutor(cluster, events, settings, lambda line: None, stacks=stacks)  # type: ignore[arg-type]
    executor.run([(task, 0)])
    shelf = tmp_path / "run" / "trials" / task.name / "0" / "attempts"
    return (
        [(node, o.retries) for node, o in orders],
        events,
        lambda: sorted(p.name for p in shelf.iterdir()) if shelf.is_dir() else [],
    )


def finished(task: Task, attempt: int) -> tuple[str, dict[str, Any]]:
    return ev.TRIAL_FINISHED, {"task": task.name, "index": 0, "attempt": attempt, "status": "passed"}


def node_lost(events: Events) -> list[tuple[str, int]]:
    """(event kind, attempt) of what the driver recorded for lost nodes."""
    return [(e["kind"], e["attempt"]) for e in events.lines if e.get("error_stage") == NODE_LOST]


def test_without_retries_a_lost_node_costs_one_rerun_elsewhere(tmp_path: Path, task: Task) -> None:
    orders, events, shelved = run_cluster(tmp_path, task, 0, [("lost", []), ("passed", [finished(task, 2)])])
    assert orders == [("n1", 0), ("n2", 0)]  # the rerun goes to another node, with no retries to spend
    assert node_lost(events) == [(ev.TRIAL_ATTEMPT, 1)]
    lost = next(e for e in events.lines if e.get("error_stage") == NODE_LOST)
    assert lost["termination_reason"] == "ENGINE_LOST" and lost["node"] == "n1"
    assert shelved() == ["1"]  # the lost attempt's record, out of the way of the rerun's files


def test_without_retries_a_second_lost_node_is_the_verdict(tmp_path: Path, task: Task) -> None:
    orders, events, shelved = run_cluster(tmp_path, task, 0, [("lost", []), ("lost", [])])
    assert orders == [("n1", 0), ("n2", 0)]
    assert node_lost(events) == [(ev.TRIAL_ATTEMPT, 1), (ev.TRIAL_FINISHED, 2)]
    assert shelved() == ["1"]


def test_the_plans_retries_are_spent_across_nodes_and_never_refilled(tmp_path: Path, task: Task) -> None:
    # retries: 2. The first node retries the trial once itself (a trial_attempt drained from it), then dies:
    # the rerun keeps the one retry left (the first loss is free). The second node dies before any event:
    # that loss spends it. The third gets none left, and its loss is the verdict.
    key = {"task": task.name, "index": 0}
    first_node = [
        (ev.TRIAL_STATE, {**key, "phase": "provisioning", "attempt": 1}),
        (ev.TRIAL_ATTEMPT, {**key, "attempt": 1, "termination_reason": "ORACLE_TIMEOUT"}),
        (ev.TRIAL_STATE, {**key, "phase": "oracle", "attempt": 2}),
    ]
    orders, events, shelved = run_cluster(
        tmp_path, task, 2, [("lost", first_node), ("lost", []), ("lost", [])]
    )
    assert orders == [("n1", 2), ("n2", 1), ("n3", 0)]
    # Attempts count on: 1 (the node's own retry), 2 lost with n1, 3 lost with n2 before it reported any.
    assert node_lost(events) == [(ev.TRIAL_ATTEMPT, 2), (ev.TRIAL_ATTEMPT, 3), (ev.TRIAL_FINISHED, 4)]
    assert shelved() == ["2", "3"]


def test_with_retries_left_a_rerun_that_passes_ends_the_trial(tmp_path: Path, task: Task) -> None:
    orders, events, _ = run_cluster(
        tmp_path, task, 1, [("lost", []), ("lost", []), ("passed", [finished(task, 3)])]
    )
    assert orders == [("n1", 1), ("n2", 1), ("n3", 0)]
    assert node_lost(events) == [(ev.TRIAL_ATTEMPT, 1), (ev.TRIAL_ATTEMPT, 2)]
    assert events.lines[-1]["kind"] == ev.TRIAL_FINISHED and events.lines[-1]["status"] == "passed"


def test_a_trial_left_with_no_slot_stops_the_run_with_how_to_resume(tmp_path: Path, task: Task) -> None:
    with pytest.raises(ForgeError, match="every forge slot of the cluster is gone"):
        run_cluster(tmp_path, task, 5, [("lost", []), ("lost", [])], nodes=2)


def test_a_lost_trials_reason_names_the_last_phase_the_driver_heard_of(tmp_path: Path, task: Task) -> None:
    """A node that dies before any event of its trial came back says so, not "during pending" (its stack
    may well have been up); one whose trial reported a phase names that phase."""
    solving = (ev.TRIAL_STATE, {"task": task.name, "index": 0, "attempt": 1, "phase": "solve"})
    for drained, said in (([], "before its progress came back"), ([solving], "during solve")):
        _, events, _ = run_cluster(
            tmp_path / said, task, 0, [("lost", drained), ("passed", [finished(task, 2)])]
        )
        lost = next(e for e in events.lines if e.get("error_stage") == NODE_LOST)
        (reason,) = lost["reasons"]
        assert f"node n1 (lost) {said}: " in reason and "pending" not in reason, reason


class InterruptingRay(FakeRay):
    """Ctrl-C arrives during the driver's ``after``-th wait."""

    def __init__(self, after: int) -> None:
        self.waits = after

    def wait(self, refs: list[Ref], num_returns: int, timeout: float) -> tuple[list[Ref], list[Ref]]:
        self.waits -= 1
        if self.waits < 0:
            raise KeyboardInterrupt
        return super().wait(refs, num_returns, timeout)


def test_ctrl_c_cancels_a_slot_that_never_started_instead_of_waiting_for_it(
    tmp_path: Path, task: Task
) -> None:
    """A slot still waiting for its unit of the node (another run's slot holds it) answers no call until it
    starts. The driver's drains skip it while the other slot's trial runs and finishes, and Ctrl-C cancels
    it, its trial left for --resume, rather than wait for it to start (the driver hung there)."""
    orders: list[tuple[str, TrialOrder]] = []
    up = FakeSlot("n1", [("passed", [finished(task, 1)])], orders)
    waiting = FakeSlot("n2", [("passed", [])], orders)
    never = SimpleNamespace(remote=lambda *a: pytest.fail("a call to a slot that has not started blocks"))
    waiting.drain = waiting.stop = never
    waiting.run = SimpleNamespace(remote=lambda *a: Ref(ticks=10**9))  # queued until it starts
    cancelled: list[str] = []
    cluster = SimpleNamespace(
        ray=InterruptingRay(after=3), slots=[SlotRef("n1", 0, up), SlotRef("n2", 0, waiting)], driver="drv",
        bundle_ref=None, code="c", alive=lambda node: True, other_code_slots=lambda: [], used={},
        started=lambda slot: slot.node_id == "n1", cancel=lambda slot: cancelled.append(slot.node_id),
    )  # fmt: skip
    events = Events()
    settings = Settings(run_id="r1", run_dir=tmp_path / "run", retries=0)
    executor = ClusterExecutor(cluster, events, settings, lambda line: None)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        executor.run([(task, 0), (task, 1)])
    assert cancelled == ["n2"]
    finished_on = [e["index"] for e in events.lines if e["kind"] == ev.TRIAL_FINISHED]
    assert finished_on == [0] and [e["kind"] for e in events.lines][-1] == ev.RUN_INTERRUPTED


def test_a_warm_runs_slots_hear_when_the_queue_is_empty_and_again_after_a_rerun(
    tmp_path: Path, task: Task
) -> None:
    """So a slot keeps a stack given back as it is for the run's end instead of resetting it ahead
    (``WarmPool.no_more``); a rerun's slot is told again once the queue is empty again."""
    told: list[tuple[str, int]] = []
    scripts: list[Script] = [("lost", []), ("passed", [finished(task, 2)])]
    orders, _, _ = run_cluster(tmp_path / "warm", task, 0, scripts, stacks="warm", told=told)
    assert orders == [("n1", 0), ("n2", 0)]
    # n1 as soon as its order left (the only one); after the rerun was sent, every slot used so far.
    assert told == [("n1", 1), ("n1", 2), ("n2", 2)]
    fresh: list[tuple[str, int]] = []
    run_cluster(tmp_path / "fresh", task, 0, [("passed", [finished(task, 1)])], told=fresh)
    assert fresh == []  # a fresh stack has no reset to skip
