"""A checkpoint captured by another version of a kind's recipe (``RECIPE_VERSION``: what it captures or
how its fingerprint is taken changed, as postgres's did at version 2) is refused before a fork or a
restore uses it, naming the fix, rather than verified against a fingerprint taken differently. (A
checkpoint of today's recipe forks and restores on the real engine: tests/integration/test_checkpoints.py.)
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from forgelib.kinds.postgres import seed as postgres
from forgelib.stacks import checkpoints
from forgelib.stacks.snapshots.checkpoints import Checkpoint, CheckpointError

CID = "ck-0123456789ab"


def _checkpoint(**rec: Any) -> Checkpoint:
    service = {"image": "sha256:" + "a" * 64, "path": "/var/lib/postgresql/data", "kind": "sql_dump", **rec}
    return Checkpoint(CID, {"project": "shop", "services": {"db": service}}, "sha256:" + "b" * 64)


@pytest.mark.parametrize(
    ("rec", "said"),
    [({"recipe_version": 1}, "version 1,"), ({}, "does not record")],
    ids=["before-version-2", "unrecorded"],
)
def test_a_checkpoint_of_another_recipe_version_is_refused_naming_the_fix(
    rec: dict[str, Any], said: str
) -> None:
    with pytest.raises(CheckpointError) as e:
        checkpoints.same_recipe(_checkpoint(**rec), "db", postgres)
    msg = str(e.value)
    assert said in msg and f"version {postgres.RECIPE_VERSION}" in msg
    assert "forge checkpoint" in msg and f"forge snapshots prune --checkpoint {CID}" in msg


def test_a_checkpoint_of_this_recipe_version_passes() -> None:
    checkpoints.same_recipe(_checkpoint(recipe_version=postgres.RECIPE_VERSION), "db", postgres)


def test_fork_refuses_it_before_any_stack_comes_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(checkpoints.ckstore, "load", lambda *a, **k: _checkpoint(recipe_version=1))
    project = SimpleNamespace(
        name="shop",
        environment=SimpleNamespace(compose={"services": {"db": {"image": "forgelib/postgres:15"}}}),
    )
    # no backend, admission nor live registry: reaching any of them would fail the test another way
    stacks: Any = SimpleNamespace(project=project, runner=None, timeouts=SimpleNamespace(command=1.0))
    with pytest.raises(CheckpointError, match="captured by the sql_dump recipe's version 1"):
        checkpoints.fork(stacks, CID, 2, trial_dir=tmp_path)
