"""``forge report``: the run as one self-contained HTML page (``page.html`` with the report's data inlined).

No network and no external assets: the styles and the script are in the template, the data is a JSON
block inside the page, and the page's Content-Security-Policy forbids fetching anything. Links to the
trials' result files are relative, so the run directory can be moved or archived with its report.

The page reads without JavaScript (a mail client, a CI artifact viewer): the header, the totals and the
results table, with every check of every trial and its result and reason, are HTML written here, every
value escaped. The script adds what needs drawing or clicking: the timeline, the stacks' and phases'
figures, the filters, a trial's tool calls.
"""

from __future__ import annotations

import json
import os
import re
import webbrowser
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from importlib.resources import files as package_files
from pathlib import Path
from typing import Any
from urllib.parse import quote

from forgelib.errors import EXIT_OK, ForgeError, UsageError
from forgelib.report.data import build
from forgelib.run.events import EVENTS_FILE, RunState, fold, read_events
from forgelib.run.results import trial_dir
from forgelib.run.setup import SETUP_FILE, SETUPS_DIR
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


_HTML_MARK = re.compile(r"<!--FORGE:(\w+)-->")
RESULTS = ("passed", "failed", "undecided")  # a check's result, in the order a trial's counts list them


def render(data: dict[str, Any]) -> str:
    template = package_files("forgelib.report").joinpath("page.html").read_text(encoding="utf-8")
    # Inside <script>, "</" could end the element early; "<\/" is the same JSON string.
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    parts = static_parts(data)
    head, tail = template.split(_DATA_MARK, 1)
    # Each mark is replaced in the template alone, once: nothing in a value (a task's name, a reason) is
    # ever read as a mark.
    return _HTML_MARK.sub(lambda m: parts[m.group(1)], head) + blob + tail


def static_parts(data: Mapping[str, Any]) -> dict[str, str]:
    """The page's HTML that needs no script, by the name of its mark in the template."""
    trials = data["trials"]
    return {
        "title": _e(f"forge run {data['run']['run_id']}"),
        "meta": _meta(data),
        "sessions": "".join(_session(s) for s in data["sessions"]),
        "cards": _cards(data),
        "shown": _e(f"{len(trials)} trial(s)"),
        "rows": "".join(_row(i, t) for i, t in enumerate(trials)),
    }


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _secs(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def _dur(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {round(s % 60)} s"
    return f"{int(s // 3600)} h {round((s % 3600) / 60)} min"


def _utc(ts: float | None) -> str:
    return "?" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _meta(data: Mapping[str, Any]) -> str:
    run = data["run"]
    settings = run.get("settings") or {}
    if run["completed"]:
        status = "finished"
    else:
        status = "interrupted" if run["interrupted"] else "not finished (killed, or still running)"
    solver = run.get("solver") or {}
    if solver.get("kind") == "command":
        solved = f"agent <code>{_e(solver.get('name'))}</code> ({_e(solver.get('where'))})"
    else:
        solved = "each task's oracle"
    line = f"{_e(status)} · {_e(data['totals']['trials'])} trial(s) planned"
    if settings.get("workers"):
        line += f" · {_e(settings['workers'])} worker(s)"
    if settings.get("repeats"):
        line += f" · {_e(settings['repeats'])} repeat(s)"
    out = (
        f"<div>project <code>{_e(run.get('project') or '?')}</code> · config "
        f"<code>{_e(run.get('config') or '?')}</code></div><div>{line} · solved by {solved}</div>"
    )
    out += "".join(_setup(task, rec) for task, rec in sorted((data.get("setups") or {}).items()))
    skipped = data.get("skipped_events") or {}
    if skipped.get("unreadable_lines") or skipped.get("unknown_kinds"):
        out += f"<div class='warn'>skipped events this version cannot read: {_e(json.dumps(skipped))}</div>"
    return out


def _setup(task: str, rec: Mapping[str, Any]) -> str:
    """A task's setup step (run once for its trials): how it ended, each step's time, its files."""
    steps = ", ".join(f"{_e(k)} {_secs(float(v))} s" for k, v in (rec.get("timings") or {}).items())
    if rec.get("ok"):
        verdict = f"checkpoint <code>{_e(rec.get('checkpoint'))}</code>"
    else:
        verdict = f"<b class='error'>failed</b>: {_e(rec.get('error') or '?')}"
    where = f"{SETUPS_DIR}/{quote(task)}/"
    links = " ".join(
        f"<a href='{where}{name}'>{name}</a>" for name in (SETUP_FILE, "setup.stdout", "setup.stderr")
    )
    return (
        f"<div>setup of task <code>{_e(task)}</code>: {verdict} · {_secs(rec.get('seconds'))} s ({steps}) · "
        f"{links}</div>"
    )


def _session(s: Mapping[str, Any]) -> str:
    o = s.get("origin") or {}
    if o.get("host"):
        where = (
            f" on <b>{_e(o['host'])}</b> (forgelib {_e(o.get('forgelib') or '?')}, Python "
            f"{_e(o.get('python') or '?')}, {_e(o.get('platform') or '?')})"
        )
    else:
        where = " <span class='muted'>(machine not recorded)</span>"
    if s.get("end"):
        end = f"{_e(s['end'])} {_utc(s.get('ended'))}"
    else:
        end = f"no end recorded (last event {_utc(s.get('last'))})"
    stop = s.get("ended") or s.get("last")
    took = f" · {_dur(stop - s['started'])}" if s.get("started") is not None and stop else ""
    return f"<li>{_e(s['kind'])} {_utc(s.get('started'))}{where} — {end}{took}</li>"


def _card(label: str, value: Any, cls: str = "") -> str:
    return f"<div class='card {cls}'><b>{_e(value)}</b>{_e(label)}</div>"


def _cards(data: Mapping[str, Any]) -> str:
    totals, trials = data["totals"], data["trials"]
    out = [
        _card("trials", totals["trials"]),
        _card("passed", totals["passed"], "passed"),
        _card("failed (graded)", sum(t["status"] == "failed" for t in trials), "failed"),
        _card("errors", sum(t["status"] == "error" for t in trials), "error"),
    ]
    out += [_card(f"error at {stage}", n, "error") for stage, n in totals["errors_by_stage"].items()]
    if totals["not_finished"]:
        out.append(_card("not finished", totals["not_finished"], "interrupted"))
    out += [
        _card("attempts", totals["attempts"]),
        _card("retried / resumed trials", totals["retried"]),
        _card("resumes", data["run"]["resumes"]),
    ]
    counts = _counts([c for t in trials for c in t["checks"]])
    out += [_card(f"checks {r}", n, r) for r, n in counts.items() if n]
    return "".join(out)


def _counts(checks: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(RESULTS, 0)
    for c in checks:
        counts[str(c.get("result"))] = counts.get(str(c.get("result")), 0) + 1
    return counts


def _row(i: int, t: Mapping[str, Any]) -> str:
    """A trial's row, as the script's filters and selection find it (``data-trial`` is its index)."""
    score = "-" if t["score"] is None else f"{float(t['score']):.2f}"
    worker = "-" if t["worker"] is None else f"w{_e(t['worker'])}"
    cells = [
        f"<td class='mono'>{_e(t['key'])}</td>",
        f"<td><span class='badge {_e(t['status'])}'>{_e(t['status'])}</span></td>",
        f"<td class='num'>{score}</td>",
        f"<td>{_e(t['termination'] or '-')}</td>",
        f"<td>{_e(t['stage'] or '-')}</td>",
        f"<td class='num'>{_e(t['attempts'])}</td>",
        f"<td>{worker}</td>",
        f"<td class='num'>{_secs(t['total'])}</td>",
        f"<td class='reason'>{_reasons(t)}</td>",
        f"<td class='checks'>{_checks(t['checks'])}</td>",
        f"<td class='solver'>{_solver(i, t)}</td>",
        f"<td class='files'>{_files(t)}</td>",
    ]
    return (
        f"<tr id='trial-{i}' data-trial='{i}' data-status='{_e(t['status'])}'>" + "".join(cells) + "</tr>\n"
    )


def _reasons(t: Mapping[str, Any]) -> str:
    reasons = t["reasons"]
    if len(reasons) <= 1:
        out = _e(reasons[0] if reasons else "")
    else:
        rest = "".join(f"<div>{_e(r)}</div>" for r in reasons[1:])
        out = f"<details><summary>{_e(reasons[0])}</summary>{rest}</details>"
    for a in t["earlier"]:  # retried attempts: what each ended with
        why = f" — {_e(a['reason'])}" if a.get("reason") else ""
        out += (
            f"<div class='muted'>attempt {_e(a.get('attempt'))}: {_e(a.get('termination_reason'))}{why}</div>"
        )
    return out


def _checks(checks: Sequence[Mapping[str, Any]]) -> str:
    """Every check with its result and, unless it passed, why: an undecided one says so, never failed."""
    if not checks:
        return "<span class='muted'>none recorded</span>"
    counts = _counts(checks)
    head = " · ".join(f"{n} {r}" for r, n in counts.items() if n)
    items = []
    for c in checks:
        result = str(c.get("result"))
        what = f"{c.get('type')}{' gate' if c.get('kind') == 'gate' else ''}"
        why = f"<div class='why'>{_e(c['reason'])}</div>" if c.get("reason") else ""
        items.append(
            f"<li class='check' data-check='{_e(c.get('name'))}' data-result='{_e(result)}'>"
            f"<span class='badge {_e(result)}'>{_e(result)}</span> <code>{_e(c.get('name'))}</code> "
            f"<span class='muted'>{_e(what)}</span>{why}</li>"
        )
    return f"<div class='muted'>{_e(head)}</div><ul class='checklist'>{''.join(items)}</ul>"


def _solver(i: int, t: Mapping[str, Any]) -> str:
    """A trial's tool calls (drawn by the script when opened) and the end of each output stream."""
    outputs = t.get("output") or {}
    if t.get("calls_error"):
        return f"<span class='warn'>trace unreadable: {_e(t['calls_error'])}</span>"
    if not t["calls_total"] and not outputs:
        return "-"
    label = f"{t['calls_total']} tool call(s)" if t["calls_total"] else "no tool calls"
    label += " · output" if outputs else ""
    streams = "".join(
        f"<div class='muted'>{_e(n)} (end)</div><pre>{_e(text)}</pre>" for n, text in outputs.items()
    )
    calls = "<div class='calls'></div>"
    return f"<details data-trial='{i}'><summary>{_e(label)}</summary>{calls}{streams}</details>"


def _files(t: Mapping[str, Any]) -> str:
    # The same characters JavaScript's encodeURI leaves alone.
    links = (quote(f"{t['dir']}/{f}", safe=";,/?:@&=+$!*'()#") for f in t["files"])
    return "".join(f"<a href='{_e(u)}'>{_e(f)}</a>" for u, f in zip(links, t["files"], strict=True))


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
