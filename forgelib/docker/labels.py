"""Ownership labels on every container, network and volume a trial creates, and Docker queries by label.

The owner is identified by host, pid, boot id and the process start time (``/proc/self/stat`` field 22):
a pid alone is reused after a reboot or a wrap-around, so the reaper (``custody.py``) treats an owner as
alive only when all four still match a live process.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from forgelib.docker import argv as dk
from forgelib.runner import Runner

MANAGED = "io.forgelib.managed"
RUN = "io.forgelib.run"
TRIAL = "io.forgelib.trial"
OWNER_HOST = "io.forgelib.owner.host"
OWNER_PID = "io.forgelib.owner.pid"
OWNER_BOOT_ID = "io.forgelib.owner.boot_id"
OWNER_START_TIME = "io.forgelib.owner.start_time"
# `forge provision --keep`: the owner exits on purpose with the stack up; the reaper must leave it alone.
KEPT = "io.forgelib.kept"
# A host directory its owner made for the stack (`forge provision`'s override and logs): `forge teardown`
# and the reaper remove it with the stack.
WORK_DIR = "io.forgelib.work_dir"
# Set by compose itself on everything it creates; lets `forge teardown --name` find a project's leftovers.
COMPOSE_PROJECT = "com.docker.compose.project"
COMPOSE_SERVICE = "com.docker.compose.service"  # also compose's: which service a container runs
COMPOSE_ONEOFF = "com.docker.compose.oneoff"  # compose's: "True" on `compose run` containers
# compose counts a container as its project's (and removes an orphan on `down`) only with this label.
COMPOSE_CONFIG_HASH = "com.docker.compose.config-hash"
# A container forge adds to a stack for its own use (forgelib.seeds.datadir's pristine copy): never one
# of the trial's services (left out of `served`, the ports and logs a trial records).
HELPER = "io.forgelib.helper"

UNKNOWN = "unknown"  # a field this OS does not expose (no /proc): never matches a live process
RESOURCE_KINDS = ("containers", "networks", "volumes")

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class Owner:
    """The process that owns a stack; all fields are label strings."""

    host: str
    pid: str
    boot_id: str
    start_time: str  # clock ticks since boot at which the process started

    def labels(self) -> dict[str, str]:
        return {
            OWNER_HOST: self.host,
            OWNER_PID: self.pid,
            OWNER_BOOT_ID: self.boot_id,
            OWNER_START_TIME: self.start_time,
        }

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> Owner:
        """The owner recorded on a resource (missing labels read as ``unknown``)."""
        return cls(
            host=labels.get(OWNER_HOST, UNKNOWN),
            pid=labels.get(OWNER_PID, UNKNOWN),
            boot_id=labels.get(OWNER_BOOT_ID, UNKNOWN),
            start_time=labels.get(OWNER_START_TIME, UNKNOWN),
        )


def boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip() or UNKNOWN
    except OSError:
        return UNKNOWN


def proc_stat(pid: int | str, proc: Path = Path("/proc")) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` from field 3 (state) on, or None when the process does not exist
    or is a zombie: a zombie has exited and only waits for its parent to collect the status.

    Field 2 (comm) is in parentheses and may itself contain spaces and ')': split after the *last* ')'.
    Any other error (e.g. permission denied) propagates: the reaper must never read it as "gone".
    """
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    rest = text.rpartition(")")[2].split()
    return None if not rest or rest[0] in ("Z", "X") else rest


def pid_start_time(pid: int | str, proc: Path = Path("/proc")) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks since boot); None as for ``proc_stat``."""
    rest = proc_stat(pid, proc)
    return rest[19] if rest is not None and len(rest) >= 20 else None  # rest[0] is field 3


def process_start_time(pid: int | str = "self") -> str:
    """``pid_start_time`` for labelling: anything unreadable is ``unknown`` (which matches no process)."""
    try:
        return pid_start_time(pid) or UNKNOWN
    except OSError:
        return UNKNOWN


@cache
def _owner_of(pid: int) -> Owner:
    return Owner(socket.gethostname(), str(pid), boot_id(), process_start_time("self"))


def current_owner() -> Owner:
    """This process (keyed by pid, so a forked worker reports itself, not its parent)."""
    return _owner_of(os.getpid())


def trial_label(task: str, trial_index: int) -> str:
    return f"{task}.{trial_index}"


def run_labels(
    run_id: str,
    trial: str | None = None,
    owner: Owner | None = None,
    *,
    kept: bool = False,
    work_dir: Path | None = None,
) -> dict[str, str]:
    """Every label a run's (or one trial's, when ``trial`` is given) resources carry; ``kept`` marks a
    stack left up on purpose (``forge provision --keep``), which outlives its owner; ``work_dir``: the
    stack's own host directory (an ``owned_temp_dir``), removed with it."""
    labels = {MANAGED: "true", RUN: run_id}
    if trial is not None:
        labels[TRIAL] = trial
    if kept:
        labels[KEPT] = "true"
    if work_dir is not None:
        labels[WORK_DIR] = str(work_dir)
    labels.update((owner or current_owner()).labels())
    return labels


def owned_temp_dir(prefix: str) -> Path:
    """A new directory in the temp dir named ``<prefix><pid>-<start time>-<random>`` after this process, so
    the reaper can tell once its owner is gone (``stale_owned_dirs``)."""
    me = current_owner()
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{me.pid}-{me.start_time}-"))


def dir_owner(path: Path, prefix: str) -> tuple[int, str] | None:
    """(pid, start time) an ``owned_temp_dir`` name claims; None for any other name (never ours to judge)."""
    pid, _, rest = path.name.removeprefix(prefix).partition("-")
    start, _, tail = rest.partition("-")
    if not path.name.startswith(prefix) or not pid.isdigit() or not start.isdigit() or not tail:
        return None
    return int(pid), start


def stale_owned_dirs(prefix: str, alive: Callable[[int, str], bool]) -> list[Path]:
    """The temp dir's ``owned_temp_dir``s of ``prefix`` whose owner is no longer ``alive(pid, start)``."""
    out = []
    for d in sorted(Path(tempfile.gettempdir()).glob(prefix + "*")):
        owner = dir_owner(d, prefix)
        if owner is not None and d.is_dir() and not d.is_symlink() and not alive(*owner):
            out.append(d)
    return out


def of_inspect(info: Mapping[str, Any]) -> Mapping[str, str]:
    """The labels of a ``docker inspect`` record (a container's or an image's: both keep them in Config)."""
    return (info.get("Config") or {}).get("Labels") or {}


def filters(labels: Mapping[str, str]) -> list[str]:
    """``--filter label=K=V`` for each of ``labels``: the one way forge finds its resources by label.
    Repeated --filter label=... flags are ANDed by Docker."""
    argv: list[str] = []
    for k, v in sorted(labels.items()):
        argv += ["--filter", f"label={k}={v}"]
    return argv


def resources_with_labels(
    runner: Runner, labels: Mapping[str, str], *, timeout: float = 60.0
) -> dict[str, list[str]]:
    """Names of the containers (running or not), networks and volumes carrying all of ``labels``."""
    if not labels:
        raise ValueError("refusing to list resources without a label filter")
    f = filters(labels)
    queries = {
        "containers": dk.ps(all=True, filters=f, format="{{.Names}}"),
        "networks": dk.ls("network", filters=f, format="{{.Name}}"),
        "volumes": dk.ls("volume", filters=f, format="{{.Name}}"),
    }
    found: dict[str, list[str]] = {}
    for kind, argv in queries.items():
        out = runner.run(argv, timeout=timeout).stdout
        found[kind] = sorted(line.strip() for line in out.splitlines() if line.strip())
    return found


def label_values(runner: Runner, labels: Mapping[str, str], key: str, *, timeout: float = 60.0) -> set[str]:
    """The values of label ``key`` on the containers and networks carrying all of ``labels`` (non-empty)."""
    f = filters(labels)
    fmt = f'{{{{.Label "{key}"}}}}'
    found: set[str] = set()
    for argv in (dk.ps(all=True, filters=f, format=fmt), dk.ls("network", filters=f, format=fmt)):
        out = runner.run(argv, timeout=timeout).stdout
        found |= {line.strip() for line in out.splitlines() if line.strip() and line.strip() != "<no value>"}
    return found


def is_empty(resources: Mapping[str, list[str]]) -> bool:
    return not any(resources.get(k) for k in RESOURCE_KINDS)
