"""The live progress block on a real terminal (a pty) during a real run, and Ctrl-C typed at it.

``forge run`` runs as a user's would: in the foreground of a pseudo-terminal, so its stderr is a tty and
the block is drawn; Ctrl-C is the byte the terminal turns into SIGINT for the foreground process group.
The test waits for what the screen says (a finished trial counted, the next one running), never for time.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import sys
import termios
import time
from pathlib import Path

import pytest

from forgelib.docker import labels as lab
from forgelib.errors import EXIT_INTERRUPTED
from forgelib.run import events as ev
from forgelib.runner import SubprocessRunner

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

DEV = Path(__file__).resolve().parents[1] / "fixtures" / "run_project" / "run_configs" / "dev.yaml"
BOUND = 600.0  # seconds: only bounds a hang (a trial takes ~10 s)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """``forge ARGS`` in the foreground of a fresh pty, 160 columns wide; ``screen`` is all it wrote."""

    def __init__(self, *args: str) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: forge, with the pty as its controlling terminal
            os.environ.update({"TERM": "xterm", "COLUMNS": "160", "FORGE_PROGRESS": ""})
            os.execv(sys.executable, [sys.executable, "-m", "forgelib", *args])
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
        self.raw = b""

    @property
    def screen(self) -> str:
        return ANSI.sub("", self.raw.decode(errors="replace"))

    def read_until(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + BOUND
        while not (m := re.search(pattern, self.screen)):
            if not self._read(deadline):
                raise AssertionError(f"the terminal never showed {pattern!r}:\n{self.screen}")
        return m

    def _read(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.fd], [], [], left)[0]:
            return False
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal (exited)
            return False
        self.raw += chunk
        return bool(chunk)

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")  # the terminal's INTR character: SIGINT to the foreground group

    def wait(self) -> int:
        deadline = time.monotonic() + BOUND
        while self._read(deadline):
            pass
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status)


def test_live_block_counts_the_trials_and_ctrl_c_ends_it_cleanly(
    tmp_path: Path, runner: SubprocessRunner
) -> None:
    out = tmp_path / "runs"
    term = Terminal("run", "--config", str(DEV), "--output", str(out), "--repeats", "3")
    rc = None
    try:
        # One trial done and counted, the next one running on worker 0 (in whatever phase it is in).
        term.read_until(r"forge: write_file\[0\] passed")
        term.read_until(r"forge: 1/3 done · 1 passed · 0 failed · 1 running")
        term.read_until(r"w0  write_file\[1\]  (provisioning|oracle|grading|capture_logs|teardown) ")
        term.ctrl_c()
        rc = term.wait()
    finally:
        if rc is None:  # an assertion above failed: stop forge as a user would, so it tears down
            term.ctrl_c()
            term.wait()
    screen = term.screen
    assert rc == EXIT_INTERRUPTED, screen
    assert "Traceback" not in screen and "unexpected error" not in screen, screen
    assert "interrupted by SIGINT" in screen, screen
    # The block's last word: the counts at the end, and that the session was interrupted.
    final = re.findall(r"forge: \d/3 done[^\r\n]*", screen)[-1]
    assert final.endswith("· interrupted"), final
    assert "write_file[1]" not in final
    # The terminal is left usable: the cursor shown again after it was hidden.
    assert term.raw.rfind(b"\x1b[?25h") > term.raw.rfind(b"\x1b[?25l") >= 0
    # Nothing of the run is left on the engine, and the log says what the screen said.
    (run_dir,) = out.iterdir()
    assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_dir.name}))
    state = ev.fold(ev.read_events(run_dir / ev.EVENTS_FILE))
    assert state.interrupted and state.trials[("write_file", 0)].status == "passed"
    done, passed = (
        sum(r.finished for r in state.records()),
        sum(r.status == "passed" for r in state.records()),
    )
    assert final.startswith(f"forge: {done}/3 done · {passed} passed"), final
