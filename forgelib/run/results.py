"""Result files: per trial ``trial.yaml``, ``grade.yaml``, ``metrics.yaml``; per run ``summary.json`` and
JUnit XML. Each file is written to a temporary name and renamed, so a killed run never leaves half a file.

    <output>/<run_id>/events.jsonl
    <output>/<run_id>/summary.json
    <output>/<run_id>/trials/<task>/<idx>/{trial,grade,metrics}.yaml, services/<svc>.log
    <output>/<run_id>/trials/<task>/<idx>/attempts/<n>/...   an earlier attempt, retried (same files)
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from forgelib.grading.gradedoc import atomic_write, check_of, grade_doc, write_yaml
from forgelib.grading.score import CheckOutcome, Grade
from forgelib.run.events import RunState, TrialRecord
from forgelib.run.lifecycle import Termination, error_stage, is_retryable, status_of


@dataclass
class TrialResult:
    """Everything the orchestrator learned about one trial; the files and the trial_finished event."""

    run_id: str
    task: str
    index: int
    termination: Termination
    grade: Grade
    started_at: float
    finished_at: float
    timings: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    compose_project: str | None = None
    ports: dict[str, list[str]] = field(default_factory=dict)  # service -> "127.0.0.1:49153->5432/tcp"
    stack: dict[str, Any] = field(default_factory=dict)  # mode, name, reuse, replaced (Stack.source)
    provision_stage: str | None = None  # ProvisionError.stage
    error: str | None = None  # the one-line reason the attempt broke
    oracle: dict[str, Any] | None = None  # rc, timed_out, seconds (the oracle solved it)
    solver: dict[str, Any] | None = None  # kind (oracle|command), name, where, rc, timed_out, seconds, tools
    teardown_error: str | None = None
    log_capture_error: str | None = None
    bare_seeds: dict[str, dict[str, str]] = field(default_factory=dict)  # service -> SeedMount.record()
    attempt: int = 1  # 1-based
    retried: bool = False  # this attempt ended retryably and another one follows
    earlier_attempts: tuple[dict[str, Any], ...] = ()  # attempt_summary() of each retried attempt
    snapshots: dict[str, Any] = field(default_factory=dict)  # service -> what its golden did
    node: dict[str, str] | None = None  # the cluster node that ran it (id, host, engine); None: this host
    ready: dict[str, float] = field(
        default_factory=dict
    )  # time to ready and what it waited on (run/ready.py)

    @property
    def status(self) -> str:
        return status_of(self.termination, self.grade.binary_pass)

    @property
    def retryable(self) -> bool:
        return is_retryable(self.termination)

    @property
    def error_stage(self) -> str | None:
        return error_stage(self.termination, self.provision_stage)

    @property
    def wall_seconds(self) -> float:
        return round(self.finished_at - self.started_at, 3)

    def event_fields(self) -> dict[str, Any]:
        """The ``trial_finished`` event's fields (what the fold needs, no more)."""
        return {
            "task": self.task,
            "index": self.index,
            "status": self.status,
            "termination_reason": self.termination.value,
            "retryable": self.retryable,
            "binary_pass": self.grade.binary_pass,
            "score": self.grade.score,
            "error_stage": self.error_stage,
            "reasons": list(self.grade.reasons),
            "checks": [check_line(c) for c in self.grade.checks],
            "timings": {**self.timings, "total": self.wall_seconds},
            "attempt": self.attempt,
            **({"node": self.node["id"]} if self.node else {}),
            **({"ready": self.ready} if self.ready else {}),
        }

    def attempt_summary(self) -> dict[str, Any]:
        """What a later attempt's trial.yaml (and the report) says about this one, once it was retried."""
        return {
            "attempt": self.attempt,
            "termination_reason": self.termination.value,
            "error_stage": self.error_stage,
            "reason": (self.grade.reasons or (self.error or "",))[0],
            "dir": f"{ATTEMPTS_DIR}/{self.attempt}",
        }


ATTEMPTS_DIR = "attempts"


def trial_dir(run_dir: Path, task: str, index: int) -> Path:
    return run_dir / "trials" / task / str(index)


def shelve_attempt(d: Path, attempt: int | None = None) -> int:
    """Move an attempt's files out of the trial directory ``d`` into ``d/attempts/<attempt>/`` (default:
    the next free number) so the next attempt starts clean and nothing of the earlier one is lost.
    Returns the number the next attempt gets."""
    shelf = d / ATTEMPTS_DIR
    taken = (
        [int(c.name) for c in shelf.iterdir() if re.fullmatch(r"[0-9]+", c.name)] if shelf.is_dir() else []
    )
    n = attempt if attempt is not None else max(taken, default=0) + 1
    files = [c for c in d.iterdir() if c.name != ATTEMPTS_DIR] if d.is_dir() else []
    if not files:
        return max([*taken, n - 1]) + 1
    dest = shelf / str(n)
    dest.mkdir(parents=True, exist_ok=False)
    for c in files:
        c.replace(dest / c.name)
    return max([*taken, n]) + 1


def trial_doc(r: TrialResult) -> dict[str, Any]:
    return {
        "run_id": r.run_id,
        "task": r.task,
        "index": r.index,
        "compose_project": r.compose_project,
        "ports": r.ports,
        "bare_seeds": r.bare_seeds,
        "stack": r.stack,
        "status": r.status,
        "termination_reason": r.termination.value,
        "retryable": r.retryable,
        "error": {"stage": r.error_stage, "reason": r.error} if r.error else None,
        "started_at": _iso(r.started_at),
        "finished_at": _iso(r.finished_at),
        "wall_seconds": r.wall_seconds,
        "timings": {k: round(v, 3) for k, v in r.timings.items()},
        **({"ready": r.ready} if r.ready else {}),
        "solver": r.solver,
        "oracle": r.oracle,
        "log_capture_error": r.log_capture_error,
        "teardown_error": r.teardown_error,
        "attempt": r.attempt,
        "retried": r.retried,
        "earlier_attempts": list(r.earlier_attempts),
        **({"snapshots": r.snapshots} if r.snapshots else {}),
        **({"node": r.node} if r.node else {}),
    }


def check_line(c: CheckOutcome) -> dict[str, Any]:
    """A check in the ``trial_finished`` event (so in summary.json and the report): what it was, how it
    ended, and why."""
    kind = "gate" if c.gate else "check"
    return {
        "name": c.name,
        "kind": kind,
        "type": c.type,
        "weight": c.weight,
        "result": c.result,
        "reason": c.why(),
    }


def metrics_doc(r: TrialResult) -> dict[str, Any]:
    checks = r.grade.checks
    return {
        "wall_seconds": r.wall_seconds,
        "stack_mode": r.stack.get("mode"),
        "stack_reuse": r.stack.get("reuse"),
        "phase_seconds": {k: round(v, 3) for k, v in r.timings.items()},
        "checks_total": len(checks),
        "checks_passed": sum(c.passed for c in checks),
        "checks_undecided": sum(not c.decided for c in checks),
        "gates_failed": sum(c.gate and c.decided and not c.passed for c in checks),
        "weight_total": sum(c.weight for c in checks),
        "weight_passed": sum(c.weight for c in checks if c.passed),
        "score": r.grade.score,
        "oracle_rc": (r.oracle or {}).get("rc"),
        "oracle_seconds": (r.oracle or {}).get("seconds"),
        "solver_kind": (r.solver or {}).get("kind"),
        "solver_rc": (r.solver or {}).get("rc"),
        "solver_seconds": (r.solver or {}).get("seconds"),
    }


def write_trial(d: Path, r: TrialResult) -> Path:
    """The attempt's files in its trial directory ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    write_yaml(d / "trial.yaml", trial_doc(r))
    write_yaml(d / "grade.yaml", grade_doc(r.grade))
    write_yaml(d / "metrics.yaml", metrics_doc(r))
    return d


@dataclass(frozen=True)
class RecordedTrial:
    """A trial as its directory tells it (``trial.yaml`` + ``grade.yaml``), for whatever reads a finished
    run from disk (the benchmarks): the keys ``trial_doc``/``grade_doc`` write, read in this one place."""

    task: str
    index: int
    status: str
    binary_pass: bool
    wall_seconds: float
    timings: Mapping[str, float]  # phase -> seconds
    compose_project: str | None
    stack: Mapping[str, Any]  # mode, name, reuse, replaced
    snapshots: Mapping[str, Any]  # service -> what its golden did
    checks: tuple[CheckOutcome, ...]


def read_trial(d: Path) -> RecordedTrial:
    """The latest attempt's files in trial directory ``d``."""
    t = yaml.safe_load((d / "trial.yaml").read_text())
    g = yaml.safe_load((d / "grade.yaml").read_text())
    return RecordedTrial(
        task=str(t["task"]),
        index=int(t["index"]),
        status=str(t["status"]),
        binary_pass=bool(g["binary_pass"]),
        wall_seconds=float(t["wall_seconds"]),
        timings={k: float(v) for k, v in t["timings"].items()},
        compose_project=t["compose_project"],
        stack=dict(t["stack"]),
        snapshots=dict(t.get("snapshots") or {}),  # written only when a golden did something
        checks=tuple(check_of(c) for c in g["checks"]),
    )


def read_trials(run_dir: Path) -> list[RecordedTrial]:
    """Every trial of the run at ``run_dir`` that has files, by task then index."""
    found = [read_trial(p.parent) for p in run_dir.glob("trials/*/*/trial.yaml")]
    return sorted(found, key=lambda r: (r.task, r.index))


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> Path:
    path = run_dir / "summary.json"
    atomic_write(path, json.dumps(summary, indent=2) + "\n")
    return path


def write_junit(path: Path, state: RunState) -> Path:
    """One testcase per trial: failure (graded red), error (no grade), skipped (not finished)."""
    recs = state.records()
    suite = ET.Element(
        "testsuite",
        name=f"forge run {state.run_id}",
        tests=str(len(recs)),
        failures=str(sum(r.status == "failed" for r in recs)),
        errors=str(sum(r.status == "error" for r in recs)),
        skipped=str(sum(not r.finished for r in recs)),
        time=f"{sum(r.timings.get('total', 0.0) for r in recs):.3f}",
    )
    for r in recs:
        case = ET.SubElement(
            suite, "testcase", classname=r.task, name=f"{r.task}[{r.index}]", time=_case_time(r)
        )
        text = "\n".join(r.reasons)
        first = r.reasons[0] if r.reasons else r.status
        if r.status == "failed":
            ET.SubElement(case, "failure", message=first, type="grade").text = text
        elif r.status == "error":
            kind = r.termination.value if r.termination else "error"
            ET.SubElement(case, "error", message=first, type=kind).text = text
        elif not r.finished:
            ET.SubElement(case, "skipped", message=f"trial did not finish ({r.status})")
        _reruns(case, r)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")
    return path


def _reruns(case: ET.Element, r: TrialRecord) -> None:
    """Retried attempts as Maven Surefire records reruns: flaky* in a case that passed in the end, rerun*
    in one that did not (CI systems that know the convention show them as reruns, not as failures)."""
    prefix = "flaky" if r.status == "passed" else "rerun"
    for a in r.earlier:
        term = str(a.get("termination_reason"))
        kind = "Failure" if term == "COMPLETED" else "Error"
        el = ET.SubElement(case, f"{prefix}{kind}", message=str(a.get("reason") or term), type=term)
        el.text = f"attempt {a.get('attempt')} ({a.get('dir')}): {term}: {a.get('reason') or ''}"


def _case_time(r: TrialRecord) -> str:
    return f"{r.timings.get('total', 0.0):.3f}"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
