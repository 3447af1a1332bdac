"""``forge grade RUN_DIR``: the run directory's re-grading (``forgelib.grading.regrade``), as a command:
find the run's project from its event log, re-grade, print the table (or the JSON summary)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from forgelib.errors import EXIT_OK, EXIT_USER, ForgeError, UsageError
from forgelib.grading.regrade import regrade_run
from forgelib.run import events as ev
from forgelib.spec.loader import load_project_config
from forgelib.table import align


def main_grade(run_dir: str, project: str | None = None, as_json: bool = False) -> int:
    if not run_dir:
        raise UsageError("give the run directory: forge grade RUN_DIR (e.g. PACK/runs/<run_id>)")
    path = Path(run_dir)
    events = path / ev.EVENTS_FILE
    if not events.is_file():
        raise ForgeError(
            f"{path} is not a forge run directory ({ev.EVENTS_FILE} is missing); "
            "give the directory `forge run` printed, e.g. PACK/runs/<run_id>"
        )
    state = ev.fold(ev.read_events(events))
    source = project or str(state.started.get("project") or "")
    if not source:
        raise ForgeError(f"{events} does not name the run's project; give it with --project")
    summary, rows = regrade_run(path, load_project_config(source))
    if as_json:
        print(summary.read_text(encoding="utf-8"), end="")
    else:
        table = [["task", "idx", "recorded", "now", "note"]]
        for r in rows:
            now_ = _verdict(r.after) if r.after is not None else "-"
            table.append([r.task, str(r.index), _verdict(r.before), now_, r.note])
        print("\n".join(align(table, ragged_last=True)))
        print(f"regrade: {summary}")
    return EXIT_OK if rows and all(r.passed for r in rows) else EXIT_USER


def _verdict(v: Mapping[str, Any]) -> str:
    score = v.get("score")
    shown = f" {float(score):.2f}" if isinstance(score, int | float) else ""
    return f"{v.get('status')}{shown}"
