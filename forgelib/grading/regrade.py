"""``forge grade RUN_DIR``: score a finished run again under its tasks' rubrics as they are now, without
re-running anything (for when a rubric changed after the run).

What each kind of check is decided from, the stacks being gone:
- a trace check: the trial's ``trace.jsonl``, again (``run.tracecheck``);
- a state check (file/sql/redis/http): the observation the run recorded in ``grade.yaml``, matched with the
  check's matcher as it is now, when the new check asks for the same observation (``CheckOutcome.observes``:
  every field but the matcher). A check that asks for anything the run did not observe (a new path, query,
  service, expected status) cannot be decided: it is left out of the score and listed under ``undecided``;
- a judge: its recorded verdict (score and reason) by component name; none recorded: cannot be decided.

Nothing is overwritten: each re-graded trial gets ``regrades/<time>.yaml`` beside its ``grade.yaml`` (the
rubric's path and sha256, the time, the original grade's sha256, score and pass, and the new grade), and
the run gets ``regrades/<time>.json`` listing every trial's old and new verdict. Only trials whose attempt
was graded (COMPLETED) are re-graded; the others keep the error they ended with.

Exit 0 when every trial of the run passes under the new grades, 1 when any does not.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from forgelib.errors import ForgeError
from forgelib.grading.checks import observation_key, rematch
from forgelib.grading.gradedoc import check_of, grade_doc, write_yaml
from forgelib.grading.score import (
    CheckOutcome,
    ComponentResult,
    Grade,
    Verdict,
    grade_by,
    judge_component,
)
from forgelib.grading.traces import TRACE_FILE, Trace, decide, read_trace
from forgelib.spec.models import Check, Component, Grading, Project

REGRADES_DIR = "regrades"


@dataclass(frozen=True)
class Recorded:
    """What the original grading of a trial left in its ``grade.yaml``."""

    checks: tuple[CheckOutcome, ...] = ()
    details: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # component -> detail

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Recorded:
        checks = tuple(check_of(c) for c in doc.get("checks") or [])
        return cls(checks, dict(doc.get("details") or {}))


# ---------------------------------------------------------------------------------------- pure re-grading


def regrade(grading: Grading | None, recorded: Recorded, trace: Trace) -> Grade:
    """The grade ``grading`` gives a trial from its recorded observations and its trace (no I/O)."""

    def observe(checks: Sequence[Check]) -> list[CheckOutcome]:
        return [_decide(c, recorded, trace) for c in checks]

    def judge(c: Component) -> ComponentResult:
        d = recorded.details.get(c.name) or {}
        if d.get("kind") == "judge" and d.get("score") is not None:
            return judge_component(c.name, c.weight, Verdict(float(d["score"]), str(d.get("reason") or "")))
        why = f"cannot be decided: the run recorded no verdict of judge {c.name!r}"
        return ComponentResult(c.name, "judge", c.weight, None, reason=why)

    return grade_by(grading, observe, judge)


def _decide(check: Check, recorded: Recorded, trace: Trace) -> CheckOutcome:
    if check.type == "trace":
        return decide(check, trace)
    key = observation_key(check)
    same = [o for o in recorded.checks if o.observes == key and o.decided]
    if not same:
        why = (
            f"cannot be decided: the run recorded no observation of {key} "
            "(a state check cannot be observed again once the trial's stack is gone)"
        )
        return CheckOutcome(
            check.name, check.type, check.weight, check.gate, False, None, "a recorded observation", why,
            decided=False, observes=key,
        )  # fmt: skip
    pick = next((o for o in same if o.name == check.name), same[0])
    return rematch(check, pick.observed, pick.error)


# --------------------------------------------------------------------------------------------- a whole run


@dataclass(frozen=True)
class TrialRegrade:
    task: str
    index: int
    before: Mapping[str, Any]  # status, binary_pass, score (as recorded)
    after: Mapping[str, Any] | None  # the same under the new grade; None: not re-graded
    note: str = ""  # why not re-graded, or how many checks could not be decided
    file: str | None = None  # the new grade's file, relative to the run directory

    @property
    def passed(self) -> bool:
        return (
            bool(self.after["binary_pass"]) if self.after is not None else self.before["status"] == "passed"
        )


def sha256_file(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def regrade_run(
    run_dir: Path, project: Project, *, now: datetime | None = None
) -> tuple[Path, list[TrialRegrade]]:
    """Re-grade every finished trial of the run in ``run_dir``; returns the run's regrade file and rows."""
    when = now or datetime.now(UTC)
    stamp, summary_path = _claim(run_dir / REGRADES_DIR, when)
    rows: list[TrialRegrade] = []
    for trial_yaml in sorted(run_dir.glob("trials/*/*/trial.yaml")):
        rows.append(_one_trial(run_dir, trial_yaml.parent, project, stamp, when))
    rows.sort(key=lambda r: (r.task, r.index))
    doc = {
        "graded_at": _iso(when),
        "project": str(project.root),
        "rubrics": {t.name: _rubric(t.grading) for t in project.tasks},
        "trials": [
            {
                "task": r.task,
                "index": r.index,
                "before": dict(r.before),
                "after": r.after,
                "note": r.note,
                "file": r.file,
            }
            for r in rows
        ],
    }
    tmp = summary_path.with_name(f".{summary_path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    tmp.replace(summary_path)
    return summary_path, rows


def _claim(folder: Path, when: datetime) -> tuple[str, Path]:
    """A regrade name no earlier regrade of this run has (the run's summary file, created exclusively)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = when.strftime("%Y%m%dT%H%M%S.%fZ")  # sorts in time order
    for n in range(1, 1000):
        stamp = base if n == 1 else f"{base}-{n}"  # the same microsecond: not in practice
        path = folder / f"{stamp}.json"
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            continue
        return stamp, path
    raise ForgeError(f"{folder}: a thousand regrades named {base}; remove some")


def _one_trial(run_dir: Path, d: Path, project: Project, stamp: str, when: datetime) -> TrialRegrade:
    trial = yaml.safe_load((d / "trial.yaml").read_text(encoding="utf-8")) or {}
    grade_path = d / "grade.yaml"
    original = yaml.safe_load(grade_path.read_text(encoding="utf-8")) if grade_path.is_file() else {}
    task_name, index = str(trial.get("task", d.parent.name)), int(trial.get("index", d.name))
    before = {
        "status": trial.get("status"),
        "binary_pass": (original or {}).get("binary_pass"),
        "score": (original or {}).get("score"),
    }
    term = trial.get("termination_reason")
    if term != "COMPLETED" or not original:
        return TrialRegrade(task_name, index, before, None, f"not re-graded: its attempt ended {term}")
    task = next((t for t in project.tasks if t.name == task_name), None)
    if task is None:
        return TrialRegrade(task_name, index, before, None, "not re-graded: the project has no such task now")
    g = regrade(task.grading, Recorded.from_doc(original), read_trace(d / TRACE_FILE))
    out = d / REGRADES_DIR / f"{stamp}.yaml"
    out.parent.mkdir(exist_ok=True)
    write_yaml(
        out,
        {
            "graded_at": _iso(when),
            "rubric": _rubric(task.grading),
            "original": {"file": "grade.yaml", "sha256": sha256_file(grade_path), **before},
            "grade": grade_doc(g),
        },
    )
    after = {
        "status": "passed" if g.binary_pass else "failed",
        "binary_pass": g.binary_pass,
        "score": g.score,
    }
    note = f"{len(g.undecided)} undecided" if g.undecided else ""
    return TrialRegrade(task_name, index, before, after, note, out.relative_to(run_dir).as_posix())


def _rubric(grading: Grading | None) -> dict[str, Any] | None:
    if grading is None:
        return None
    return {"path": str(grading.path), "sha256": sha256_file(grading.path)}


def _iso(when: datetime) -> str:
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")
