"""The live progress block: what it says for a run's events; it leaves the terminal as it found it."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from support.runlog import T0, ev_started, trial_events

from forgelib.cli import live
from forgelib.run import events as ev

PLAN = [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("a", 4), ("a", 5)]


def mid_run() -> list[dict[str, Any]]:
    """Three finished (passed 10 s, a provisioning error, a graded failure), two running, one queued."""
    log = [ev_started(PLAN, workers=2)]
    log += trial_events("a", 0, T0 + 1, "0", oracle=5.9)
    log += trial_events("a", 1, T0 + 1, "1", outcome="provision_error")
    log += trial_events("a", 2, T0 + 5, "1", outcome="failed")
    log += [e for e in trial_events("a", 3, T0 + 12, "0") if e["kind"] == ev.TRIAL_STATE][:2]  # in oracle
    log += [e for e in trial_events("a", 4, T0 + 14, "1") if e["kind"] == ev.TRIAL_STATE][:1]  # provisioning
    return log


def test_the_block_counts_trials_names_failure_stages_and_shows_each_worker() -> None:
    state = ev.fold(mid_run())
    lines = live.render(state, now=T0 + 20, workers=2)
    head = lines[0]
    assert head.startswith("forge: 3/6 done · 1 passed · 2 failed (graded 1, reset_recipe 1) · 2 running")
    assert "elapsed 0:20" in head
    # ETA: median of the finished totals, minus what the running trials already spent, spread on 2 workers.
    totals = sorted(r.timings["total"] for r in state.records() if r.finished)
    med = totals[1]
    a3 = next(e["ts"] for e in mid_run() if e.get("index") == 3)
    left = max(0.0, med - (T0 + 20 - a3)) + max(0.0, med - 6.0) + med  # a[3], a[4], queued a[5]
    assert f"ETA {live._clock(left / 2)}" in head
    assert lines[1].split() == [
        "w0",
        "a[3]",
        "solve",
        f"{T0 + 20 - mid_run()[-2]['ts']:.1f}s",
        "(trial",
        "8.0s)",
    ]
    assert lines[2].split()[:3] == ["w1", "a[4]", "provisioning"]
    assert len(lines) == 3


def test_before_any_trial_finished_there_is_no_eta_and_after_the_run_none_is_needed() -> None:
    log = mid_run()[:3]
    assert "ETA after the first trial" in live.render(ev.fold(log), T0 + 2, 2)[0]
    done = [
        ev_started([("a", 0)]),
        *trial_events("a", 0, T0 + 1, "0"),
        {"kind": ev.RUN_FINISHED, "ts": T0 + 9},
    ]
    head = live.render(ev.fold(done), T0 + 500, 1)[0]
    assert "1/1 done · 1 passed · 0 failed · 0 running" in head and "ETA" not in head
    assert "elapsed 0:09 · finished" in head  # the session's own end, not the clock


def test_finished_lines_say_the_outcome_and_the_first_reason() -> None:
    a, b = (
        next(e for e in trial_events("a", i, T0, "0", outcome=o) if e["kind"] == ev.TRIAL_FINISHED)
        for i, o in ((0, "passed"), (1, "provision_error"))
    )
    assert live.finished_line(a) == f"a[0] passed {a['timings']['total']:.1f}s"
    assert live.finished_line(b) == (
        f"a[1] error at reset_recipe {b['timings']['total']:.1f}s: "
        "Provisioning failed at reset_recipe: psql: ERROR: relation widgets does not exist"
    )


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_display_keeps_other_output_above_it_and_restores_the_terminal() -> None:
    out = Tty()
    stderr = sys.stderr
    d = live.LiveProgress(out, workers=2, clock=lambda: T0 + 20)
    d._since = T0  # events from T0 on are this session's
    with pytest.raises(KeyboardInterrupt), d:
        assert sys.stderr is not stderr  # stderr goes above the block while it is shown
        for e in mid_run():
            d.observe(e)
        d.say("a[4] provisioning     1.0s")  # per-trial phase lines are the block's business
        d.say("warning: something worth reading")
        print("forge: SIGINT: stopping", file=sys.stderr)  # e.g. the signal handler's note
        raise KeyboardInterrupt
    assert sys.stderr is stderr
    text = out.getvalue()
    assert text.startswith("\x1b[?25l") and text.endswith("\n\x1b[?25h")  # cursor hidden, then shown again
    screen = _screen(text)
    verdicts = [live.finished_line(e) for e in mid_run() if e["kind"] == ev.TRIAL_FINISHED]
    assert [v.split(" ")[:2] for v in verdicts] == [["a[0]", "passed"], ["a[1]", "error"], ["a[2]", "failed"]]
    assert screen[:5] == [
        *(f"forge: {v}" for v in verdicts),  # each finished trial once, in the order they finished
        "forge: warning: something worth reading",
        "forge: SIGINT: stopping",
    ]
    assert screen[5].startswith("forge: 3/6 done · 1 passed · 2 failed")  # the final block stays
    assert [ln.split()[0] for ln in screen[6:]] == ["w0", "w1"]
    assert not any("provisioning     1.0s" in ln for ln in screen)


def _screen(text: str) -> list[str]:
    """What a terminal shows after ``text``: a tiny emulator of the escapes the display uses."""
    rows: list[str] = [""]
    y = 0
    i = 0
    while i < len(text):
        if text.startswith("\x1b[", i):
            j = i + 2
            while not text[j].isalpha():
                j += 1
            arg, op = text[i + 2 : j], text[j]
            if op == "A":
                y -= int(arg or 1)
            elif op == "J":
                del rows[y + 1 :]
                rows[y] = ""
            i = j + 1
            continue
        ch = text[i]
        if ch == "\r":
            rows[y] = rows[y]  # column 0; the display clears the line right after
        elif ch == "\n":
            y += 1
            if y == len(rows):
                rows.append("")
        else:
            rows[y] += ch
        i += 1
    return [r for r in rows if r]


@pytest.mark.parametrize(
    ("as_json", "env", "tty", "want"),
    [
        (False, {}, True, True),
        (True, {}, True, False),
        (False, {}, False, False),
        (False, {"FORGE_PROGRESS": "plain"}, True, False),
        (False, {"TERM": "dumb"}, True, False),
    ],
)
def test_live_only_on_a_terminal_without_json(
    as_json: bool, env: dict[str, str], tty: bool, want: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FORGE_PROGRESS", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if tty:
        master, slave = os.openpty()
        with os.fdopen(slave, "w") as stream:
            assert live.wanted(as_json, stream) is want
        os.close(master)
    else:
        with open(tmp_path / "log", "w") as stream:
            assert live.wanted(as_json, stream) is want
