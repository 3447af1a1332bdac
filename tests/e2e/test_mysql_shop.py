"""multi_service_mysql_shop end to end: a MariaDB service seeded from a sql_dump, a redis cache and an
HTTP API; fresh, warm (exact reset) and golden runs, and a hostile task whose first observation (databases,
users, grants, variables, rows) is identical in all three while it vandalises all of it every trial."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.modes import stack_args

pytestmark = pytest.mark.e2e

PACK = Path(__file__).resolve().parents[2] / "examples" / "multi_service_mysql_shop"


def test_the_shop_task_passes_on_a_fresh_stack(forge_run: Callable[..., Any]) -> None:
    run = forge_run(PACK / "run_configs" / "dev.yaml")
    assert run.rc == 0, run.explain()
    (t,) = run.trials("read_order")
    assert t.status == "passed", t.grade
    assert t.observed("submission_reads_shipped") == "shipped"
    assert t.observed("order_1_is_still_shipped") == "shipped"  # the sql check, on a mysql service


def test_a_hostile_trial_observes_a_fresh_stack_in_every_mode(
    forge_run: Callable[..., Any], goldens_removed: None
) -> None:
    first: dict[str, str] = {}
    for mode in ("fresh", "warm", "snapshots"):
        run = forge_run(PACK / "run_configs" / "hostile.yaml", *stack_args(mode))
        assert run.rc == 0, run.explain()
        trials = run.trials("hostile_observer")
        seen = [(t.dir / "oracle.stdout").read_text() for t in trials]
        assert len(seen) == 2 and seen[0] == seen[1], (mode, seen)
        first[mode] = seen[0]
        if mode == "warm":  # the second trial ran on the first one's stack, reset in place
            assert [t.trial["stack"]["reuse"] for t in trials] == [0, 1]
    assert first["fresh"] == first["warm"] == first["snapshots"]
    for what in ('"databases"', '"users"', '"grants"', '"variables"', '"orders"'):
        assert what in first["fresh"], what
    assert "mallory" not in first["fresh"] and "loot" not in first["fresh"]


def test_pack_validates_with_current_digests(forge: Callable[..., Any]) -> None:
    for args in (["validate", "--project", str(PACK)], ["stamp", "--check", "--project", str(PACK)]):
        proc = forge(*args)
        assert proc.returncode == 0, f"forge {' '.join(args)}: {proc.returncode}\n{proc.stdout}{proc.stderr}"
