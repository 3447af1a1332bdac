"""The start bound and the memory budget hold across forge processes on one engine (``stacks.slots``).

Real processes, real ``flock``: each child runs ``Admission.starting`` (as a fresh trial and a warm pool
provision do) with the engine's start slots and records ``start`` / ``end`` lines in one shared file
while it holds its place; the overlap is read from the order of those lines, never from timings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forgelib.errors import Interrupted
from forgelib.stacks.budget import MIB, Admission
from forgelib.stacks.slots import MemoryLedger, StartSlots, _try_lock

SLOTS = 2
CHILD = """
import os, sys, threading, time
from pathlib import Path
from forgelib.stacks.budget import Admission
from forgelib.stacks.slots import StartSlots

state, events, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[6]
slots, threads, rounds = (int(a) for a in sys.argv[3:6])
# Each process alone would allow `slots` starts at once: the engine's slots must bound them together.
adm = Admission(None, starts=slots, slots=StartSlots(state, slots))

def record(line):
    fd = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\\n").encode())
    finally:
        os.close(fd)

def work(t):
    for r in range(rounds):
        with adm.starting():
            record(f"start {os.getpid()}-{t}-{r}")
            if mode == "hold":
                record(f"held {os.getpid()}-{t}")
                threading.Event().wait()  # until killed
            time.sleep(0.01)  # a window for another process to (wrongly) come in; nothing is timed
            record(f"end {os.getpid()}-{t}-{r}")

workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
"""


def _child(
    state: Path, events: Path, *, threads: int, rounds: int, mode: str = "run"
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", CHILD, str(state), str(events), str(SLOTS), str(threads), str(rounds), mode]
    return subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def _lines(events: Path) -> list[str]:
    return events.read_text().splitlines() if events.exists() else []


def most_at_once(lines: list[str]) -> int:
    inside, most = 0, 0
    for line in lines:
        if line.startswith("start "):
            inside += 1
            most = max(most, inside)
        elif line.startswith("end "):
            inside -= 1
    return most


def test_two_processes_together_start_no_more_than_the_engines_slots(tmp_path: Path) -> None:
    events = tmp_path / "events"
    children = [_child(tmp_path, events, threads=SLOTS, rounds=5) for _ in range(2)]
    for child in children:
        assert child.wait(timeout=120) == 0
    lines = _lines(events)
    starts = [line for line in lines if line.startswith("start ")]
    assert len(starts) == 2 * SLOTS * 5  # every start of both processes happened
    assert len({line.split()[1].split("-")[0] for line in starts}) == 2
    assert most_at_once(lines) <= SLOTS


def test_a_killed_holder_frees_its_places_for_the_next_process(tmp_path: Path) -> None:
    events = tmp_path / "events"
    holder = _child(tmp_path, events, threads=SLOTS, rounds=1, mode="hold")
    try:
        while sum(line.startswith("held ") for line in _lines(events)) < SLOTS:
            assert holder.poll() is None, "the holder exited before it held every place"
            time.sleep(0.01)
        # Every place is held by the live holder: none can be locked from here.
        fds = [os.open(tmp_path / "starts" / f"slot-{i}.lock", os.O_RDWR) for i in range(SLOTS)]
        try:
            assert not any(_try_lock(fd) for fd in fds)
        finally:
            for fd in fds:
                os.close(fd)
        # A stopping run waiting for a place gives up instead.
        with pytest.raises(Interrupted), StartSlots(tmp_path, SLOTS).hold(stopping=lambda: True):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert holder.returncode == -signal.SIGKILL
    before = len(_lines(events))
    nxt = _child(tmp_path, events, threads=SLOTS, rounds=2)
    assert nxt.wait(timeout=120) == 0  # not wedged: the kernel dropped the dead holder's locks
    after = _lines(events)[before:]
    assert sum(line.startswith("end ") for line in after) == SLOTS * 2


def test_what_other_processes_hold_counts_against_the_budget_and_a_dead_ones_does_not(tmp_path: Path) -> None:
    code = (
        "import sys, threading; from pathlib import Path; from forgelib.stacks.slots import MemoryLedger; "
        "MemoryLedger(Path(sys.argv[1])).publish(300 * 1024 * 1024); print('published', flush=True); "
        "threading.Event().wait()"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.PIPE,
    )
    ledger = MemoryLedger(tmp_path)
    try:
        assert other.stdout is not None and other.stdout.readline() == b"published\n"
        assert ledger.others() == 300 * MIB
        adm = Admission(1000 * MIB, ledger=ledger)
        adm.per_stack = 200 * MIB
        adm.enter()  # a process's first stack is always admitted
        assert adm.fits(1) is True  # 300 + 2 * 200 <= 1000
        assert adm.fits(3) is False  # 300 + 4 * 200 > 1000 (the same 4 alone would fit)
        other.send_signal(signal.SIGKILL)
        other.wait(timeout=60)
        assert ledger.others() == 0  # a dead process's stacks hold nothing (its line is removed)
        assert adm.fits(3) is True
        assert len(list((tmp_path / "memory").glob("*.held"))) == 1  # only ours is left
    finally:
        if other.poll() is None:
            other.kill()
            other.wait(timeout=60)
        assert other.stdout is not None
        other.stdout.close()
        ledger.close()
    assert not list((tmp_path / "memory").glob("*.held"))
