"""multi_service_postgres_reset end to end: the sql_dump recipe fires on every trial, and only because of it.

init.sql leaves widget 1 as 'factory_default'; the postgres_baseline seed makes it 'baseline'. The dev run
must observe 'baseline' on both trials; the control (the same pack with app-db out of reset isolation, so
no binding) must observe 'factory_default' — otherwise a green dev run would not prove the seed ran.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

PACK = Path(__file__).resolve().parents[2] / "examples" / "multi_service_postgres_reset"
CHECK = "submission_reads_baseline"


def test_dev_run_observes_the_seeded_baseline(forge_run: Callable[..., Any]) -> None:
    run = forge_run(PACK / "run_configs" / "dev.yaml")
    assert run.rc == 0, run.explain()
    totals = run.summary["totals"]
    assert (totals["trials"], totals["passed"], totals["failed"]) == (2, 2, 0), run.explain()

    trials = run.trials("read_widget")
    assert [t.dir.name for t in trials] == ["0", "1"]
    for t in trials:
        assert t.status == "passed", t.grade
        assert t.trial["termination_reason"] == "COMPLETED"
        assert t.grade["binary_pass"] is True
        assert t.grade["score"] == 1.0
        assert t.observed(CHECK) == "baseline"
        # each trial ran its own provision (and so its own seed) on its own compose project
        assert t.trial["timings"]["provision"] > 0
    assert len({t.trial["compose_project"] for t in trials}) == 2


def test_control_without_the_reset_binding_observes_factory_default(forge_run: Callable[..., Any]) -> None:
    run = forge_run(PACK / "run_configs" / "control.yaml")
    assert run.rc == 1, run.explain()  # a red trial: exit 1, not a crash or usage error

    (t,) = run.trials("read_widget_without_reset")
    # The stack came up and the oracle ran fine: the trial is graded red, not an error.
    assert t.trial["termination_reason"] == "COMPLETED", t.trial
    assert t.status == "failed"
    assert t.grade["binary_pass"] is False
    assert t.observed(CHECK) == "factory_default"
    assert any(CHECK in r and "factory_default" in r for r in t.grade["reasons"]), t.grade["reasons"]
