"""Warm stacks without an engine: which services are recreated, in what order, which volumes go with them,
how `--stacks` is read, and which stack the pool hands a trial (through its public surface, on a fake clock).
(The resets and fingerprints on real stacks: tests/integration/test_warm_*.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from forgelib.errors import UsageError
from forgelib.provision import ProvisionedTrial
from forgelib.run.cli import main_run
from forgelib.seeds.base import fingerprint_diff, fingerprint_part
from forgelib.spec.models import EnvironmentManifest, Isolation, ResetBinding, Service
from forgelib.warm import _ephemeral_plan, environment_key
from tests.support.warmpool import PoolHarness, decision, task


def _trial(
    services: dict[str, Any], labels: dict[str, Isolation], volumes: dict[str, Any]
) -> ProvisionedTrial:
    env = EnvironmentManifest(
        (Path("/x/compose.yaml"),),
        {n: Service(n, labels.get(n, Isolation.EPHEMERAL)) for n in services},
    )
    config = {"services": services, "volumes": volumes}
    return ProvisionedTrial("p1", env, None, {}, {}, Path("/t"), config=config)  # type: ignore[arg-type]


def test_ephemeral_services_recreate_in_depends_on_waves_and_take_their_own_volumes_along() -> None:
    vol = {"type": "volume"}
    services = {
        "db": {"volumes": [{**vol, "source": "data", "target": "/d"}]},
        "api": {"depends_on": {"db": {}}, "volumes": [{**vol, "source": "shared", "target": "/s"}]},
        "worker": {
            "depends_on": {"api": {}, "db": {}},
            "volumes": [{**vol, "source": "scratch", "target": "/x"}],
        },
        "runner": {"volumes": [{**vol, "source": "shared", "target": "/s"}], "image": "img"},
    }
    trial = _trial(
        services,
        {"db": Isolation.RESET, "api": Isolation.EPHEMERAL},
        {"data": {}, "shared": {}, "scratch": {}},
    )
    waves, renew, fallback = _ephemeral_plan(trial, {"img": ("/var/lib/img",)})
    assert fallback is None  # one container per service: spares
    # db is reset (not recreated); worker waits for api; runner has no ephemeral dependency.
    assert waves == [["api", "runner"], ["worker"]]
    # scratch and shared are mounted by ephemeral services only; data also by the reset db; the image's
    # declared VOLUME gets the override's named volume, renewed with its container.
    assert renew == ["p1_forge-image-vol-runner-0", "p1_scratch", "p1_shared"]


def test_shared_services_are_never_recreated() -> None:
    trial = _trial({"api": {}, "runner": {}}, {"api": Isolation.SHARED}, {})
    assert _ephemeral_plan(trial, {}) == ([["runner"]], [], None)


def test_an_ephemeral_service_of_several_replicas_is_recreated_by_compose_and_says_so() -> None:
    """Spares stand for one container per service: a replicated ephemeral service takes the recreate path,
    decided once per stack (with the reason the run records once), never tried and failed per trial."""
    trial = _trial({"web": {"deploy": {"replicas": 2}}, "runner": {}, "db": {"deploy": {"replicas": 3}}},
                   {"db": Isolation.SHARED}, {})  # fmt: skip
    waves, _, fallback = _ephemeral_plan(trial, {})
    assert waves == [["web", "runner"]]
    assert fallback is not None and "web (2 replicas)" in fallback and "db" not in fallback
    assert _ephemeral_plan(_trial({"w": {"scale": 2}}, {}, {}), {})[2] is not None  # the legacy key
    assert _ephemeral_plan(_trial({"w": {"deploy": {"replicas": 1}}}, {}, {}), {})[2] is None


def test_environment_key_separates_environments_that_differ_in_labels_or_bindings() -> None:
    f = (Path("/x/c.yaml"),)
    a = EnvironmentManifest(f, {"db": Service("db", Isolation.RESET, ResetBinding("s"))})
    b = EnvironmentManifest(f, {"db": Service("db", Isolation.EPHEMERAL)})
    c = EnvironmentManifest(f, {"db": Service("db", Isolation.RESET, ResetBinding("s", {"user": "u"}))})
    assert environment_key(a) == environment_key(EnvironmentManifest(f, dict(a.services)))
    assert len({environment_key(e) for e in (a, b, c)}) == 3


def test_fingerprint_diff_names_the_parts_that_differ() -> None:
    base = {"roles": fingerprint_part([("app",)]), "databases": fingerprint_part([("app", True)])}
    assert fingerprint_diff(base, dict(base)) == []
    now = {**base, "roles": fingerprint_part([("app",), ("intruder",)]), "extra": "x"}
    assert fingerprint_diff(base, now) == ["extra", "roles"]


def test_unknown_stack_mode_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--stacks must be one of fresh, warm"):
        main_run("whatever.yaml", stacks="tepid")


def test_the_summary_says_the_stack_mode_and_counts_replaced_stacks() -> None:
    from forgelib.run import events as ev

    events = [
        {"kind": ev.RUN_STARTED, "run_id": "r", "plan": [{"task": "t", "index": 0}]}
        | {"settings": {"stacks": "warm"}},
        {"kind": ev.STACK_REPLACED, "task": "t", "index": 0, "stack": "s", "reason": "roles differ"},
    ]
    summary = ev.summarize(ev.fold(events))
    assert summary["stacks"] == {"mode": "warm", "replaced": 1}
    assert summary["skipped_events"]["unknown_kinds"] == {}  # a known kind, not skipped
    fresh = ev.summarize(ev.fold([{**events[0], "settings": {}}]))  # a run from before --stacks existed
    assert fresh["stacks"] == {"mode": "fresh", "replaced": 0}


# The pool through acquire / release / names on a fake clock (tests/support/warmpool.py).


def _harness(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> PoolHarness:
    return PoolHarness(monkeypatch, **kw)


def test_an_idle_stack_of_the_environment_is_reused_before_anything_is_provisioned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _harness(monkeypatch)
    first = h.acquire()
    assert decision(first) == "first" and h.provisioned == [first.name]
    h.hold(first, 1.0)
    again = h.acquire()
    assert again.name == first.name and decision(again) == "reuse" and again.stack["reuse"] == 1
    assert h.provisioned == [first.name]  # nothing new came up
    other = h.acquire(task("cache"))  # another environment: its own stack, the idle one stays
    assert decision(other) == "first" and other.name != first.name
    assert h.pool.names() == sorted([first.name, other.name]) and h.downs() == []


def test_a_busy_environment_waits_for_a_release_until_a_provision_would_have_been_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _harness(monkeypatch, provision=3600.0)  # provisioning takes an hour: better wait for the release
    busy = h.acquire()
    assert h.waits()  # it waited, it did not provision
    h.clock.now += 7200  # nothing came free for longer than a provision takes
    assert not h.waits()
    (grown,) = h.handed
    assert decision(grown) == "grow" and grown.name != busy.name and len(h.provisioned) == 2


def test_at_capacity_an_idle_stack_of_another_environment_makes_room(monkeypatch: pytest.MonkeyPatch) -> None:
    h = _harness(monkeypatch, workers=1)
    other = h.acquire(task("cache"))
    h.hold(other, 1.0)
    mine = h.acquire()
    assert mine.stack["pool"]["evicted"] == other.name and h.downs() == [other.name]
    assert h.pool.names() == [mine.name]


@pytest.mark.parametrize(
    ("held", "provision", "left", "stacks", "grow"),
    [
        (1.0, 7.0, 7, 1, False),  # short trials: the one stack finishes all 7 before a new one is up
        (2.5, 10.0, 7, 1, True),  # 17.5 s on one stack vs 10 + (7 - 4) * 2.5 / 2 = 13.75 s with two
        (2.5, 10.0, 5, 2, False),  # two stacks finish 5 in 6.25 s, sooner than a third comes up
        (30.0, 7.0, 3, 1, True),  # long trials: grow at once
    ],
)
def test_a_run_grows_the_pool_only_when_its_remaining_trials_finish_sooner(
    monkeypatch: pytest.MonkeyPatch, held: float, provision: float, left: int, stacks: int, grow: bool
) -> None:
    cycles = 4  # trials that hold a stack `held` seconds: the median of what trials held
    handed = stacks + cycles + stacks  # the stacks' first trials, the cycles, the trials holding them now
    h = _harness(monkeypatch, provision=provision, trials=handed + left)
    first = [h.acquire()]
    if stacks == 2:  # no trial released yet: a second stack once a provision's time went by (ski rental)
        h.clock.now += provision
        assert not h.waits()
        first += h.handed
    for trial in first:
        h.hold(trial, held)
    for _ in range(cycles):
        h.hold(h.acquire(), held)
    now = [h.acquire() for _ in range(stacks)]  # every stack busy
    assert len({t.name for t in now}) == stacks == len(h.provisioned)
    assert h.waits() is not grow
    if grow:
        assert decision(h.handed[-1]) == "grow" and len(h.provisioned) == stacks + 1


def test_without_a_plan_or_a_released_trial_the_pool_grows_by_ski_rental(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _harness(monkeypatch, provision=7.0)  # how many trials are left is unknown (pytest)
    h.hold(h.acquire(), 30.0)  # long trials
    h.acquire()  # the stack is busy again
    h.clock.now += 1.0
    assert h.waits()  # freed a second ago: a release may come sooner than a new stack
    h.clock.now += 6.0
    assert not h.waits()  # waited as long as a provision takes: grow
    planned = _harness(monkeypatch, provision=7.0, trials=8)  # a plan, but no trial released yet
    planned.acquire()
    planned.clock.now += 1.0
    assert planned.waits()


def test_only_a_never_started_container_of_the_stack_and_service_counts_as_fresh() -> None:
    from forgelib.warm import _never_started

    labels = {"com.docker.compose.project": "p1", "com.docker.compose.service": "runner"}
    fresh = {
        "State": {"Status": "created", "StartedAt": "0001-01-01T00:00:00Z"},
        "Config": {"Labels": labels},
    }
    assert _never_started(fresh, "p1", "runner")
    ran = {**fresh, "State": {"Status": "created", "StartedAt": "2026-12-01T03:00:00.1Z"}}  # started once
    assert not _never_started(ran, "p1", "runner")
    assert not _never_started(
        {**fresh, "State": {"Status": "exited", "StartedAt": "0001-01-01"}}, "p1", "runner"
    )
    assert not _never_started(fresh, "p2", "runner") and not _never_started(fresh, "p1", "api")
    assert not _never_started({}, "p1", "runner")


def test_a_warm_trial_execs_into_the_container_its_ephemeral_service_runs_in_now() -> None:
    from forgelib.compose import ComposeProject
    from forgelib.testing import FakeRunner

    base = ComposeProject("p1", (), FakeRunner())
    assert base.container("runner") == "p1-runner-1"  # compose's first container
    moved = dataclasses.replace(base, containers={"runner": "p1-runner-7"})
    assert moved.container("runner") == "p1-runner-7" and moved.container("db") == "p1-db-1"


def test_only_a_container_with_networks_of_its_own_is_taken_off_them() -> None:
    from forgelib.warm import _networks

    nets = {"NetworkSettings": {"Networks": {"p1_default": {}, "p1_back": {}}}}
    assert _networks({**nets, "HostConfig": {"NetworkMode": "p1_default"}}) == ["p1_back", "p1_default"]
    for mode in ("host", "none", "container:abc", "service:db"):
        assert _networks({**nets, "HostConfig": {"NetworkMode": mode}}) == []


# ------------------------------------------------------------------ resets ahead (off the trial's path)
def _pool(workers: int = 4) -> Any:
    from types import SimpleNamespace

    from forgelib.provision import StackContext
    from forgelib.spec.models import Timeouts
    from forgelib.testing import FakeRunner
    from forgelib.warm import WarmPool

    return WarmPool(StackContext(SimpleNamespace(name="p"), Timeouts(), FakeRunner()), workers=workers)  # type: ignore[arg-type]


def _stack(name: str, key: str) -> Any:
    from forgelib.warm import _Stack

    trial = ProvisionedTrial(name, None, None, {}, {}, Path("/t"))  # type: ignore[arg-type]
    return _Stack(trial, key, [], [])


@dataclasses.dataclass
class _Compose:
    """A compose project whose ``down`` is recorded (the pool's teardown of a stack)."""

    log: list[str]
    name: str
    containers: dict[str, str] = dataclasses.field(default_factory=dict)

    def down(self, stop_timeout: float | None = None) -> None:
        self.log.append(f"down {self.name}")


def _live_stack(pool: Any, name: str, key: str, log: list[str]) -> Any:
    """A stack of ``key`` a trial holds now (handed through the pool's own ``_handle``)."""
    from forgelib.warm import _Stack

    trial = ProvisionedTrial(name, None, _Compose(log, name), {}, {}, Path("/t"))  # type: ignore[arg-type]
    s = _Stack(trial, key, [], [])
    pool._all[name] = s
    return pool._handle(s, Path("/t"), {}, None, {"decision": "first"})


def _recycling(pool: Any, log: list[str], fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    from forgelib.warm import DirtyStack

    def recycle(stack: Any, on_phase: Any) -> dict[str, float]:
        log.append(f"reset {stack.name}")
        if stack.name in fail:
            raise DirtyStack("roles differ from the first seeding")
        return {"reset:app-db": 0.5}

    pool._recycle = recycle


def _settled(pool: Any) -> None:
    for s in list(pool._all.values()) + list(pool._resetting.values()):
        if s.job is not None:
            s.job.join()


def test_a_stack_given_back_is_reset_in_the_background_and_handed_out_clean() -> None:
    log: list[str] = []
    pool = _pool()
    pool.trials = 4
    _recycling(pool, log)
    trial = _live_stack(pool, "a", "k", log)
    assert pool.release(trial) < 5.0  # returns at once: the reset is not the trial's
    _settled(pool)
    assert log == ["reset a"] and [s.name for s in pool._idle] == ["a"]
    note: dict[str, Any] = {}
    stack, evict = pool._take("k", note)
    assert stack.name == "a" and evict is None and note == {"decision": "reuse"}  # clean: no waiting
    assert stack.reset["reset:app-db"] == 0.5 and stack.reset["ended_at"] > 0


def test_a_stack_whose_reset_fails_is_torn_down_never_handed_out_and_the_next_trial_says_why() -> None:
    log: list[str] = []
    pool = _pool()
    pool.trials = 4
    _recycling(pool, log, fail={"a"})
    pool.release(_live_stack(pool, "a", "k", log))
    _settled(pool)
    assert log == ["reset a", "down a"] and pool._idle == [] and "a" not in pool._all
    assert pool._replaced == {"k": ["a: roles differ from the first seeding"]}
    assert pool._take("k") == (None, None) and pool._provisioning == {"k": 1}  # a new one, not "a"


def test_a_trial_asking_while_the_stack_is_still_being_reset_waits_for_that_reset() -> None:
    import threading as _threading

    log: list[str] = []
    pool = _pool()
    pool.trials = 4
    pool._provision_s["k"] = [0.001]  # provisioning looks instant: yet the trial waits for the reset
    gate = _threading.Event()
    _recycling(pool, log)
    plain = pool._recycle
    pool._recycle = lambda stack, on_phase: (gate.wait(5), plain(stack, on_phase))[1]
    pool.release(_live_stack(pool, "a", "k", log))
    note: dict[str, Any] = {}
    got: list[Any] = []
    asking = _threading.Thread(target=lambda: got.append(pool._take("k", note)))
    asking.start()
    while not pool._claims.get("k"):  # it counts on the reset under way
        _threading.Event().wait(0.01)
    gate.set()
    asking.join(5)
    ((stack, _),) = got
    assert stack.name == "a" and note["decision"] == "reuse" and note["reset_wait"] > 0
    assert pool._provisioning == {} and pool._claims == {"k": 0}


def test_once_every_trial_has_a_stack_one_given_back_is_torn_down_not_reset() -> None:
    log: list[str] = []
    pool = _pool()
    pool.trials = 1
    _recycling(pool, log)
    trial = _live_stack(pool, "a", "k", log)  # the run's only trial
    pool.release(trial)
    _settled(pool)
    assert log == ["down a"] and pool._all == {}


def test_close_waits_for_resets_under_way_and_tears_every_stack_down() -> None:
    log: list[str] = []
    pool = _pool()
    pool.trials = 8
    _recycling(pool, log)
    for n in "abc":
        pool.release(_live_stack(pool, n, "k", log))
    pool.close()
    assert sorted(x for x in log if x.startswith("down")) == ["down a", "down b", "down c"]
    for n in "abc":  # each one's reset ended before its teardown
        assert log.index(f"reset {n}") < log.index(f"down {n}")
    assert pool._all == {} and pool._idle == []


def test_spares_are_counted_with_the_reset_time_or_until_one_is_timed_the_warm_preparation() -> None:
    import time as _time

    pool = _pool(workers=2)
    pool.trials, pool._handed, pool._last_cpu = 8, 2, 0.02
    pool._spare_for["k"] = (None, "r", Path("/run/stacks"))
    now = _time.monotonic()
    for n, t in (("a", now - 10.0), ("b", now - 4.0)):  # handed 6 s apart
        pool._all[n] = _stack(n, "k")
        pool._busy[n] = t
    assert pool._spares_wanted("k") == 1  # the assumed 2 s reset: they come back one at a time
    pool._prepare_s["k"] = [8.0]  # the warm preparation took 8 s on this machine: both within one reset
    assert pool._spares_wanted("k") == 2
    pool._resets_s["k"] = [1.0]  # a timed reset wins
    assert pool._spares_wanted("k") == 1
    pool._last_cpu = 0.5  # a CPU-bound workload keeps no spares
    assert pool._spares_wanted("k") == 0
