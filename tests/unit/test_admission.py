"""The memory budget and the workload figure without an engine: pure decisions over made-up figures, the
``docker stats`` parsing, and the warm pool's choice between queueing and provisioning ahead."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from forgelib.errors import Interrupted
from forgelib.run import events as ev
from forgelib.run.ready import ready_breakdown
from forgelib.stacks.budget import (
    ASSUMED_STACK,
    MIB,
    Admission,
    Workload,
    admits,
    capacity,
    default_budget,
    parse_meminfo,
    parse_size,
    parse_stats,
    spares_wanted,
    stacks_wanted,
)
from forgelib.stacks.stack import Stack
from forgelib.stacks.warm import environment_key
from forgelib.testing import FakeRunner
from tests.support.warmpool import PoolHarness, decision, task


def test_meminfo_gives_memavailable_in_bytes_and_the_default_budget_keeps_a_fifth_back() -> None:
    text = "MemTotal:       24681240 kB\nMemFree:  1000 kB\nMemAvailable:   2000000 kB\n"
    assert parse_meminfo(text) == 2000000 * 1024
    assert parse_meminfo("MemTotal: 1 kB\n") is None
    assert default_budget(1000 * MIB) == 800 * MIB and default_budget(None) is None


def test_a_stack_is_admitted_while_all_of_them_fit_and_the_first_one_always() -> None:
    per = 200 * MIB
    assert admits(0, per, 100 * MIB)  # below one stack: the run still moves, one stack at a time
    assert not admits(1, per, 100 * MIB)
    assert admits(3, per, 800 * MIB) and not admits(4, per, 800 * MIB)  # 4 x 200 fits, 5 does not
    assert admits(1000, per, None)  # no budget
    assert admits(1, None, 2 * ASSUMED_STACK) and not admits(2, None, 2 * ASSUMED_STACK)  # not measured yet
    assert capacity(per, 1000 * MIB) == 5 and capacity(per, 10 * MIB) == 1 and capacity(per, None) is None


def test_docker_stats_memory_is_read_per_container_and_junk_is_skipped() -> None:
    assert parse_size("12.5MiB") == int(12.5 * MIB) and parse_size("1.5GiB") == int(1.5 * 1024 * MIB)
    assert parse_size("800kB") == 800_000
    with pytest.raises(ValueError):
        parse_size("--")
    out = "p-app-db-1\t40.2MiB / 23.5GiB\np-runner-1\t1.1MiB / 23.5GiB\nbroken line\np-x-1\t-- / --\n"
    assert parse_stats(out) == {"p-app-db-1": int(40.2 * MIB), "p-runner-1": int(1.1 * MIB)}


def test_the_footprint_is_measured_through_the_runner_and_the_largest_stack_counts() -> None:
    runner = FakeRunner()
    runner.expect(
        "docker", "ps", "--quiet", "--filter", "label=com.docker.compose.project=p1", stdout="a\nb\n"
    )
    runner.expect("docker", "stats", "--no-stream", stdout="p1-db-1\t100MiB / 1GiB\np1-api-1\t50MiB / 1GiB\n")
    adm = Admission(1000 * MIB)
    adm.measure("env", runner, "p1", timeout=5)
    deadline = time.monotonic() + 10
    while adm.per_stack is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert adm.per_stack == 150 * MIB
    assert adm.footprints["env"] == {"p1-db-1": 100 * MIB, "p1-api-1": 50 * MIB}
    adm.measure("env", runner, "p1", timeout=5)  # once per environment: no second `docker stats`
    assert sum(1 for c in runner.calls if c.argv[:2] == ("docker", "stats")) == 1
    adm.recorded("other", {"c": 90 * MIB})  # a smaller stack does not lower the figure
    assert adm.per_stack == 150 * MIB and adm.describe()["capacity"] == 6


def _measured(adm: Admission, key: str, runner: FakeRunner, project: str) -> None:
    """``measure``, then what a teardown does first: wait for the measurement (on its own thread)."""
    adm.measure(key, runner, project, timeout=5)
    adm.settle(project)


def test_a_footprint_the_stack_left_before_it_was_taken_is_taken_from_the_next_stack_a_few_times() -> None:
    runner = FakeRunner()
    for project in ("p1", "p2", "p3", "p4"):
        runner.expect("docker", "ps", "--quiet", "--filter", f"label=com.docker.compose.project={project}",
                      stdout="a\n")  # fmt: skip
    gone = "Error response from daemon: No such container: a\n"
    runner.expect("docker", "stats", "--no-stream", rc=1, stderr=gone, times=1)
    runner.expect("docker", "stats", "--no-stream", stdout="", times=1)  # nothing left running in it
    runner.expect("docker", "stats", "--no-stream", stdout="p3-db-1\t120MiB / 1GiB\n")
    adm = Admission(1000 * MIB)
    _measured(adm, "env", runner, "p1")
    assert adm.per_stack is None  # the assumed figure stays, and the next stack is measured
    _measured(adm, "env", runner, "p2")
    assert adm.per_stack is None
    _measured(adm, "env", runner, "p3")
    assert adm.per_stack == 120 * MIB and adm.footprints["env"] == {"p3-db-1": 120 * MIB}
    adm.measure("env", runner, "p4", timeout=5)  # measured: never again
    never = Admission(1000 * MIB)
    failing = FakeRunner()
    failing.expect("docker", "ps", stdout="a\n")
    failing.expect("docker", "stats", rc=1, stderr=gone)
    for n in range(1, 5):
        _measured(never, "env", failing, f"p{n}")
    stats = [c for c in failing.calls if c.argv[:2] == ("docker", "stats")]
    assert len(stats) == 3 and never.per_stack is None  # MEASURE_ATTEMPTS, then the assumed figure for good
    assert sum(1 for c in runner.calls if c.argv[:2] == ("docker", "stats")) == 3


def test_a_stacks_teardown_waits_for_its_footprint_under_way() -> None:
    release = threading.Event()
    runner = FakeRunner()
    runner.expect("docker", "ps", stdout="a\n")
    runner.expect(
        "docker", "stats", stdout="p1-db-1\t80MiB / 1GiB\n", side_effect=lambda call: release.wait(10)
    )
    adm = Admission(1000 * MIB)
    adm.measure("env", runner, "p1", timeout=5)
    settled = threading.Event()
    th = threading.Thread(target=lambda: (adm.settle("p1"), settled.set()))
    th.start()
    assert not settled.wait(0.3)  # `docker stats` has not answered: the teardown waits
    release.set()
    assert settled.wait(10)
    th.join()
    deadline = time.monotonic() + 10
    while adm.per_stack is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert adm.per_stack == 80 * MIB
    adm.settle("p1")  # nothing under way: at once
    adm.settle("never-measured")


def test_enter_queues_for_memory_until_a_stack_leaves_and_a_stop_ends_the_wait() -> None:
    adm = Admission(300 * MIB)
    adm.recorded("env", {"c": 200 * MIB})
    assert adm.enter() >= 0 and adm.held == 1
    admitted = threading.Event()

    def second() -> None:
        adm.enter()
        admitted.set()

    th = threading.Thread(target=second)
    th.start()
    assert not admitted.wait(0.3)  # 2 x 200 MiB > 300 MiB: it waits
    adm.leave()  # the first stack's teardown is over
    assert admitted.wait(5) and adm.held == 1
    th.join()
    stopping = Admission(300 * MIB, stopping=lambda: True)
    stopping.recorded("env", {"c": 200 * MIB})
    stopping.enter()
    with pytest.raises(Interrupted):
        stopping.enter()


@pytest.mark.parametrize(
    ("cpu", "hold", "provision", "demand", "wanted"),
    [
        (None, 30.0, 5.0, 10, None),  # nothing measured yet: the older rule decides
        (0.02, 30.0, None, 10, None),  # no provision timed yet
        (0.3, 30.0, 5.0, 10, None),  # CPU-bound (an oracle-only run measures ~0.16): the cores are the limit
        (0.02, 30.0, 5.0, 100, 64),  # waiting on a model: one stack per worker
        (0.08, 30.0, 5.0, 100, 25),  # waiting, but 2 cores keep only 25 such trials busy
        (0.02, 1.0, 5.0, None, None),  # no plan (pytest) and trials shorter than a provision: ski rental
        (0.02, 6.0, 5.0, None, 64),  # no plan, held longer than a provision takes
        (0.02, 1.0, 5.0, 0, None),  # every trial has a stack or one on its way
    ],
)
def test_stacks_wanted_follows_the_measured_workload(
    cpu: float | None, hold: float, provision: float | None, demand: int | None, wanted: int | None
) -> None:
    kw: dict[str, Any] = {"cpu_per_held": cpu, "hold": hold, "provision": provision, "demand": demand}
    assert stacks_wanted(workers=64, cores=2, **kw) == wanted


def test_with_a_plan_only_trials_still_waiting_for_a_stack_ask_for_more() -> None:
    kw: dict[str, Any] = {"workers": 8, "cores": 2, "cpu_per_held": 0.02, "hold": 30.0, "provision": 5.0}
    assert stacks_wanted(**kw, demand=3) == 8 and stacks_wanted(**kw, demand=0) is None


def test_workload_is_cpu_per_held_second_counting_stacks_still_held() -> None:
    now, cpu = [100.0], [10.0]
    w = Workload(cpu=lambda: cpu[0], clock=lambda: now[0], cores=2)
    assert w.cpu_per_held([]) is None  # nothing handed yet
    w.handed()
    cpu[0] = 10.5
    assert w.cpu_per_held([0.5]) is None  # under a second held: not yet a figure
    w.released(20.0)
    cpu[0] = 11.0
    assert w.cpu_per_held([30.0]) == pytest.approx(1.0 / 50.0)


def test_time_to_ready_splits_into_what_it_waited_on() -> None:
    warm = {
        "stack_wait": 3.0,
        "memory_wait": 1.0,
        "reset:app-db": 0.1,
        "fingerprint:app-db": 0.05,
        "recreate": 0.2,
    }
    r = ready_breakdown(warm, 3.5)
    assert r == {
        "seconds": 3.5, "queue": 2.0, "memory": 1.0, "provisioning": 0.15, "reset": 0.35, "reused": False,
    }  # fmt: skip
    fresh = ready_breakdown({"memory_wait": 2.0, "up_seeded": 3.0}, 6.0)
    assert fresh == {
        "seconds": 6.0, "queue": 0.0, "memory": 2.0, "provisioning": 4.0, "reset": 0.0, "reused": False,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("handed", "reset", "left", "room", "spares"),
    [
        ([0.0, 10.0, 20.0], 2.0, 9, None, 1),  # hand-outs far apart: one spare serves each release
        ([0.0, 0.5, 1.0, 10.0], 2.0, 9, None, 3),  # three within one reset: three spares
        ([0.0, 0.5, 1.0, 1.5], 2.0, 2, None, 2),  # only two trials still to come
        ([0.0, 0.5, 1.0, 1.5], 2.0, 9, 1, 1),  # the memory budget has room for one more
        ([0.0, 0.5], 2.0, 0, None, 0),  # nothing left to hand out
        ([], 2.0, 9, None, 0),  # nothing in use: nothing to give back together
    ],
)
def test_spares_cover_the_releases_that_come_within_one_reset(
    handed: list[float], reset: float, left: int, room: int | None, spares: int
) -> None:
    assert spares_wanted(handed=handed, reset=reset, left=left, room=room) == spares


def test_a_trial_waiting_for_a_reset_under_way_counts_it_as_reset_not_queue() -> None:
    r = ready_breakdown({"stack_wait": 1.5, "reset_wait": 1.2}, 1.55, reused=True)
    assert r == {
        "seconds": 1.55,
        "queue": 0.3,
        "memory": 0.0,
        "provisioning": 0.05,
        "reset": 1.2,
        "reused": True,
    }
    handed = ready_breakdown({"stack_wait": 0.0}, 0.02, reused=True)  # reset ahead: ready at once
    assert handed["reset"] == 0.0 and handed["seconds"] == 0.02 and handed["reused"]
    assert ready_breakdown({"up_seeded": 3.0}, 3.0)["reused"] is False


def test_reused_trials_are_told_apart_by_their_mark_and_in_older_logs_by_their_reset() -> None:
    from forgelib.run.events import TrialRecord, ready_summary

    def rec(ready: dict[str, float]) -> TrialRecord:
        return TrialRecord("t", 0, ready=ready)

    recs = [
        rec({"seconds": 0.02, "provisioning": 0.02, "reset": 0.0, "reused": 1.0}),  # reset ahead
        rec({"seconds": 5.0, "provisioning": 5.0, "reset": 0.0}),  # a new stack
        rec({"seconds": 1.2, "provisioning": 0.1, "reset": 1.1}),  # an older log's reused trial
        # a spare's first trial, handed it while waiting for a reset: marked not reused, whatever it waited on
        rec({"seconds": 1.2, "provisioning": 0.1, "reset": 1.1, "reused": 0.0}),
    ]
    out = ready_summary(recs)
    assert out["reused"]["count"] == 2 and out["reused"]["min"] == 0.02


def test_pool_decisions_fold_into_the_summary() -> None:
    start = {"kind": ev.RUN_STARTED, "run_id": "r", "plan": [{"task": "t", "index": i} for i in range(3)]}
    acq = [
        {"decision": "first", "memory_wait": 0.0, "held": 1, "budget_mb": 800, "per_stack_mb": None,
         "ready": {"seconds": 5.0, "queue": 0.0}},
        {"decision": "ahead", "memory_wait": 2.5, "held": 2, "budget_mb": 800, "per_stack_mb": 150.0,
         "ready": {"seconds": 6.0, "queue": 0.0}},
        {"decision": "reuse", "memory_wait": 0.0, "held": 2, "evicted": "x", "budget_mb": 800,
         "per_stack_mb": 150.0, "ready": {"seconds": 1.0, "queue": 0.8}},
        {"decision": "reuse", "memory_wait": 0.0, "held": 2, "budget_mb": 800, "per_stack_mb": 150.0,
         "reset_ahead": 1.3, "reset_wait": 0.6, "ready": {"seconds": 0.62, "queue": 0.0, "reset": 0.6}},
        {"decision": "spare", "memory_wait": 0.0, "held": 3, "budget_mb": 800, "per_stack_mb": 150.0,
         "ready": {"seconds": 0.01, "queue": 0.0}},
    ]  # fmt: skip
    events: list[dict[str, Any]] = [
        start,
        *({"kind": ev.STACK_ACQUIRED, "task": "t", "index": i, **a} for i, a in enumerate(acq)),
    ]
    pool = ev.summarize(ev.fold(events))["pool"]
    assert pool["decisions"] == {"ahead": 1, "first": 1, "reuse": 2, "spare": 1}
    assert pool["evictions"] == 1 and pool["queued"] == 1 and pool["memory_waits"] == 1
    assert pool["memory_wait_seconds"] == 2.5 and pool["peak_stacks"] == 3
    assert pool["resets_ahead"] == 1 and pool["reset_waits"] == 1 and pool["reset_wait_seconds"] == 0.6
    assert pool["budget_mb"] == 800 and pool["per_stack_mb"] == 150.0


def _waiting_pool(monkeypatch: pytest.MonkeyPatch, cpu: list[float], **kw: Any) -> PoolHarness:
    """A pool (8 workers, 2 cores, stacks up in 5 s) whose one stack a trial held for 30 s, gave back just
    now (the older rule would wait for the next release) and holds again: ``cpu[0]`` seconds of CPU since."""
    w = Workload(cpu=lambda: cpu[0], cores=2)
    h = PoolHarness(monkeypatch, provision=5.0, workers=8, workload=w, **kw)
    h.hold(h.acquire(), 30.0)
    h.acquire()
    return h


def test_a_waiting_workload_provisions_ahead_while_its_stacks_are_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu = [0.0]
    h = _waiting_pool(monkeypatch, cpu, admission=Admission(None))
    cpu[0] = 0.3  # 0.01 core per held second
    h.hold_provisions()
    first, got = h.acquire_in_background()
    second, got2 = h.acquire_in_background()  # a second one at once, while the first is still coming up
    assert h.waits()  # two provisions already: as many as the cores, the third waits
    h.let_provisions()
    for thread in (first, second):
        thread.join(60)
        assert not thread.is_alive(), "an acquire did not end once its provision was let go"
    assert [decision(t) for t in got + got2] == ["ahead", "ahead"] and len(h.provisioned) == 3


def test_a_cpu_bound_workload_keeps_queueing_and_the_memory_budget_holds_growth_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu = [0.0]
    budget = Admission(300 * MIB)
    h = _waiting_pool(monkeypatch, cpu, admission=budget)
    cpu[0] = 27.0  # 0.9 core per held second: CPU-bound
    assert h.waits()
    cpu[0] = 0.3  # waiting after all, but the budget holds one stack only
    budget.recorded(environment_key(task().environment), {"c": 200 * MIB})  # the stack's measured footprint
    assert h.waits()
    assert len(h.provisioned) == 1


def test_out_of_network_pools_caps_the_stacks_at_what_the_run_holds() -> None:
    a = Admission(None)
    assert not a.limited(0)  # nothing of ours to wait for: the error stands
    assert a.limited(5) and a.fits(4) and not a.fits(5)
    assert a.limited(7) and not a.fits(5)  # never loosened by a later, larger figure
    assert a.figures()["network_limit"] == 5


def test_a_fresh_trial_out_of_network_pools_waits_for_a_stack_of_the_run_and_provisions_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from forgelib.errors import ProvisionError
    from forgelib.spec.models import Timeouts
    from forgelib.stacks import backends
    from forgelib.stacks.provision import FAILURE_FILE, NO_ADDRESS_POOL, StackContext

    admission = Admission(None)
    ctx = StackContext(SimpleNamespace(name="p"), Timeouts(), FakeRunner())  # type: ignore[arg-type]
    backend = backends.DockerBackend(ctx, admission=admission)
    admission.measure = lambda *a, **k: None  # type: ignore[method-assign]
    admission.enter()  # another trial of the run holds a stack
    calls: list[int] = []

    def provision(*args: Any, **kw: Any) -> Stack:
        calls.append(admission.held)
        if len(calls) == 1:
            (tmp_path / FAILURE_FILE).write_text("no pool")
            raise ProvisionError("compose_up", f"{NO_ADDRESS_POOL} (docker said: ...)")
        return Stack("p", None, None, {}, {}, tmp_path)  # type: ignore[arg-type]

    monkeypatch.setattr(backends, "provision_trial", provision)
    threading.Timer(0.3, admission.leave).start()  # the other stack comes down
    handle = backend.provision(task(), run_id="r", trial_index=0, trial_dir=tmp_path)
    assert calls == [2, 1]  # tried beside the other stack, then again once it was down
    assert admission.limit == 1 and handle.source["pool"]["network_limit"] == 1
    assert handle.timings["memory_wait"] > 0 and not (tmp_path / FAILURE_FILE).exists()


def test_at_most_starts_stacks_come_up_at_once_and_a_stop_ends_the_wait() -> None:
    adm = Admission(None, starts=2)
    inside: list[int] = []
    most = 0
    gate = threading.Event()
    lock = threading.Lock()

    def start() -> None:
        nonlocal most
        with adm.starting():
            with lock:
                inside.append(1)
                most = max(most, len(inside))
            gate.wait(60)
            with lock:
                inside.pop()

    threads = [threading.Thread(target=start) for _ in range(5)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 60
    while len(inside) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # the other three would have got in by now, were the bound not kept
    assert most == 2
    gate.set()
    for th in threads:
        th.join(60)
    assert most == 2 and not inside
    with adm.starting() as waited:  # every place given back: no wait
        assert waited < 0.5
    stopping = Admission(None, starts=1, stopping=lambda: True)
    with stopping.starting(), pytest.raises(Interrupted), stopping.starting():
        pass
    with Admission(None).starting() as waited:  # no bound
        assert waited >= 0


def test_a_fresh_trial_queued_for_a_start_place_is_on_record_as_queueing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from forgelib.spec.models import Timeouts
    from forgelib.stacks import backends
    from forgelib.stacks.provision import StackContext

    admission = Admission(None, starts=1)
    ctx = StackContext(SimpleNamespace(name="p"), Timeouts(), FakeRunner())  # type: ignore[arg-type]
    backend = backends.DockerBackend(ctx, admission=admission)
    admission.measure = lambda *a, **k: None  # type: ignore[method-assign]
    monkeypatch.setattr(
        backends,
        "provision_trial",
        lambda *a, **k: Stack("p", None, None, {"up": 0.5}, {}, tmp_path),  # type: ignore[arg-type]
    )
    held = admission.starting()
    held.__enter__()  # another trial's stack is coming up
    threading.Timer(0.3, held.__exit__, (None, None, None)).start()
    handle = backend.provision(task(), run_id="r", trial_index=0, trial_dir=tmp_path)
    waited = handle.timings["start_wait"]
    assert waited >= 0.2 and handle.timings["stack_wait"] == waited and handle.timings["memory_wait"] == 0
    assert handle.source["pool"]["start_wait"] == waited
    ready = ready_breakdown(handle.timings, waited + 0.5)
    assert ready["queue"] == waited and ready["memory"] == 0 and ready["provisioning"] == 0.5
    summary = ev.pool_summary([{**handle.source["pool"], "ready": ready}])
    assert summary["start_waits"] == 1 and summary["start_wait_seconds"] == waited and summary["queued"] == 1


def test_a_place_or_a_budget_free_at_once_is_no_wait(tmp_path: Path) -> None:
    """Taking a free start place (in-process and on the engine) or a budget that fits records 0.0, however
    slow the clock or the lock files: time spent on bookkeeping is not a wait (a trial's `start_wait` and
    `memory_wait` are counted as waits when they are above zero)."""
    from forgelib.stacks.slots import MemoryLedger, StartSlots

    ticks = iter(range(1, 1000))
    adm = Admission(
        10_000 * MIB,
        starts=2,
        slots=StartSlots(tmp_path, 2),
        ledger=MemoryLedger(tmp_path),
        clock=lambda: float(next(ticks)),  # every reading a second later than the one before
    )
    with adm.starting() as waited:
        assert waited == 0.0
    assert adm.enter() == 0.0 and adm.enter() == 0.0


def test_the_ledger_follows_the_warm_pools_stacks_as_they_come_and_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the pool holds is on the engine's ledger while a stack comes up and is held, and off it once
    the stack is torn down after its release (the run's last trial), not only at the pool's next ask: the
    other processes on the engine read this process's line as it is now."""
    from forgelib.stacks.slots import MemoryLedger

    ours, other = MemoryLedger(tmp_path), MemoryLedger(tmp_path)  # `other`: another process's view
    try:
        h = PoolHarness(monkeypatch, trials=1, admission=Admission(None, ledger=ours))
        h.hold_provisions()
        thread, got = h.acquire_in_background()
        assert other.others() == ASSUMED_STACK  # coming up: it counts from the moment it is asked for
        h.let_provisions()
        thread.join(60)
        assert not thread.is_alive() and got
        assert other.others() == ASSUMED_STACK  # held by the trial
        h.hold(got[0], 10.0)  # the run's last trial gives it back: the pool tears it down
        h.settle()
        assert h.downs() == [got[0].name]
        assert other.others() == 0
    finally:
        ours.close()
        other.close()
