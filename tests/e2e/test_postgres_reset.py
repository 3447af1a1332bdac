"""multi_service_postgres_reset end to end: the sql_dump recipe fires on every trial, and only because of it.

init.sql leaves widget 1 as 'factory_default'; the postgres_baseline seed makes it 'baseline'. The dev run
must observe 'baseline' on both trials; the control (the same pack with app-db out of reset isolation, so
no binding) must observe 'factory_default' — otherwise a green dev run would not prove the seed ran.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

PACK = Path(__file__).resolve().parents[2] / "examples" / "multi_service_postgres_reset"
CHECK = "submission_reads_baseline"


def _recipe_timings(trial: Mapping[str, Any]) -> list[str]:
    """The per-seed timing entries trial.yaml records for app-db (one per recipe applied)."""
    return [k for k in trial["timings"] if k.startswith("recipe") and "app-db" in k]


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
        # each trial applied the seed itself, on its own compose project
        assert _recipe_timings(t.trial), t.trial["timings"]
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
    assert not _recipe_timings(t.trial), t.trial["timings"]  # no binding, no recipe
    assert any(CHECK in r and "factory_default" in r for r in t.grade["reasons"]), t.grade["reasons"]


def test_pack_validates_with_current_digests(forge: Callable[..., Any]) -> None:
    for args in (["validate", "--project", str(PACK)], ["stamp", "--check", "--project", str(PACK)]):
        proc = forge(*args)
        assert proc.returncode == 0, f"forge {' '.join(args)}: {proc.returncode}\n{proc.stdout}{proc.stderr}"
