"""Owners for ownership labels that tests plant: a process that existed and is provably gone."""

from __future__ import annotations

import subprocess

from forgelib.docker.labels import pid_start_time


def dead_pid() -> tuple[str, str]:
    """(pid, start time) of a process that existed and is now gone (killed and collected)."""
    proc = subprocess.Popen(["sleep", "600"])
    start = pid_start_time(proc.pid)
    assert start is not None
    proc.kill()
    proc.wait()
    assert pid_start_time(proc.pid) is None
    return str(proc.pid), start
