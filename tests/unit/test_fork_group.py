"""How ``checkpoints.fork`` brings a group of forks up (``_group``, ``_concurrently``) without an engine: a
fork that fails gives its room in the memory budget back and the others stay registered; once they are
torn down, nothing is counted. (That forks come up on the real engine, fail, and are reaped after a kill:
tests/integration/test_checkpoints.py.)"""

from __future__ import annotations

import dataclasses
import functools
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from forgelib.errors import ForgeError, ProvisionError
from forgelib.spec.models import Timeouts
from forgelib.stacks import checkpoints
from forgelib.stacks.budget import Admission
from forgelib.stacks.live import LiveStacks, StopState
from forgelib.testing import FakeRunner


@dataclasses.dataclass(frozen=True)
class _Up:
    """What ``_group`` needs of a stack that came up: its name, timings, and a teardown that is a no-op."""

    name: str
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    shared: bool = True  # teardown_trial leaves a shared stack alone


def _stacks() -> Any:
    return SimpleNamespace(admission=Admission(None, starts=1), live=LiveStacks(), stop=StopState())


def _ctx(kept: bool = False) -> Any:
    return SimpleNamespace(runner=FakeRunner(), timeouts=Timeouts(), kept=kept)


def test_a_failed_fork_gives_its_room_back_and_the_others_stay_registered() -> None:
    stacks = _stacks()
    started: list[str] = []
    lock = threading.Lock()

    def one(spec: Any) -> Any:
        with lock:
            started.append(spec)
        if spec == "b":
            raise ProvisionError("checkpoint", "service 'db' is not at checkpoint ck-1")
        return _Up(f"stack-{spec}")

    with pytest.raises(ProvisionError, match="not at checkpoint"):
        checkpoints._group(stacks, _ctx(), ["a", "b", "c"], one)
    assert sorted(started) == ["a", "b", "c"]  # one group: all of them began together
    assert stacks.live.names() == ["stack-a", "stack-c"]
    assert stacks.admission.held == 2  # the failed one's room is back
    report = stacks.live.teardown_all()
    assert sorted(report.removed) == ["stack-a", "stack-c"]
    assert stacks.admission.held == 0


def test_forks_come_back_in_order_with_their_waits_and_a_kept_one_is_not_registered() -> None:
    stacks = _stacks()
    made = checkpoints._group(stacks, _ctx(kept=True), ["x", "y"], lambda spec: _Up(f"stack-{spec}"))
    assert [t.name for t in made] == ["stack-x", "stack-y"]
    assert all({"memory_wait", "start_wait"} <= set(t.timings) for t in made)
    assert stacks.live.names() == []  # kept: outlives the process, never torn down by it
    assert stacks.admission.held == 2


def test_the_first_failure_of_several_groups_is_raised_after_the_others_ended() -> None:
    stacks = _stacks()
    ended: list[int] = []
    failing = threading.Event()

    def do(i: int) -> int:
        if i == 0:
            failing.set()
            raise RuntimeError("group 0 failed")
        failing.wait(timeout=30)  # still under way when group 0 fails
        ended.append(i)
        return i

    with pytest.raises(RuntimeError, match="group 0 failed"):
        checkpoints._concurrently(stacks, do, [0, 1, 2], main=True)
    assert sorted(ended) == [1, 2]  # raised only once the groups under way had ended
    assert checkpoints._concurrently(stacks, lambda i: i * 2, [1, 2, 3], main=True) == [2, 4, 6]


@dataclasses.dataclass(frozen=True)
class _Kept:
    """A kept fork that came up: its teardown is recorded."""

    name: str
    downed: list[str]
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    shared: bool = False

    @property
    def compose(self) -> Any:
        return SimpleNamespace(down=lambda stop_timeout=None: self.downed.append(self.name))


def _kept_forks(stacks: Any, groups: list[list[str]], one: Any) -> list[Any]:
    def bring_up(kept: list[Any]) -> list[Any]:
        made = checkpoints._concurrently(
            stacks, lambda g: checkpoints._group(stacks, _ctx(kept=True), g, one, kept), groups, main=True
        )
        return [t for g in made for t in g]

    return checkpoints._hand_over(stacks, bring_up)


def test_kept_forks_give_their_room_back_once_handed_over() -> None:
    stacks, downed = _stacks(), []
    made = _kept_forks(stacks, [["x", "y"], ["z"]], lambda spec: _Kept(f"stack-{spec}", downed))
    assert [t.name for t in made] == ["stack-x", "stack-y", "stack-z"]
    assert stacks.admission.held == 0  # the caller's now: a second call is not starved by the first
    assert stacks.live.names() == [] and downed == []  # and still up, never this process's to tear down
    again = _kept_forks(stacks, [["w"]], lambda spec: _Kept(f"stack-{spec}", downed))
    assert [t.name for t in again] == ["stack-w"] and stacks.admission.held == 0


def test_kept_forks_of_a_failed_call_are_torn_down_and_give_their_room_back() -> None:
    downed: list[str] = []
    # no start bound: the failing group must not hold the one start place while the others wait for it
    stacks = SimpleNamespace(admission=Admission(None), live=LiveStacks(), stop=StopState())
    up = threading.Event()

    def one(spec: str) -> Any:
        if spec == "z":
            up.wait(timeout=30)  # fails once the other group's forks are up
            raise ProvisionError("checkpoint", "service 'db' is not at checkpoint ck-1")
        trial = _Kept(f"stack-{spec}", downed)
        if spec == "y":
            up.set()
        return trial

    with pytest.raises(ProvisionError, match="not at checkpoint"):
        _kept_forks(stacks, [["x"], ["y"], ["z"]], one)
    assert sorted(downed) == ["stack-x", "stack-y"]  # never handed over: a kept stack is never reaped
    assert stacks.admission.held == 0


def test_forks_the_budget_can_never_hold_at_once_fail_with_the_fix_instead_of_waiting() -> None:
    """Every fork holds its room until the call returns them all: with the footprint measured, asking
    for more than the budget holds would wait for ever. The wait ends with the reason and the fix, and
    the room counted is given back."""
    mib = 1024 * 1024
    stacks = SimpleNamespace(admission=Admission(300 * mib, starts=1), live=LiveStacks(), stop=StopState())
    stacks.admission.per_stack = 100 * mib
    hopeless = functools.partial(checkpoints._beyond_budget, stacks.admission, 4, "shop")
    started: list[Any] = []
    with pytest.raises(ForgeError, match=r"4 stacks of shop do not fit .* holds 3 stacks .* at most 3"):
        checkpoints._group(
            stacks, _ctx(), ["a", "b", "c", "d"], lambda spec: started.append(spec), [], hopeless
        )
    assert started == []  # refused before any of them began
    assert stacks.admission.held == 0


def test_forks_wait_for_room_while_their_footprint_is_not_measured_yet() -> None:
    """Before the first stack is measured the budget assumes a large footprint: a call that may still fit
    once it is measured is not refused."""
    mib = 1024 * 1024
    admission = Admission(300 * mib, starts=1)
    assert checkpoints._beyond_budget(admission, 40, "shop") is None
    admission.per_stack = 100 * mib
    assert checkpoints._beyond_budget(admission, 3, "shop") is None
    assert checkpoints._beyond_budget(admission, 4, "shop") is not None
    assert checkpoints._beyond_budget(Admission(None), 400, "shop") is None  # no budget: no bound
