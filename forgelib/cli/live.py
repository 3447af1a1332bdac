"""Live progress of ``forge run`` on a terminal: a status block redrawn in place below the scrolling output.

The block is the run's event log folded as it is written (``events.apply``, the fold summary.json and the
report use): trials done/total, passed, failed by stage, each worker's trial and phase, elapsed time and an
ETA from the finished trials' median. Above it scroll one line per finished trial and every other line
written to stderr (forge's own notes, warnings): while the block is shown, ``sys.stderr`` goes through
``_Stderr``, which lifts the block, lets the line through and redraws, so nothing lands inside the block.

Only on a terminal (and not with ``--json`` or ``FORGE_PROGRESS=plain``); elsewhere ``forge run`` prints
its plain per-phase lines unchanged. A small ANSI renderer rather than a library: three escape sequences
(cursor up, clear to end of screen, hide/show cursor) are all it needs.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TextIO

from forgelib.run import events as ev

# Executor's per-trial progress lines ("task[3] oracle   4.1s"): the block shows that instead.
_TRIAL_LINE = re.compile(r"^\S+\[\d+\] ")
_REFRESH = 1.0  # seconds between redraws when no event arrives (the clocks move)


def wanted(as_json: bool, stream: TextIO | None = None) -> bool:
    """Live display on a terminal; plain lines for pipes, CI logs, ``--json`` and ``FORGE_PROGRESS=plain``."""
    stream = stream if stream is not None else sys.stderr
    if as_json or os.environ.get("FORGE_PROGRESS", "").lower() == "plain":
        return False
    if os.environ.get("TERM", "") == "dumb":
        return False
    return stream.isatty()


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def render(state: ev.RunState, now: float, workers: int) -> list[str]:
    """The status block for ``state`` at ``now`` (plain text; pure, so unit tests read it)."""
    recs = state.records()
    done = [r for r in recs if r.finished]
    passed = sum(r.status == "passed" for r in done)
    stages: dict[str, int] = {}
    for r in done:
        if r.status != "passed":
            key = (r.error_stage or "unknown") if r.failed_attempt else "graded"
            stages[key] = stages.get(key, 0) + 1
    failed = sum(stages.values())
    session = state.sessions[-1] if state.sessions else None
    # Busy workers: a trial not finished yet, or finished and still tearing its stack down.
    running = [
        r
        for r in recs
        if r.history and r.history[-1].busy and r.history[-1].session == len(state.sessions) - 1
    ]
    unfinished = [r for r in running if not r.finished]
    head = f"{len(done)}/{len(recs)} done · {passed} passed · {failed} failed"
    if stages:
        head += " (" + ", ".join(f"{k} {n}" for k, n in sorted(stages.items())) + ")"
    interrupted = sum(r.status == "interrupted" for r in recs)
    if interrupted:
        head += f" · {interrupted} interrupted"
    head += f" · {len(unfinished)} running"
    if session is not None and session.started is not None:
        end = session.ended if session.ended is not None else now
        head += f" · elapsed {_clock(max(0.0, end - session.started))}"
    totals = [r.timings["total"] for r in done if "total" in r.timings]
    remaining = len(recs) - len(done)
    if session is not None and session.end is not None:
        head += f" · {session.end.removeprefix('run_')}"
    elif totals and remaining:
        med = statistics.median(totals)
        left = sum(max(0.0, med - (now - _started(r))) for r in unfinished)
        queued = max(0, remaining - len(unfinished))
        head += f" · ETA {_clock((left + queued * med) / max(1, workers))}"
    elif remaining:
        head += " · ETA after the first trial"
    lines = [f"forge: {head}"]
    for r in sorted(running, key=lambda r: _lane(r.worker)):
        a = r.history[-1]
        phase, since = a.phases[-1] if a.phases else (r.phase, now)
        lines.append(
            f"  w{r.worker if r.worker is not None else '?'}  {r.task}[{r.index}]  "
            f"{phase:<13} {now - since:6.1f}s  (trial {now - _started(r):.1f}s)"
        )
    return lines


def _started(r: ev.TrialRecord) -> float:
    a = r.history[-1]
    return a.phases[0][1] if a.phases else 0.0


def _lane(worker: str | None) -> tuple[int, str]:
    return (int(worker), "") if worker is not None and worker.isdigit() else (1 << 30, str(worker))


def finished_line(e: Mapping[str, Any]) -> str:
    """The scrolling line for a ``trial_finished`` event."""
    key = f"{e.get('task')}[{e.get('index')}]"
    total = (e.get("timings") or {}).get("total")
    took = f" {total:.1f}s" if isinstance(total, int | float) else ""
    status = str(e.get("status") or e.get("termination_reason"))
    if status == "passed":
        return f"{key} passed{took}"
    where = f" at {e['error_stage']}" if e.get("error_stage") else ""
    reason = (e.get("reasons") or [""])[0]
    return f"{key} {status}{where}{took}" + (f": {reason}" if reason else "")


class LiveProgress:
    """The status block on ``stream`` (a terminal), fed the run's events through ``observe``."""

    def __init__(self, stream: TextIO, workers: int = 1, clock: Callable[[], float] = time.time) -> None:
        self.stream = stream
        self.workers = workers
        self.clock = clock
        self.state = ev.RunState()
        self._lock = threading.RLock()  # RLock: a signal handler in a thread that holds it may print
        self._shown = 0  # lines of the block on screen now
        self._partial = ""  # a line written to stderr without its newline yet
        self._wake = threading.Event()
        self._done = threading.Event()
        self._ticker: threading.Thread | None = None
        self._saved: TextIO | None = None
        self._since = clock()  # events older than this are a resumed run's history: folded, not printed

    # ------------------------------------------------------------------------------ feeding it

    def observe(self, event: Mapping[str, Any]) -> None:
        with self._lock:
            ev.apply(self.state, event)
            new = float(event.get("ts") or 0) >= self._since - 1
            if event.get("kind") == ev.TRIAL_FINISHED and new and event.get("status") != "interrupted":
                self._above([f"forge: {finished_line(event)}"])
        self._wake.set()

    def say(self, line: str) -> None:
        """The run's progress callback: per-trial phase lines are in the block; the rest scroll above."""
        if not _TRIAL_LINE.match(line):
            with self._lock:
                self._above([f"forge: {line}"])

    # ------------------------------------------------------------------------------ drawing

    def _erase(self) -> None:
        if self._shown:
            up = f"\x1b[{self._shown - 1}A" if self._shown > 1 else ""
            self.stream.write(f"\r{up}\x1b[J")
            self._shown = 0

    def _draw(self) -> None:
        width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)  # never wrap: we count lines
        lines = [ln[:width] for ln in render(self.state, self.clock(), self.workers)]
        self._erase()
        self.stream.write("\n".join(lines))
        self.stream.flush()
        self._shown = len(lines)

    def _above(self, lines: list[str]) -> None:
        self._erase()
        self.stream.write("".join(f"{ln}\n" for ln in lines))
        if self._ticker is not None:
            self._draw()
        else:
            self.stream.flush()

    def _write(self, text: str) -> None:
        """What someone else writes to stderr while the block is shown: whole lines go above it."""
        with self._lock:
            text = self._partial + text
            *lines, self._partial = text.split("\n")
            if lines:
                self._above(lines)

    def _tick(self) -> None:
        while not self._done.is_set():
            self._wake.wait(_REFRESH)
            self._wake.clear()
            if self._done.is_set():
                return
            with self._lock:
                self._draw()

    # ------------------------------------------------------------------------------ lifetime

    def __enter__(self) -> LiveProgress:
        self.stream.write("\x1b[?25l")  # hide the cursor while the block is redrawn
        self._saved, sys.stderr = sys.stderr, _Stderr(self)
        self._ticker = threading.Thread(target=self._tick, name="forge-live", daemon=True)
        with self._lock:
            self._draw()
        self._ticker.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._wake.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self._saved is not None:
                sys.stderr = self._saved
            if self._partial:
                self._above([self._partial])
                self._partial = ""
            self._draw()  # the final counts stay on screen
            self.stream.write("\n\x1b[?25h")
            self.stream.flush()
            self._shown = 0
            self._ticker = None


class _Stderr:
    """``sys.stderr`` while the block is shown: text goes above the block, the rest is the real stream."""

    def __init__(self, live: LiveProgress) -> None:
        self._live = live

    def write(self, text: str) -> int:
        self._live._write(text)
        return len(text)

    def flush(self) -> None:
        self._live.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._live.stream, name)
