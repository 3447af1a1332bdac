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
    outcome: str = "passed",  # passed | failed | provision_error | oracle_error | interrupted
) -> list[dict[str, Any]]:
    """The events of one attempt, as the executor writes them (phase starts, then trial_finished)."""
    steps = dict(steps or {"compose_config": 0.3, "up_seeded": 2.0, "recipe:app-db": 0.7, "up_rest": 0.5})
    provision = sum(steps.values()) + 0.1
    out: list[dict[str, Any]] = []
    t = start

    def state(phase: str, seconds: float) -> None:
        out.append({"v": 1, "kind": ev.TRIAL_STATE, "ts": round(t, 3), "task": task, "index": index,
                    "phase": phase, "seconds": seconds, "worker": worker})  # fmt: skip

    state("provisioning", 0.0)
    timings: dict[str, float] = {}
    term, passed, score, reasons, stage = "COMPLETED", True, 1.0, [], None
    if outcome == "provision_error":
        timings.update({"compose_config": 0.3, "up_seeded": 2.0, "recipe:app-db": 0.4, "provision": 2.8})
        t += 2.8
        term, passed, score, stage = "PROVISION_ERROR", False, 0.0, "reset_recipe"
        reasons = ["Provisioning failed at reset_recipe: psql: ERROR: relation widgets does not exist"]
    else:
        timings.update(steps)
        timings["provision"] = provision
        t += provision
        state("oracle", provision)
        if outcome == "interrupted":
            t += oracle / 2
            timings["oracle"] = oracle / 2
            state("teardown", oracle / 2)
            term, passed, score, reasons = (
                "INTERRUPTED",
                False,
                0.0,
                ["interrupted before the trial finished"],
            )
        elif outcome == "oracle_error":
            t += oracle
            timings["oracle"] = oracle
            state("capture_logs", oracle)
            t += 0.2
            timings["capture_logs"] = 0.2
            state("teardown", 0.2)
            term, passed, score, stage = "ORACLE_ERROR", False, 0.0, "oracle"
            reasons = ["oracle exited 1: Traceback ... KeyError: 'widget'"]
        else:
            t += oracle
            timings["oracle"] = oracle
            state("grading", oracle)
            t += grading
            timings["grading"] = grading
            if outcome == "failed":
                state("capture_logs", grading)
                t += 0.2
                timings["capture_logs"] = 0.2
                passed, score = False, 0.0
                reasons = ["submission_reads_baseline: expected 'baseline', observed 'factory_default'"]
            state("teardown", 0.2 if outcome == "failed" else grading)
        t += teardown  # every attempt that got a stack tears it down, interrupted ones too
        timings["teardown"] = teardown
    status = {"COMPLETED": "passed" if passed else "failed", "INTERRUPTED": "interrupted"}.get(term, "error")
    out.append({
        "v": 1, "kind": ev.TRIAL_FINISHED, "ts": round(t, 3), "task": task, "index": index, "status": status,
        "termination_reason": term, "retryable": term == "INTERRUPTED", "binary_pass": passed, "score": score,
        "error_stage": stage, "reasons": reasons, "timings": {**timings, "total": round(t - start, 3)},
    })  # fmt: skip
    return out


def synthetic_run(n: int, workers: int = 4, seed: int = 7) -> list[dict[str, Any]]:
    """``n`` trials over three tasks on ``workers`` workers: ~8% graded failures, ~3% provisioning errors,
    ~2% oracle errors; interrupted at 60% and resumed (the interrupted trials run again)."""
    rng = random.Random(seed)
    tasks = ["read_widget", "update_order", "cache_debug"]
    plan = [(tasks[i % 3], i // 3) for i in range(n)]
    events = [ev_started(plan, workers=workers)]
    free = [T0 + 0.2] * workers
    cut = int(n * 0.6)

    def one(key: tuple[str, int], outcome: str) -> None:
        w = min(range(workers), key=lambda i: free[i])
        evs = trial_events(
            key[0], key[1], free[w], str(w), outcome=outcome,
            oracle=rng.uniform(1.0, 6.0), grading=rng.uniform(0.2, 0.8), teardown=rng.uniform(0.6, 1.4),
        )  # fmt: skip
        events.extend(evs)
        free[w] = evs[-1]["ts"] + 0.05

    def outcome() -> str:
        r = rng.random()
        return (
            "failed"
            if r < 0.08
            else "provision_error"
            if r < 0.11
            else "oracle_error"
            if r < 0.13
            else "passed"
        )

    for key in plan[:cut]:
        one(key, outcome())
    cut_off = plan[cut : cut + workers]
    for key in cut_off:
        one(key, "interrupted")
    stop = max(free)
    events.append({"v": 1, "kind": ev.RUN_INTERRUPTED, "ts": stop})
    resume = stop + 600.0  # ten minutes later
    events.append(
        {"v": 1, "kind": ev.RUN_RESUMED, "ts": resume, "pending": [], "origin": events[0]["origin"]}
    )
    free = [resume + 0.2] * workers
    for key in cut_off + plan[cut + workers :]:
        one(key, outcome())
    events.append({"v": 1, "kind": ev.RUN_FINISHED, "ts": max(free)})
    return events


def write_log(run_dir: Path, events: Iterable[Mapping[str, Any]]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / ev.EVENTS_FILE
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path
