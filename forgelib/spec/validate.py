"""``forge validate``: every spec file of a project (project, tasks, grading files, run configs) checked in
one pass; a one-line summary when all is well, every problem otherwise."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from forgelib.errors import SpecError, SpecIssue
from forgelib.spec.loader import collect_project, collect_run_config, project_file
from forgelib.spec.yamlpos import display_path


@dataclass
class Report:
    project: str
    name: str | None = None
    seeds: int = 0
    tasks: int = 0
    run_configs: int = 0
    errors: list[SpecIssue] = field(default_factory=list)
    notices: list[SpecIssue] = field(default_factory=list)  # warnings and notes: reported, never failing

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "project": self.project,
            "name": self.name,
            "seeds": self.seeds,
            "tasks": self.tasks,
            "run_configs": self.run_configs,
            "errors": [_issue_json(i) for i in self.errors],
            "warnings": [_issue_json(i) for i in self.notices if i.severity == "warning"],
            "notes": [_issue_json(i) for i in self.notices if i.severity == "note"],
        }

    def summary(self) -> str:
        def n(count: int, what: str) -> str:
            return f"{count} {what}{'' if count == 1 else 's'}"

        return (
            f"OK: project {self.name!r} ({self.project}): {n(self.seeds, 'seed')} (digests verified), "
            f"{n(self.tasks, 'task')}, {n(self.run_configs, 'run config')}"
        )


def validate_project(project: str) -> Report:
    """Validate everything under ``project`` (a directory or its project.yaml)."""
    try:
        pfile = project_file(project)
    except SpecError as e:
        return Report(project=project, errors=list(e.issues))
    result = collect_project(pfile)
    report = Report(project=display_path(pfile.parent) or ".", errors=list(result.issues))
    if result.doc is not None and isinstance(result.doc.data, dict):
        report.name = result.doc.data.get("name")
    report.seeds = len(result.seeds)
    report.tasks = len(result.task_files)
    report.run_configs = len(result.run_config_files)
    report.notices = list(result.notices)
    for path in result.run_config_files:
        # Task names in a run config are checked only against a project that loaded.
        _, issues = collect_run_config(path, result.project)
        report.errors.extend(issues)
    return report


def main_validate(project: str, as_json: bool) -> int:
    """``forge validate``: exit 0 when every file is valid, 1 otherwise (SpecError lists the problems)."""
    report = validate_project(project)
    if as_json:
        json.dump(report.as_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0 if report.ok else 1
    if not report.ok:
        print_notices(report.notices)
        raise SpecError(report.errors)
    print(report.summary())
    for line in notice_lines(report.notices):
        print(line)
    return 0


def notice_lines(notices: Sequence[SpecIssue]) -> list[str]:
    """Warnings first (they may need action), then notes (what forge changes in every trial's stack)."""
    order = sorted(notices, key=lambda i: i.severity != "warning")
    return [f"  {i}" for i in order]


def print_notices(notices: Sequence[SpecIssue], prefix: str = "") -> None:
    """To stderr (stdout stays the result): e.g. once at the start of a run."""
    for line in notice_lines(notices):
        print(f"{prefix}{line.strip()}", file=sys.stderr)


def _issue_json(i: SpecIssue) -> dict[str, Any]:
    return {"file": i.file, "line": i.line, "col": i.col, "path": i.json_path, "message": i.message}
