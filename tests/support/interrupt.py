"""Waiting out a ``forge run`` child after SIGINT or SIGKILL, the same way in every signal test."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from forgelib.docker import labels as lab
from forgelib.run.events import EVENTS_FILE, read_events
from forgelib.runner import Runner


def finished_interrupted(
    proc: subprocess.Popen[str], runner: Runner, run_dir: Path, run_id: str, *, timeout: float = 180
) -> str:
    """After its SIGINT: exit 130, no traceback, ``run_interrupted`` on record and nothing left with the
    run's labels. Returns its stderr (a child that hangs is killed, and fails the test)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    kinds = [e.get("kind") for e in read_events(run_dir / run_id / EVENTS_FILE)]
    assert "run_interrupted" in kinds, kinds
    left = lab.resources_with_labels(runner, {lab.RUN: run_id})
    assert lab.is_empty(left), f"run {run_id} left {left}"
    return err


def progress_until(proc: subprocess.Popen[str], pattern: str, timeout: float = 120) -> tuple[str, list[str]]:
    """Read a ``forge run`` child's progress lines until one contains ``pattern``: (run id, lines so far)."""
    assert proc.stderr is not None
    lines: list[str] = []
    run_id = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("forge: run ") and not run_id:
            run_id = line.split()[2].rstrip(":")
        if pattern in line:
            return run_id, lines
    raise AssertionError(f"never saw {pattern!r}:\n{''.join(lines)}")


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line mentions ``text`` (the killed run's orphaned docker compose calls)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return [p for p in pids if p != os.getpid()]


def orphans_ended(run_id: str) -> None:
    """Let a killed run's docker children (in their own sessions, so the kill missed them) end first, so
    that what follows sees the final state of what they left. Gives up quietly after two minutes."""
    for _ in range(600):
        if not processes_mentioning(run_id.lower()):
            break
        time.sleep(0.2)
