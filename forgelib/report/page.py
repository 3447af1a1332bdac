"""``forge report``: the run as one self-contained HTML page (``page.html`` with the report's data inlined).

No network and no external assets: the styles and the script are in the template, the data is a JSON
block inside the page, and the page's Content-Security-Policy forbids fetching anything. Links to the
trials' result files are relative, so the run directory can be moved or archived with its report.
"""

from __future__ import annotations

import json
import os
import webbrowser
from importlib.resources import files as package_files
from pathlib import Path
from typing import Any

from forgelib.errors import EXIT_OK, ForgeError, UsageError
from forgelib.report.data import build
from forgelib.run.events import EVENTS_FILE, RunState, fold, read_events
from forgelib.run.results import trial_dir

REPORT_FILE = "report.html"
_DATA_MARK = "/*FORGE_REPORT_DATA*/null"
# The result files a trial may have, in the order the table lists them.
_TRIAL_FILES = ("trial.yaml", "grade.yaml", "metrics.yaml", "oracle.stdout", "oracle.stderr")


def render(data: dict[str, Any]) -> str:
    template = package_files("forgelib.report").joinpath("page.html").read_text(encoding="utf-8")
    # Inside <script>, "</" could end the element early; "<\/" is the same JSON string.
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return template.replace(_DATA_MARK, blob, 1)


def write_report(run_dir: Path, state: RunState | None = None, output: Path | None = None) -> Path:
    """Write the report of the run in ``run_dir`` (default: ``run_dir/report.html``); returns its path."""
    state = state if state is not None else load(run_dir)
    out = output if output is not None else run_dir / REPORT_FILE
    base = os.path.relpath(run_dir.resolve(), out.resolve().parent)

    def files(task: str, index: int) -> tuple[str, list[str]]:
        d = trial_dir(run_dir, task, index)
        found = [n for n in _TRIAL_FILES if (d / n).is_file()]
        services = d / "services"
        if services.is_dir():
            found += sorted(f"services/{p.name}" for p in services.iterdir() if p.is_file())
        # Earlier attempts (retried, or cut off by a kill) keep their files under attempts/<n>/.
        attempts = d / "attempts"
        if attempts.is_dir():
            for n in sorted((p.name for p in attempts.iterdir() if p.is_dir()), key=_number):
                found += [
                    f"attempts/{n}/{f}" for f in ("trial.yaml", "grade.yaml") if (attempts / n / f).is_file()
                ]
        return (Path(base) / "trials" / task / str(index)).as_posix(), found

    html = render(build(state, files))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)
    return out


def _number(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def load(run_dir: Path) -> RunState:
    path = run_dir / EVENTS_FILE
    if not path.is_file():
        raise ForgeError(
            f"{run_dir} is not a forge run directory ({EVENTS_FILE} is missing); "
            "give the directory `forge run` printed, e.g. PACK/runs/<run_id>"
        )
    state = fold(read_events(path))
    if state.run_id is None:
        raise ForgeError(f"{path} does not start with a run_started event; it is not a forge run log")
    return state


def main_report(run_dir: str, output: str | None = None, open_browser: bool = False) -> int:
    if not run_dir:
        raise UsageError("give the run directory: forge report RUN_DIR (e.g. PACK/runs/<run_id>)")
    out = write_report(Path(run_dir), output=Path(output) if output else None)
    print(out)
    if open_browser:
        webbrowser.open(out.resolve().as_uri())
    return EXIT_OK
