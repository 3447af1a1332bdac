"""multi_service_cache_debug end to end: the redis_dump recipe loads the cache_poisoned RDB on every trial,
the oracle's diagnosis passes, and the gate catches a diagnosis that changes an order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.modes import stack_args

pytestmark = pytest.mark.e2e

PACK = Path(__file__).resolve().parents[2] / "examples" / "multi_service_cache_debug"
GATE = "no_status_update_posted"
NOTE_CHECKS = ("note_names_missing_invalidation", "note_quotes_stale_status")
# redis's own log lines when it starts from a dump.rdb (7.0 wording; the "signature").
RDB_LOADED = ("Loading RDB", "Done loading RDB", "DB loaded from disk")
SERVICES = ("app-db", "redis", "orders-api", "cache-admin", "runner")


def _reads(note: str) -> tuple[str, ...]:
    """The three statuses the oracle read, from its note's evidence lines (cache-admin, source, api)."""
    pattern = {
        "cache_admin": r"cache-admin GET /cache/order:4021 -> status \"(\w+)\"",
        "source": r"orders-api GET /orders/4021/source -> status \"(\w+)\"",
        "orders_api": r"orders-api GET /orders/4021 -> status \"(\w+)\"",
    }
    found = {k: re.search(p, note) for k, p in pattern.items()}
    assert all(found.values()), f"the note lacks an evidence line: {found}\n{note}"
    return tuple(m.group(1) for m in found.values() if m is not None)


def test_dev_run_passes_on_the_seeded_stale_cache(forge_run: Callable[..., Any], dev_stacks: str) -> None:
    run = forge_run(PACK / "run_configs" / "dev.yaml", *stack_args(dev_stacks))
    assert run.rc == 0, run.explain()
    totals = run.summary["totals"]
    assert (totals["trials"], totals["passed"], totals["failed"]) == (2, 2, 0), run.explain()

    for t in run.trials("diagnose_stale_order"):
        assert t.status == "passed", t.grade
        assert t.trial["termination_reason"] == "COMPLETED"
        assert t.grade["score"] == 1.0
        outcomes = {c["name"]: c["passed"] for c in t.grade["checks"]}
        assert outcomes == {**dict.fromkeys(NOTE_CHECKS, True), GATE: True}
        assert t.observed(GATE) == "0"

        # The layers disagree exactly as the seed makes them: cache and API stale, postgres right.
        note = t.observed("note_quotes_stale_status")
        assert _reads(note) == ("processing", "shipped", "processing")
        assert 'Stale status served: "processing"' in note

        # The proof the recipe fired: redis started from the copied dump (logs kept on a green run).
        redis_log = t.service_log("redis")
        for line in RDB_LOADED:
            assert line in redis_log, f"{line!r} not in the captured redis log:\n{redis_log[-2000:]}"
        assert re.search(r"Done loading RDB, keys loaded: 2\b", redis_log), redis_log[-2000:]
        for svc in SERVICES:
            assert (t.dir / "services" / f"{svc}.log").is_file(), f"no log captured for {svc}"
    if dev_stacks == "snapshots":  # the second trial's redis started from the first one's golden
        outcomes = [t.trial["snapshots"]["redis"]["outcome"] for t in run.trials("diagnose_stale_order")]
        assert outcomes[0] in ("captured", "restored") and outcomes[1] == "restored", outcomes


def test_control_that_posts_a_status_update_fails_on_the_gate(
    forge_run: Callable[..., Any], stacks: str
) -> None:
    # Warm: twice, so the second trial runs on the stack the first one wrote to: it must see its own one
    # update, not two (app-db was reset in place).
    repeats = "2" if stacks == "warm" else "1"
    run = forge_run(PACK / "run_configs" / "control.yaml", "--stacks", stacks, "--repeats", repeats)
    assert run.rc == 1, run.explain()

    trials = run.trials("diagnose_stale_order_with_update")
    assert len(trials) == int(repeats)
    if stacks == "warm":
        assert trials[1].trial["stack"]["reuse"] == 1, trials[1].trial
    for t in trials:
        _control_failed_on_the_gate(t)


def _control_failed_on_the_gate(t: Any) -> None:
    assert t.trial["termination_reason"] == "COMPLETED", t.trial  # graded, not an error
    assert t.status == "failed"
    assert t.grade["binary_pass"] is False
    # The note is as good as the reference one; the only failed check is the gate.
    gate = t.check(GATE)
    assert (gate["gate"], gate["passed"]) == (True, False), gate
    assert t.observed(GATE) == "1"  # the one status update the control posted
    assert all(t.check(name)["passed"] for name in NOTE_CHECKS), t.grade["checks"]
    assert any(r.startswith(f"gate '{GATE}' failed") for r in t.grade["reasons"]), t.grade["reasons"]


def test_pack_validates_with_current_digests(forge: Callable[..., Any]) -> None:
    for args in (["validate", "--project", str(PACK)], ["stamp", "--check", "--project", str(PACK)]):
        proc = forge(*args)
        assert proc.returncode == 0, f"forge {' '.join(args)}: {proc.returncode}\n{proc.stdout}{proc.stderr}"
