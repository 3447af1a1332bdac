"""What the forge processes on one engine share: the places to bring a stack up (one per core, between
all of them) and the memory their stacks hold.

Both live in files under the engine's state directory (``engine_dir``), held with ``flock``:

* ``StartSlots`` — ``slots`` lock files; a stack comes up only while its process holds one of them.
* ``MemoryLedger`` — one file per process saying how many bytes its stacks hold; the process keeps it
  locked for as long as it lives, so a file that can be locked is a dead process's and counts nothing.

Why flock: the kernel drops a process's locks when it exits, however it exits (``kill -9`` included), so
a killed forge never wedges the next one and nothing needs a reaper or a timeout; the locks need no
daemon and no engine round trip, and every front end (``forge run``, the pytest plugin, the inspect
sandbox, a cluster slot) reaches the same files on the engine's host. Lock files are never removed: a
lock on a file that another process just unlinked would guard nothing. The directory is per user
(``$XDG_STATE_HOME``), as the goldens' locks are: forge processes of other users on the same engine are
not counted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from forgelib.errors import Interrupted

POLL_SECONDS = 0.05  # between two looks for a free start slot (each look is a few non-blocking syscalls)


def engine_dir(engine: str | None = None) -> Path:
    """``$XDG_STATE_HOME/forgelib/engines/<key>``: the state forge processes share about one engine
    (``engine``: its address, default ``$DOCKER_HOST``; the local socket when unset)."""
    address = engine if engine is not None else os.environ.get("DOCKER_HOST", "")
    key = hashlib.sha256((address or "unix:///var/run/docker.sock").encode()).hexdigest()[:12]
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    d = base / "forgelib" / "engines" / key
    d.mkdir(parents=True, exist_ok=True)
    return d


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


class StartSlots:
    """At most ``slots`` stacks of all forge processes on the engine come up at once.

    Each hold opens the slot files itself: ``flock`` locks belong to an open file, so two threads of one
    process exclude each other as two processes do."""

    def __init__(self, directory: Path, slots: int, *, poll: float = POLL_SECONDS) -> None:
        self.directory = directory / "starts"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.slots = max(1, slots)
        self.poll = poll

    @contextlib.contextmanager
    def hold(self, stopping: Callable[[], bool] = lambda: False) -> Iterator[float]:
        """Hold a free slot while the block runs, first waiting for one; yields the seconds it waited (0.0
        when one was free at once: taking a free slot is no wait). Raises ``Interrupted`` when
        ``stopping()`` turns true meanwhile."""
        fds = [
            os.open(self.directory / f"slot-{i}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            for i in range(self.slots)
        ]
        held: int | None = None
        since: float | None = None  # when it first found every slot taken
        try:
            while held is None:
                held = next((i for i, fd in enumerate(fds) if _try_lock(fd)), None)
                if held is None:
                    if stopping():
                        raise Interrupted("stopping: no stack started")
                    since = time.monotonic() if since is None else since
                    time.sleep(self.poll)
            for i, fd in enumerate(fds):  # only the held one stays open
                if i != held:
                    os.close(fd)
            fds = [fds[held]]
            yield 0.0 if since is None else time.monotonic() - since
        finally:
            for fd in fds:
                os.close(fd)  # closing the file drops its lock


class MemoryLedger:
    """This process's line in the engine's memory ledger, and the sum of every other live process's.

    ``publish`` writes what this process's stacks hold now; ``others`` adds up the files of processes
    that still hold their lock (a file that can be locked is a dead process's: it is removed)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory / "memory"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / f"{os.getpid()}-{secrets.token_hex(4)}.held"
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # a new file nobody else knows yet: never waits
        self.publish(0)

    def publish(self, held: int) -> None:
        if self._fd is None:
            return
        # One fixed-width write: a reader never sees half of it.
        os.pwrite(self._fd, f"{max(0, held):020d}\n".encode(), 0)

    def others(self) -> int:
        """Bytes the stacks of every other live forge process on the engine hold, as they last said."""
        total = 0
        for path in self.directory.glob("*.held"):
            if path == self.path:
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # its owner closed it meanwhile
            try:
                if _try_lock(fd):  # its owner is gone (an exit, or kill -9): it holds nothing
                    path.unlink(missing_ok=True)
                    continue
                text = os.pread(fd, 64, 0).decode(errors="replace").strip()
            finally:
                os.close(fd)
            total += int(text) if text.isdigit() else 0
        return total

    def close(self) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


__all__ = ["MemoryLedger", "StartSlots", "engine_dir"]
