"""multi_service_cache_debug end to end: the redis_dump recipe loads the cache_poisoned RDB on every trial,
the oracle's diagnosis passes by either grading route (two oracle variants), the shared gate catches a
diagnosis that changes an order, and a note that quotes no read stays below the threshold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.modes import stack_args

pytestmark = pytest.mark.e2e

PACK = Path(__file__).resolve().parents[2] / "examples" / "multi_service_cache_debug"
GATE = "no_status_update_posted"
# redis's own log lines when it starts from a dump.rdb (7.0 wording; the "signature").
RDB_LOADED = ("Loading RDB", "Done loading RDB", "DB loaded from disk")
SERVICES = ("app-db", "redis", "orders-api", "cache-admin", "runner")


WINNERS = {"diagnose_stale_order": "served_vs_source", "diagnose_stale_order_via_cache": "cached_vs_api"}


def test_dev_run_passes_by_either_route(forge_run: Callable[..., Any], dev_stacks: str) -> None:
    run = forge_run(PACK / "run_configs" / "dev.yaml", *stack_args(dev_stacks))
    assert run.rc == 0, run.explain()
    totals = run.summary["totals"]
    assert (totals["trials"], totals["passed"], totals["failed"]) == (2, 2, 0), run.explain()

    for task, winner in WINNERS.items():
        (t,) = run.trials(task)
        assert t.status == "passed", t.grade
        assert t.trial["termination_reason"] == "COMPLETED"
        details = t.grade["details"]
        routes = details["routes"]
        assert routes["winner"] == winner and routes["routes"][winner] == 1.0, details
        assert min(routes["routes"].values()) < 1.0  # the other route did not hold: genuinely alternative
        assert details["judge"]["score"] == 1.0 and "stand-in" in details["judge"]["reason"]
        assert t.grade["score"] == 1.0 and t.check(GATE)["passed"] and t.observed(GATE) == "0"

        # The proof the recipe fired: redis started from the copied dump (logs kept on a green run).
        redis_log = t.service_log("redis")
        for line in RDB_LOADED:
            assert line in redis_log, f"{line!r} not in the captured redis log:\n{redis_log[-2000:]}"
        assert re.search(r"Done loading RDB, keys loaded: 2\b", redis_log), redis_log[-2000:]
        for svc in SERVICES:
            assert (t.dir / "services" / f"{svc}.log").is_file(), f"no log captured for {svc}"
        # The oracle acts through the trial's MCP tools (the task declares them): its run has a trace.
        calls = [json.loads(line) for line in (t.dir / "trace.jsonl").read_text().splitlines()]
        assert [c["tool"] for c in calls] == ["http_request", "http_request", "write_file", "write_file"]
        assert all(c["ok"] for c in calls), calls
    if dev_stacks == "snapshots":  # the second trial's redis started from the first one's golden
        trials = [t for task in WINNERS for t in run.trials(task)]  # in the order they ran (workers 1)
        outcomes = [t.trial["snapshots"]["redis"]["outcome"] for t in trials]
        assert outcomes[0] in ("captured", "restored") and outcomes[1] == "restored", outcomes


def test_controls_fail_on_the_gate_and_below_the_threshold(
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
    for u in run.trials("diagnose_stale_order_unquoted"):  # the right cause, no quoted read
        assert u.status == "failed" and u.trial["termination_reason"] == "COMPLETED", u.trial
        assert u.check(GATE)["passed"]  # nothing mutated: it fails on the evidence alone
        # No route holds whole: its trace has the reads (the oracle acts through the tools), its note
        # quotes none of them.
        assert u.grade["details"]["routes"]["score"] < 1.0
        assert u.grade["score"] < u.grade["threshold"] == 0.6, u.grade
        assert any("below the threshold" in r for r in u.grade["reasons"]), u.grade["reasons"]


def _control_failed_on_the_gate(t: Any) -> None:
    assert t.trial["termination_reason"] == "COMPLETED", t.trial  # graded, not an error
    assert t.status == "failed" and t.grade["binary_pass"] is False
    # The diagnosis itself scores full marks; only the shared gate fails it, whatever route won.
    assert t.grade["score"] == 1.0, t.grade
    gate = t.check(GATE)
    assert (gate["gate"], gate["passed"]) == (True, False), gate
    assert t.observed(GATE) == "1"  # the one status update the control posted
    assert any(r.startswith(f"gate '{GATE}' failed") for r in t.grade["reasons"]), t.grade["reasons"]


def test_scripted_agents_are_graded_on_what_their_tools_did(forge_run: Callable[..., Any]) -> None:
    """The reference design over the trace: scripted MCP-client agents (agents/scripted.py), each a run
    config of the pack. A regex over the note cannot tell these apart; their trace.jsonl can."""
    runs = {plan: forge_run(PACK / "run_configs" / f"agent_{plan}.yaml") for plan in AGENT_PLANS}
    trial = {}
    for plan, run in runs.items():
        (t,) = run.trials("diagnose_stale_order")
        assert t.trial["termination_reason"] == "COMPLETED", run.explain()  # graded, never an error
        assert t.trial["solver"]["kind"] == "command", t.trial["solver"]
        calls = [json.loads(line) for line in (t.dir / "trace.jsonl").read_text().splitlines()]
        assert calls and all(c["tool"] in ("http_request", "write_file") for c in calls), calls
        trial[plan] = t

    served = trial["served"]  # the reference route, as an agent: passes on every check
    assert served.status == "passed" and served.grade["score"] == 1.0, served.grade
    assert served.grade["details"]["routes"]["winner"] == "served_vs_source"
    assert served.check(STALE_READ)["passed"]

    post = trial["post"]  # a full diagnosis, then a status POST: both gates fail it, whatever route won
    assert post.status == "failed" and post.grade["score"] == 1.0, post.grade
    assert not post.check(GATE)["passed"] and post.observed(GATE) == "1"
    assert not post.check("no_status_update_called")["passed"]

    unread = trial["unread"]  # quotes a served status it never read: the bound token catches it
    assert unread.status == "failed", unread.grade
    assert unread.check(GATE)["passed"] and not unread.check(STALE_READ)["passed"]
    assert not unread.check("note_quotes_served_status")["passed"]
    assert unread.check("note_quotes_a_read_status")["passed"]  # the regex over the note is fooled

    half = trial["half"]  # half of each route: the better incomplete route, never the sum of two halves
    routes = half.grade["details"]["routes"]
    assert max(routes["routes"].values()) < 1.0, routes
    assert routes["score"] == max(routes["routes"].values()), routes


AGENT_PLANS = ("served", "post", "unread", "half")
STALE_READ = "note_quotes_a_stale_status_it_read"


def test_pack_validates_with_current_digests(forge: Callable[..., Any]) -> None:
    for args in (["validate", "--project", str(PACK)], ["stamp", "--check", "--project", str(PACK)]):
        proc = forge(*args)
        assert proc.returncode == 0, f"forge {' '.join(args)}: {proc.returncode}\n{proc.stdout}{proc.stderr}"
