"""``forgelib.stacks.open``: every backend it hands out shares one budget, start bound, registry and cache;
leaving it tears down what is still registered and gives the engine's ledger line back."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from forgelib import stacks
from forgelib.errors import ForgeError, Interrupted
from forgelib.stacks.session import EVERY_ENVIRONMENT
from forgelib.testing import FakeRunner


def _project(name: str = "p") -> Any:
    return SimpleNamespace(name=name)


def _ledger_lines() -> list[Path]:
    from forgelib.stacks.slots import engine_dir

    return list((engine_dir() / "memory").glob("*.held"))


def test_every_backend_shares_the_budget_the_registry_and_the_cache() -> None:
    with stacks.open(_project(), mode="warm", workers=3, signals=False, memory_budget_mb=512) as opened:
        assert len(_ledger_lines()) == 1  # this process's line in the engine's ledger
        run, other = opened.backend, opened.backend_of(_project("q"), mode="fresh")
        assert run is opened.backend  # the project's own, made once
        assert run.admission is other.admission is opened.admission
        assert opened.admission.budget == 512 * 1024 * 1024 and opened.admission.slots is not None
        assert run.ctx.cache is other.ctx.cache and run.shared is other.shared is opened.shared
        assert run.pool is not None and run.pool.workers == 3 and run.pool.admission is opened.admission
        assert run.pool.stacks is opened.live and other.pool is None
        one_at_a_time = opened.backend_of(_project("r"), mode="warm", workers=None)
        assert one_at_a_time.pool is not None
        assert opened.backend_of(_project("s"), mode="warm").pool.workers == 3  # type: ignore[union-attr]
    assert _ledger_lines() == []
    with stacks.open(None, signals=False) as opened:
        warm = opened.backend_of(_project(), mode="warm")
        assert warm.pool is not None and warm.pool.workers == EVERY_ENVIRONMENT and warm.pool.workload is None
        with pytest.raises(ForgeError, match="without a project"):
            _ = opened.backend


def test_scope_stack_shares_no_stack_and_kept_keeps_the_built_images() -> None:
    runner = FakeRunner()  # refuses any command: a kept provision removes nothing on leaving
    with stacks.open(_project(), scope="stack", kept=True, runner=runner, signals=False) as opened:
        assert opened.shared is None and opened.backend.shared is None
        assert opened.backend.ctx.kept is True
    assert opened.left == []


def test_leaving_tears_down_what_is_registered_and_says_what_it_could_not() -> None:
    said: list[str] = []
    removed: list[str] = []

    def broken(graceful: bool) -> None:
        raise ForgeError("docker said no")

    with stacks.open(_project(), signals=False, say=said.append) as opened:
        opened.live.add("a", lambda graceful: removed.append("a"))
        opened.live.add("b", broken)
    assert removed == ["a"] and opened.left == ["b: docker said no"]
    assert said == ["could not tear down b: docker said no; `forge reap` removes it once this process exited"]


def test_a_stop_refuses_new_launches_through_the_runner_it_hands_out() -> None:
    with stacks.open(_project(), signals=False, runner=FakeRunner()) as opened:
        opened.stop.request("the host's stop")
        with pytest.raises(Interrupted):
            opened.runner.run(["compose", "up"], tag="up")
        assert opened.backend.ctx.runner is opened.runner  # the guarded one: every stack's commands
