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
from forgelib.runner import file_tail

REPORT_FILE = "report.html"
_DATA_MARK = "/*FORGE_REPORT_DATA*/null"
# The result files a trial may have, in the order the table lists them.
_TRIAL_FILES = (
    "trial.yaml", "grade.yaml", "metrics.yaml", "trace.jsonl", "agent.stdout", "agent.stderr",
    "oracle.stdout", "oracle.stderr", "instruction.txt", "manifest.json",
)  # fmt: skip
# What the page shows of a solver's output: the end of each stream (the whole file is linked).
OUTPUT_FILES = ("agent.stdout", "agent.stderr", "oracle.stdout", "oracle.stderr")
OUTPUT_TAIL = 2048  # bytes
CALLS_SHOWN = 500  # tool calls per trial on its timeline (the trace file has them all)
ARGS_SHOWN = 160  # characters of a call's arguments in its tooltip


def render(data: dict[str, Any]) -> str:
    template = package_files("forgelib.report").joinpath("page.html").read_text(encoding="utf-8")
    # Inside <script>, "</" could end the element early; "<\/" is the same JSON string.
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return template.replace(_DATA_MARK, blob, 1)


def write_report(run_dir: Path, state: RunState | None = None, output: Path | None = None) -> Path:
    """Write the report of the run in ``run_dir`` (default: ``run_dir/report.html``; an ``output`` that is
    a directory gets a ``report.html`` inside it); returns its path."""
    state = state if state is not None else load(run_dir)
    out = destination(run_dir, output)
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

    def details(task: str, index: int) -> dict[str, Any]:
        return solver_details(trial_dir(run_dir, task, index))

    html = render(build(state, files, details))
    out.parent.mkdir(parents=True, exist_ok=True)
    # Beside the page (the same file system, so the rename is atomic) and gone whatever happens.
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(html, encoding="utf-8")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def destination(run_dir: Path, output: Path | None) -> Path:
    """Where the page goes: ``run_dir/report.html``, ``output`` itself, or ``report.html`` inside
    ``output`` when that is a directory."""
    if output is None:
        return run_dir / REPORT_FILE
    return output / REPORT_FILE if output.is_dir() else output


def solver_details(d: Path) -> dict[str, Any]:
    """What the page shows of a trial's solver: its tool calls (trace.jsonl) as ``[seq, tool, started,
    ended, ok, arguments (cut), error (cut)]`` and the tail of each output stream it left."""
    from forgelib.mcp.trace import read_trace  # the trace's one reader (no SDK behind it)

    try:
        calls = read_trace(d / "trace.jsonl")
    except ValueError as e:  # a damaged trace is shown as such, never a failed report
        return {"calls": [], "calls_total": 0, "calls_error": str(e), "output": _tails(d)}
    shown = [
        [c.get("seq"), c.get("tool"), c.get("started"), c.get("ended"), bool(c.get("ok")),
         _cut(json.dumps(c.get("arguments"), ensure_ascii=False)), _cut(c.get("error") or "")]
        for c in calls[:CALLS_SHOWN]
    ]  # fmt: skip
    return {"calls": shown, "calls_total": len(calls), "output": _tails(d)}


def _tails(d: Path) -> dict[str, str]:
    out = {}
    for name in OUTPUT_FILES:
        path = d / name
        if path.is_file() and path.stat().st_size:
            out[name] = file_tail(path, OUTPUT_TAIL)
    return out


def _cut(text: str) -> str:
    return text if len(text) <= ARGS_SHOWN else text[: ARGS_SHOWN - 1] + "…"


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
    # Path() drops a trailing slash, which says "a directory" even before it exists.
    target = None if not output else Path(output) / REPORT_FILE if output.endswith(os.sep) else Path(output)
    out = write_report(Path(run_dir), output=target)
    print(out)
    if open_browser:
        webbrowser.open(out.resolve().as_uri())
    return EXIT_OK
