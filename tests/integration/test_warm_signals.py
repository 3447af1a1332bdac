"""Ctrl-C during a warm run on the real engine: the stack being reused (registered both as the trial's and
as the pool's) is torn down like a fresh one, the run exits 130 with the interruption on record, and
nothing labelled with the run is left."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.interrupt import finished_interrupted, progress_until

from forgelib.docker import labels as lab
from forgelib.run.events import EVENTS_FILE, STACK_ACQUIRED, read_events
from forgelib.runner import SubprocessRunner

pytestmark = pytest.mark.integration

DEV = Path(__file__).resolve().parents[1] / "fixtures" / "run_project" / "run_configs" / "dev.yaml"


def test_sigint_on_a_reused_warm_stack_removes_everything(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    argv = [sys.executable, "-m", "forgelib", "run", "--config", str(DEV), "--stacks", "warm"]
    argv += ["--repeats", "3", "--json", "--output", str(tmp_path)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait until trial 1 is solving (its oracle): it runs on the stack trial 0 left, reset in place
        # when trial 0 gave it back (off trial 1's path, so not among its progress lines).
        run_id, lines = progress_until(proc, "write_file[1] solve", timeout=300)
        events = read_events(tmp_path / run_id / EVENTS_FILE)
        got = [e for e in events if e.get("kind") == STACK_ACQUIRED and e.get("index") == 1]
        assert [e["decision"] for e in got] == ["reuse"] and got[0]["reset_ahead"] > 0, (got, "".join(lines))
        assert not lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))
        proc.send_signal(signal.SIGINT)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    finished_interrupted(proc, runner, tmp_path, run_id)
