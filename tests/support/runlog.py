"""Synthetic ``events.jsonl`` logs, shaped exactly like the ones ``forge run`` writes, for the report's tests
and the render benchmark: ``synthetic_run(n)`` is a run of ``n`` trials on a few workers with provisioning
errors, oracle errors, graded failures, an interruption and a resume."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from forgelib.run import events as ev

T0 = 1_764_547_200.0  # 2025-12-01T00:00:00Z


def ev_started(plan: list[tuple[str, int]], ts: float = T0, workers: int = 1) -> dict[str, Any]:
    return {
        "v": 1, "kind": ev.RUN_STARTED, "ts": ts, "run_id": "20251201T000000Z-abc123", "project": "/p",
        "config": "/p/run_configs/dev.yaml", "plan": [{"task": t, "index": i} for t, i in plan],
        "settings": {"repeats": 1, "workers": workers},
        "origin": {"host": "box", "forgelib": "0.1.0", "python": "3.11.2", "platform": "Linux-6.1"},
    }  # fmt: skip


_REASONS = {
    "failed": (
        "COMPLETED",
        None,
        "submission_reads_baseline: expected 'baseline', observed 'factory_default'",
    ),
    "provision_error": (
        "PROVISION_ERROR",
        "reset_recipe",
        "Provisioning failed at reset_recipe: psql: ERROR: relation widgets does not exist",
    ),
    "oracle_error": ("AGENT_ERROR", "solve", "oracle exited 1: Traceback ... KeyError: 'widget'"),
    "oracle_timeout": ("AGENT_TIMEOUT", "solve", "oracle timed out after 60 s"),
    "interrupted": ("INTERRUPTED", None, "interrupted before the trial finished"),
}


def trial_events(
    task: str,
    index: int,
    start: float,
    worker: str,
    *,
    steps: Mapping[str, float] | None = None,
    oracle: float = 2.0,
    grading: float = 0.5,
    teardown: float = 1.0,
    outcome: str = "passed",  # passed, failed, provision_error, oracle_error, oracle_timeout, interrupted
    attempt: int = 1,
    retried: bool = False,  # the attempt is followed by another (a trial_attempt event, not trial_finished)
    old: bool = False,  # as a writer from before RECORD/trial_torn_down: teardown before the verdict
) -> list[dict[str, Any]]:
    """The events of one attempt, in the order the executor writes them."""
    steps = dict(steps or {"compose_config": 0.3, "up_seeded": 2.0, "recipe:app-db": 0.7, "up_rest": 0.5})
    if outcome == "provision_error":
        steps = {"compose_config": 0.3, "up_seeded": 2.0, "recipe:app-db": 0.4}
    provision = round(sum(steps.values()) + 0.1, 3)
    # (phase, seconds in it), in order
    seq: list[tuple[str, float]] = [("provisioning", provision)]
    if outcome == "interrupted":
        seq.append(("solve", oracle / 2))
    elif outcome != "provision_error":
        seq.append(("solve", oracle))
        if outcome in ("passed", "failed"):
            seq.append(("grading", grading))
        if outcome != "passed":
            seq.append(("capture_logs", 0.2))
    if not old:
        seq.append(("record", 0.05))
    stack = outcome != "provision_error"
    if old and stack:
        seq.append(("teardown", teardown))
    term, stage, reason = _REASONS.get(outcome, ("COMPLETED", None, ""))
    passed = outcome == "passed"
    out: list[dict[str, Any]] = []
    t = start
    before = 0.0
    timings: dict[str, float] = dict(steps)
    for phase, secs in seq:
        e = {"v": 1, "kind": ev.TRIAL_STATE, "ts": round(t, 3), "task": task, "index": index, "phase": phase,
             "seconds": before, "worker": worker}  # fmt: skip
        if not old:
            e["attempt"] = attempt
        out.append(e)
        timings[{"provisioning": "provision"}.get(phase, phase)] = secs
        t += secs
        before = secs
    timings.pop("record", None)
    status = {"COMPLETED": "passed" if passed else "failed", "INTERRUPTED": "interrupted"}.get(term, "error")
    verdict = {
        "v": 1, "kind": ev.TRIAL_ATTEMPT if retried else ev.TRIAL_FINISHED, "ts": round(t, 3), "task": task,
        "index": index, "status": status, "termination_reason": term,
        "retryable": term in ("INTERRUPTED", "ORACLE_TIMEOUT"), "binary_pass": passed,
        "score": 1.0 if passed else 0.0, "error_stage": stage, "reasons": [reason] if reason else [],
        "timings": {**timings, "total": round(t - start, 3)},
    }  # fmt: skip
    if not old:
        verdict["attempt"] = attempt
    out.append(verdict)
    if stack and not old:
        out.append({"v": 1, "kind": ev.TRIAL_STATE, "ts": round(t, 3), "task": task, "index": index,
                    "phase": "teardown", "seconds": 0.05, "worker": worker, "attempt": attempt})  # fmt: skip
        t += teardown
        out.append({"v": 1, "kind": ev.TRIAL_TORN_DOWN, "ts": round(t, 3), "task": task, "index": index,
                    "attempt": attempt, "seconds": teardown, "error": None})  # fmt: skip
    return out


def synthetic_run(n: int, workers: int = 4, seed: int = 7) -> list[dict[str, Any]]:
    """``n`` trials over three tasks on ``workers`` workers: ~8% graded failures, ~3% provisioning errors,
    ~2% oracle errors, ~2% an oracle timeout retried once (then passing); interrupted at 60% and resumed
    ten minutes later (the interrupted trials run again)."""
    rng = random.Random(seed)
    tasks = ["read_widget", "update_order", "cache_debug"]
    plan = [(tasks[i % 3], i // 3) for i in range(n)]
    events = [ev_started(plan, workers=workers)]
    free = [T0 + 0.2] * workers
    attempts: dict[tuple[str, int], int] = {}
    cut = int(n * 0.6)

    def one(key: tuple[str, int], outcome: str, retried: bool = False) -> None:
        w = min(range(workers), key=lambda i: free[i])
        attempts[key] = attempts.get(key, 0) + 1
        evs = trial_events(
            key[0], key[1], free[w], str(w), outcome=outcome, attempt=attempts[key], retried=retried,
            oracle=rng.uniform(1.0, 6.0), grading=rng.uniform(0.2, 0.8), teardown=rng.uniform(0.6, 1.4),
        )  # fmt: skip
        events.extend(evs)
        free[w] = evs[-1]["ts"] + 0.05

    def run(key: tuple[str, int]) -> None:
        r = rng.random()
        if r < 0.02:
            one(key, "oracle_timeout", retried=True)
            one(key, "passed")
        else:
            one(
                key,
                "failed"
                if r < 0.10
                else "provision_error"
                if r < 0.13
                else "oracle_error"
                if r < 0.15
                else "passed",
            )

    for key in plan[:cut]:
        run(key)
    cut_off = plan[cut : cut + workers]
    for key in cut_off:
        one(key, "interrupted")
    stop = max(free)
    events.append({"v": 1, "kind": ev.RUN_INTERRUPTED, "ts": stop})
    resume = stop + 600.0
    origin = events[0]["origin"]
    events.append({"v": 1, "kind": ev.RUN_RESUMED, "ts": resume, "pending": [], "origin": origin})
    free = [resume + 0.2] * workers
    for key in cut_off + plan[cut + workers :]:
        run(key)
    events.append({"v": 1, "kind": ev.RUN_FINISHED, "ts": max(free)})
    return events


def write_log(run_dir: Path, events: Iterable[Mapping[str, Any]]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / ev.EVENTS_FILE
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path
