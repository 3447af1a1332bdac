"""Warm stacks without an engine: which services are recreated, in what order, which volumes go with them,
how `--stacks` is read, and which stack the pool hands a trial (through its public surface, on a fake clock).
(The resets and fingerprints on real stacks: tests/integration/test_warm_*.py.)"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from forgelib.cli.run import RunOptions, main_run
from forgelib.errors import UsageError
from forgelib.kinds.base import PreparedSeed, fingerprint_diff, fingerprint_part, reset_after
from forgelib.spec.models import EnvironmentManifest, Isolation, ResetBinding, Service
from forgelib.stacks.provision import GoldenWarmSteps, WarmSteps
from forgelib.stacks.stack import Stack
from forgelib.stacks.warm import _ephemeral_plan, environment_key
from forgelib.stacks.warm import pool as pool_mod
from forgelib.stacks.warm.ephemeral import independent, renewal
from tests.support.warmpool import PoolHarness, decision, task


def _trial(services: dict[str, Any], labels: dict[str, Isolation], volumes: dict[str, Any]) -> Stack:
    env = EnvironmentManifest(
        (Path("/x/compose.yaml"),),
        {n: Service(n, labels.get(n, Isolation.EPHEMERAL)) for n in services},
    )
    config = {"services": services, "volumes": volumes}
    return Stack("p1", env, None, {}, {}, Path("/t"), config=config)  # type: ignore[arg-type]


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
    own = dataclasses.replace(trial, own_volumes=("runner",))  # compose labels anonymous volumes
    waves, renew, fallback = _ephemeral_plan(own, {"img": ("/var/lib/img",)})
    assert fallback is None  # one container per service: spares
    # db is reset (not recreated); worker waits for api; runner has no ephemeral dependency.
    assert waves == [["api", "runner"], ["worker"]]
    # scratch and shared are mounted by ephemeral services only; data also by the reset db; the image's
    # declared VOLUME is an anonymous volume of each container's own, removed with it, never renewed by name.
    assert renew == ["p1_scratch", "p1_shared"]
    # A compose that cannot label such a volume (``ComposeFacts.volume_labels``): the override's named
    # volume instead, renewed with its container.
    _, renew, _ = _ephemeral_plan(trial, {"img": ("/var/lib/img",)})
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
    legacy = _trial({"w": {"scale": 2}}, {}, {})  # the legacy key
    assert _ephemeral_plan(legacy, {})[2] is not None
    one = _trial({"w": {"deploy": {"replicas": 1}}}, {}, {})
    assert _ephemeral_plan(one, {})[2] is None


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
        main_run(RunOptions("whatever.yaml", stacks="tepid"))


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
    assert again.name == first.name and decision(again) == "reuse" and again.source["reuse"] == 1
    assert h.provisioned == [first.name]  # nothing new came up
    other = h.acquire(task("cache"))  # another environment: its own stack, the idle one stays
    assert decision(other) == "first" and other.name != first.name
    assert h.pool.names() == sorted([first.name, other.name]) and h.downs() == []


def test_stacks_from_a_checkpoint_come_up_with_its_steps_and_are_kept_apart_from_the_seeds_stacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _harness(monkeypatch)
    steps = object()
    start = pool_mod.StartFrom("ck-1", lambda: steps)
    forked = h.acquire(start=start)
    assert h.steps[forked.name] is steps
    h.hold(forked, 1.0)
    seeded = h.acquire()  # the same environment from its seeds: never the checkpoint's stack
    assert seeded.name != forked.name and isinstance(h.steps[seeded.name], WarmSteps)
    h.hold(seeded, 1.0)
    other = h.acquire(start=pool_mod.StartFrom("ck-2", lambda: steps))
    assert other.name not in (forked.name, seeded.name)
    h.hold(other, 1.0)
    again = h.acquire(start=start)
    assert again.name == forked.name and decision(again) == "reuse"


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
    assert mine.source["pool"]["evicted"] == other.name and h.downs() == [other.name]
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
    from forgelib.stacks.warm import _never_started

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
    from forgelib.docker.compose import ComposeProject
    from forgelib.testing import FakeRunner

    base = ComposeProject("p1", (), FakeRunner())
    assert base.container("runner") == "p1-runner-1"  # compose's first container
    moved = dataclasses.replace(base, containers={"runner": "p1-runner-7"})
    assert moved.container("runner") == "p1-runner-7" and moved.container("db") == "p1-db-1"


def test_only_a_container_with_networks_of_its_own_is_taken_off_them() -> None:
    from forgelib.stacks.warm import _networks

    nets = {"NetworkSettings": {"Networks": {"p1_default": {}, "p1_back": {}}}}
    assert _networks({**nets, "HostConfig": {"NetworkMode": "p1_default"}}) == ["p1_back", "p1_default"]
    for mode in ("host", "none", "container:abc", "service:db"):
        assert _networks({**nets, "HostConfig": {"NetworkMode": mode}}) == []


# ------------------------------------------------------------------ resets ahead (off the trial's path)
# A stack's reset is scripted through tests/support/warmpool.py (its one reset service): it takes 0.5 fake
# seconds, fails (`fail_reset`) or is held (`hold_resets`) until let go.


def test_a_stack_given_back_is_reset_in_the_background_and_handed_out_clean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _harness(monkeypatch, trials=4)
    first = h.acquire()
    h.hold_resets()
    h.hold(first, 1.0)  # returns with the reset still held: the reset is not the trial's
    h.reset_started()
    assert h.resets_started == [first.name] and h.resets_done == []
    h.let_resets()
    h.settle()
    assert h.resets_done == [first.name]
    again = h.acquire()
    assert again.name == first.name and decision(again) == "reuse" and h.provisioned == [first.name]
    assert "reset_wait" not in again.source["pool"]  # clean already: no waiting
    assert again.source["reset_ahead"]["reset:db"] == 0.5 and again.source["reset_ahead"]["ended_at"] > 0
    assert again.source["pool"]["reset_ahead"] == 0.5 and h.resets_started == [first.name]  # not again
    assert h.downs() == [] and again.source["replaced"] is None


def test_a_stack_whose_reset_fails_is_torn_down_never_handed_out_and_the_next_trial_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _harness(monkeypatch, trials=4)
    first = h.acquire()
    h.fail_reset(first.name, "roles differ from the first seeding")
    h.hold(first, 1.0)
    h.settle()
    assert h.resets_done == [first.name] and h.downs() == [first.name] and h.pool.names() == []
    again = h.acquire()
    assert again.name != first.name and decision(again) == "first"  # a new one, not the dirty one
    assert again.source["replaced"] == f"{first.name}: roles differ from the first seeding"
    assert h.provisioned == [first.name, again.name] and h.pool.names() == [again.name]
    h.hold(again, 1.0)
    h.settle()
    later = h.acquire()  # said once: the record is the next trial's only
    assert later.name == again.name and decision(later) == "reuse" and later.source["replaced"] is None


def test_a_stack_from_a_checkpoint_not_proven_clean_is_replaced_by_a_new_fork_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _harness(monkeypatch, trials=4)
    made: list[object] = []

    def steps() -> Any:
        made.append(object())
        return made[-1]

    start = pool_mod.StartFrom("ck-1", steps)
    first = h.acquire(start=start)
    h.fail_reset(first.name, "seeded_rows differ from the stack's first state")
    h.hold(first, 1.0)
    h.settle()
    assert h.downs() == [first.name] and h.pool.names() == []
    again = h.acquire(start=start)
    assert again.name != first.name and decision(again) == "first"
    assert again.source["replaced"] == f"{first.name}: seeded_rows differ from the stack's first state"
    # each stack came up with steps of its own from the same checkpoint
    assert [h.steps[first.name], h.steps[again.name]] == made and len(made) == 2


def test_a_trial_asking_while_the_stack_is_still_being_reset_waits_for_that_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _harness(monkeypatch, trials=4)
    first = h.acquire()
    h.clock.now += 100.0  # long past a provision's 7 s: without the reset under way it would grow
    h.hold_resets()
    h.hold(first, 30.0)
    h.reset_started()
    asking, got = h.ask_in_background()  # found no clean stack and waits
    h.let_resets()
    asking.join(10)
    (trial,) = got
    assert trial.name == first.name and decision(trial) == "reuse" and trial.source["pool"]["reset_wait"] > 0
    assert h.provisioned == [first.name]  # nothing provisioned for it


def test_trials_waiting_for_a_clean_stack_get_one_in_the_order_they_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _harness(monkeypatch, workers=1, provision=3600.0)  # no room to grow: every trial waits its turn
    held = h.acquire()
    waiting = [h.ask_in_background(looks=200) for _ in range(3)]  # asked in this order, each waiting
    for asking, got in waiting:
        h.hold(held, 1.0)  # given back: reset in the background, then handed to the first still waiting
        asking.join(10)
        assert not asking.is_alive(), "the trial that asked first did not get the stack"
        assert all(t.is_alive() for t, _ in waiting[waiting.index((asking, got)) + 1 :])
        (held,) = got
        assert decision(held) == "reuse"
    assert h.provisioned == [held.name]


def test_a_trial_that_waited_for_a_reset_that_failed_gets_a_new_stack_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _harness(monkeypatch, trials=4)
    first = h.acquire()
    h.clock.now += 100.0
    h.fail_reset(first.name, "an ACL user the reset cannot remove")
    h.hold_resets()
    h.hold(first, 30.0)
    h.reset_started()
    asking, got = h.ask_in_background()  # waits for the reset under way, which then fails
    h.let_resets()
    asking.join(10)
    (trial,) = got
    assert trial.name != first.name and h.provisioned == [first.name, trial.name]
    assert trial.source["replaced"] == f"{first.name}: an ACL user the reset cannot remove"


def test_once_every_trial_has_a_stack_one_given_back_is_torn_down_not_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _harness(monkeypatch, trials=1)
    only = h.acquire()  # the run's only trial
    h.hold(only, 1.0)
    h.settle()
    assert h.resets_started == [] and h.downs() == [only.name] and h.pool.names() == []


def test_close_waits_for_resets_under_way_and_tears_every_stack_down(monkeypatch: pytest.MonkeyPatch) -> None:
    h = _harness(monkeypatch, trials=8)
    trials = [h.acquire(task(s)) for s in ("db", "cache", "web")]  # three environments: three stacks
    names = sorted(t.name for t in trials)
    h.hold_resets()
    for t in trials:
        h.hold(t, 1.0)
    for _ in trials:
        h.reset_started()
    closing = threading.Thread(target=h.pool.close, daemon=True)
    closing.start()
    closing.join(timeout=1.0)  # (a close that does not wait is done by now on any but a starved machine)
    assert closing.is_alive() and h.downs() == []  # it waits for the resets under way
    h.let_resets()
    closing.join(timeout=30)
    assert not closing.is_alive()
    assert sorted(h.resets_done) == names and h.down_mid_reset == []  # each reset ended before its down
    assert sorted(h.downs()) == names and h.pool.names() == []


def test_after_no_more_a_stack_given_back_is_kept_unreset_until_a_rerun_resets_it_or_close_drops_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cluster slot's pool has no plan; its driver says when the queue is empty (``no_more``). A stack
    given back after that is not reset ahead: the run's end tears it down without a reset nobody needs,
    and a rerun that still comes takes it and resets it itself, on its own record."""
    h = _harness(monkeypatch)  # no plan, as on a cluster slot
    first, other = h.acquire(), h.acquire(task("cache"))
    h.pool.no_more()
    h.hold(first, 1.0)
    h.hold(other, 1.0)
    h.settle()
    assert h.resets_started == [] and h.downs() == []  # kept as they are
    rerun = h.acquire()  # a lost node's trial: the kept stack, reset for it now
    assert rerun.name == first.name and decision(rerun) == "reuse" and rerun.source["reuse"] == 1
    assert h.resets_done == [first.name] and rerun.timings["reset:db"] == 0.5
    assert "reset_ahead" not in rerun.source and h.provisioned == [first.name, other.name]
    h.hold(rerun, 1.0)
    h.hold_resets()  # a reset now would hang close: there must be none
    h.pool.close()
    assert h.resets_started == [first.name] and sorted(h.downs()) == sorted([first.name, other.name])
    assert h.pool.names() == []


def test_a_kept_stack_whose_late_reset_fails_is_replaced_for_the_rerun_and_it_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _harness(monkeypatch)
    first = h.acquire()
    h.pool.no_more()
    h.fail_reset(first.name, "roles differ from the first seeding")
    h.hold(first, 1.0)
    rerun = h.acquire()
    assert rerun.name != first.name and decision(rerun) == "first" and h.downs() == [first.name]
    assert rerun.source["replaced"] == f"{first.name}: roles differ from the first seeding"


@pytest.mark.parametrize(("prepare", "spares"), [(None, 1), (10.0, 2)])
def test_spares_are_counted_with_the_reset_time_or_until_one_is_timed_the_warm_preparation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, prepare: float | None, spares: int
) -> None:
    from forgelib.stacks.budget import Workload, spares_wanted
    from forgelib.stacks.warm.pool import DEFAULT_RESET

    handed = [0.0, 8.0]  # two stacks handed 8 s apart
    assert spares_wanted(handed=handed, reset=DEFAULT_RESET, left=6) == 1  # they come back one at a time
    assert spares_wanted(handed=handed, reset=10.0, left=6) == 2  # a 10 s reset: both within one reset
    assert spares_wanted(handed=handed, reset=1.0, left=6) == 1
    assert spares_wanted(handed=handed, reset=10.0, left=1) == 1  # no more than the trials still to come
    assert spares_wanted(handed=handed, reset=10.0, left=6, room=0) == 0  # nor than the memory budget
    # Through the pool: a waiting workload (no CPU) on 2 workers, no reset timed yet; the warm preparation
    # (`prepare` s, None: not timed) stands in for one, else the assumed 2 s.
    h = _harness(
        monkeypatch, workers=2, trials=8, prepare=prepare, workload=Workload(cpu=lambda: 0.0, cores=2)
    )
    a = h.acquire(trial_dir=tmp_path / "trials" / "t" / "0")  # handed at 1007
    h.clock.now += 1.0
    b = h.acquire(trial_dir=tmp_path / "trials" / "t" / "1")  # provisioned ahead, handed at 1015
    assert (decision(a), decision(b)) == ("first", "ahead")
    h.settle()
    assert len(h.provisioned) == 2 + spares and sorted(h.pool.names()) == sorted(h.provisioned)
    h.hold(a, 1.0)
    assert decision(h.acquire(trial_dir=tmp_path / "trials" / "t" / "2")) == "spare"  # clean, never used


def test_a_successor_is_furnished_with_its_services_directories_before_it_starts(tmp_path: Path) -> None:
    """A host's directories (harbor's /logs/*) go into the created, never-started successor by ``docker
    cp`` of each top-level entry to the container's root; a copy that fails leaves it unfurnished (the
    host then makes them itself) and says why."""
    from forgelib.docker.compose import ComposeProject
    from forgelib.errors import ForgeError
    from forgelib.stacks.warm.ephemeral import Ephemerals
    from forgelib.testing import FakeRunner

    where = tmp_path / "furnish"
    (where / "logs" / "agent").mkdir(parents=True)
    (where / "logs" / "verifier").mkdir()
    fake = FakeRunner()
    trial = dataclasses.replace(
        _trial({"main": {"image": "img"}}, {}, {}), compose=ComposeProject("p1", (), fake)
    )
    eph = Ephemerals(trial, [["main"]], [], furnish={"main": where})
    fake.expect("docker", "cp", times=1)
    eph._furnish({"main": "c1", "other": "c2"})  # a service with nothing to furnish is left alone
    assert [c.argv for c in fake.calls] == [("docker", "cp", str(where / "logs"), "c1:/")]
    assert eph.furnished == {"c1"}
    fake.expect("docker", "cp", rc=1, stderr="no such container")
    with pytest.raises(ForgeError, match="could not furnish main's successor: no such container"):
        eph._furnish({"main": "c3"})
    assert eph.furnished == {"c1"}


def test_a_new_warm_stack_records_its_wait_for_a_start_place_as_queueing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A warm pool's new stack holds one of the engine's start places while it comes up, as a fresh one
    does: a wait for one is the trial's ``start_wait``, part of its ``stack_wait``, not its provisioning."""
    from forgelib.stacks.budget import Admission

    admission = Admission(None, starts=1)
    admission.measure = lambda *a, **k: None  # type: ignore[method-assign]
    pool = _harness(monkeypatch, admission=admission)
    held = admission.starting()
    held.__enter__()  # another stack is coming up
    threading.Timer(0.3, held.__exit__, (None, None, None)).start()
    trial = pool.acquire()
    waited = trial.timings["start_wait"]
    assert waited >= 0.2 and trial.source["pool"]["start_wait"] == waited
    assert trial.timings["stack_wait"] >= waited


def test_with_goldens_a_warm_stack_comes_up_from_them_and_only_its_first_trial_hears_of_a_discard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    discarded = {"golden": "abc", "reason": "fingerprint parts differ"}
    h = _harness(monkeypatch, goldens=True, snapshots={"db": {"outcome": "captured", "discarded": discarded}})
    first = h.acquire()
    assert isinstance(h.steps[first.name], GoldenWarmSteps)
    assert first.snapshots == {"db": {"outcome": "captured", "discarded": discarded}}
    h.hold(first, 1.0)
    again = h.acquire()
    assert again.name == first.name and again.source["reuse"] == 1
    assert again.snapshots == {"db": {"outcome": "captured"}}  # how the stack started, not the discard again
    plain = _harness(monkeypatch)
    assert type(plain.steps[plain.acquire().name]) is WarmSteps


def test_ephemeral_services_on_no_reset_service_may_start_beside_the_reset() -> None:
    """``independent``: a service that reaches a reset service through any chain of depends_on waits for
    the reset; the others' successors start as soon as the trial's changes are gone."""
    deps = {
        "db": [],
        "files": [],
        "cache": [],
        "api": ["db", "cache"],
        "worker": ["api"],  # through the api
        "runner": [],
        "side": ["files", "cache"],  # a shared service is never reset
    }
    ephemeral = ["cache", "api", "worker", "runner", "side"]
    assert independent(deps, ephemeral, ["db"]) == ["cache", "runner", "side"]
    assert independent(deps, ephemeral, []) == ephemeral
    assert independent(deps, ephemeral, ["db", "files"]) == ["cache", "runner"]


def test_only_the_services_that_mount_a_renewed_volume_wait_for_it() -> None:
    """``renewal``: the volumes only ephemeral services mount go with them each trial, and the services
    that mount them are the ones whose successors cannot be made beside the running containers."""
    vol = {"type": "volume"}
    services = {
        "db": {"volumes": [{**vol, "source": "data", "target": "/d"}]},
        "api": {"volumes": [{**vol, "source": "data", "target": "/d"}]},  # the reset db's: kept
        "cache": {"image": "redis"},  # its image's VOLUME: an anonymous volume per container
        "runner": {"volumes": [{**vol, "source": "scratch", "target": "/x"}]},  # only ephemerals mount it
    }
    trial = _trial(services, {"db": Isolation.RESET}, {"data": {}, "scratch": {}})
    own = dataclasses.replace(trial, own_volumes=("cache",))  # compose labels anonymous volumes
    names, mounting = renewal(own, {"redis": ("/data",)}, ["api", "cache", "runner"])
    assert names == ["p1_scratch"]
    assert mounting == ["runner"]  # the cache's successor is made beside the running one
    # Without labels for anonymous volumes, the cache's image VOLUME is a named volume, renewed with it.
    names, mounting = renewal(trial, {"redis": ("/data",)}, ["api", "cache", "runner"])
    assert names == ["p1_forge-image-vol-cache-0", "p1_scratch"]
    assert mounting == ["cache", "runner"]
    # The same image on a reset service: its VOLUME is a named volume, kept with the service.
    trial = _trial(
        {**services, "cache": {"image": "redis"}},
        {"db": Isolation.RESET, "cache": Isolation.RESET},
        {"data": {}, "scratch": {}},
    )
    assert renewal(trial, {"redis": ("/data",)}, ["api", "runner"]) == (
        ["p1_scratch"],
        ["runner"],
    )


def test_a_staged_reset_says_when_the_trials_changes_are_gone() -> None:
    """``PreparedSeed.reset``: with a recipe's own ``reset_staged`` the callback runs between the restore
    and the wait for the server; with ``reset_after`` (or without a callback) after the whole reset."""
    calls: list[str] = []

    def staged(ctx: object, prepared: object, restored: Any) -> None:
        calls.append("restore")
        restored()
        calls.append("await")

    two = SimpleNamespace(reset=lambda ctx, prepared: calls.append("reset"), reset_staged=staged)

    def whole(ctx: object, prepared: object) -> None:
        calls.append("reset")

    one = SimpleNamespace(reset=whole, reset_staged=reset_after(whole))
    PreparedSeed(two, None, None, {}).reset(lambda: calls.append("restored"))  # type: ignore[arg-type]
    assert calls == ["restore", "restored", "await"]
    calls.clear()
    PreparedSeed(two, None, None, {}).reset()  # type: ignore[arg-type]
    assert calls == ["reset"]
    calls.clear()
    PreparedSeed(one, None, None, {}).reset(lambda: calls.append("restored"))  # type: ignore[arg-type]
    assert calls == ["reset", "restored"]


def test_postgres_says_its_trials_changes_are_gone_once_its_data_directory_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The exact reset calls ``restored`` between the data directory's restore and the wait for the
    server's first connection, so the pool's independent ephemerals start beside that wait."""
    from forgelib.kinds.postgres import seed as pg

    calls: list[str] = []
    pristine = SimpleNamespace(restore=lambda healthcheck=True: calls.append(f"restore {healthcheck}"))
    monkeypatch.setattr(pg, "_await_server", lambda ctx, exact: calls.append("await"))
    exact = pg.Exact(params=SimpleNamespace(), pristine=pristine)  # type: ignore[arg-type]
    pg.reset_staged(SimpleNamespace(), exact, lambda: calls.append("restored"))  # type: ignore[arg-type]
    assert calls == ["restore False", "restored", "await"]
    calls.clear()
    pg.reset(SimpleNamespace(), exact)  # type: ignore[arg-type]
    assert calls == ["restore False", "await"]


def test_the_last_trials_containers_leave_every_network_or_are_said_not_to() -> None:
    """``_disconnect``: each current container off each of its networks (one command per pair, at once);
    False when one fails or a service's networks are not known, so the caller removes them instead."""
    from forgelib.docker.compose import ComposeProject
    from forgelib.stacks.warm.ephemeral import Ephemerals
    from forgelib.testing import FakeRunner

    fake = FakeRunner()
    trial = dataclasses.replace(
        _trial({"cache": {}, "api": {}}, {}, {}), compose=ComposeProject("p1", (), fake)
    )
    eph = Ephemerals(trial, [["cache", "api"]], [])
    eph.current = {"cache": "p1-cache-1", "api": "p1-api-1"}
    eph.networks = {"cache": ["p1_default"], "api": ["p1_default", "p1_back"]}
    fake.expect("docker", "network", "disconnect")
    assert eph._disconnect(["cache", "api"])
    assert sorted(c.argv[-2:] for c in fake.calls) == [
        ("p1_back", "p1-api-1"),
        ("p1_default", "p1-api-1"),
        ("p1_default", "p1-cache-1"),
    ]
    fake = FakeRunner()
    eph.trial = dataclasses.replace(trial, compose=ComposeProject("p1", (), fake))
    fake.expect("docker", "network", "disconnect", "--force", "p1_back", rc=1, stderr="not connected")
    fake.expect("docker", "network", "disconnect")
    assert not eph._disconnect(["cache", "api"])
    eph.networks = {"cache": ["p1_default"]}  # the api's not known: remove them instead
    assert not eph._disconnect(["cache", "api"])
