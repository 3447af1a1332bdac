"""What runs on a cluster node: one trial, through exactly the local code path.

The trial goes through ``Executor.run_trial`` with its run's backend on this slot (``NodeRun``: opened by
``stacks.open`` as for a local run with one worker — fresh, from goldens, or warm) — provision,
oracle, checks, logs, teardown, ownership labels — against the engine the node declares
(``FORGE_DOCKER_HOST``), in the run's directory on this slot (``slot``), which holds the trials' files
(a warm stack's compose files among them) until the run ends there. Events and progress go to
the driver through the slot's buffer; the trial's files go back as one tar in the return value. A stop
from the driver acts like a signal does locally: no new launches, in-flight launches killed, the stack
torn down (a second stop: without graceful waits).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forgelib.cluster import ENGINE_ENV
from forgelib.errors import ForgeError
from forgelib.run.execute import Executor, Settings
from forgelib.run.results import trial_dir
from forgelib.run.setup import SETUPS_DIR, SetupResult
from forgelib.runner import SubprocessRunner
from forgelib.spec.models import Project, Timeouts
from forgelib.stacks import DockerBackend, Stacks
from forgelib.stacks import open as open_stacks
from forgelib.stacks.live import LiveStacks, StopState
from forgelib.stacks.snapshots.transfer import CheckpointCopy

STOP_POLL_SECONDS = 0.5
Item = tuple[str, Any]  # what goes to the driver: ("event", (kind, fields)) | ("say", line)


@dataclass(frozen=True)
class TrialOrder:
    """One trial as the driver asks for it (everything else comes with the bundle)."""

    run_id: str
    task: str
    index: int
    timeouts: Timeouts
    capture_logs_on_success: bool
    log_tail_lines: int
    retries: int = 0
    profiles: tuple[str, ...] = ()
    prior: bytes = b""  # the trial's directory on the driver: earlier attempts, shelved under attempts/
    driver: str = ""  # the driver's token: its events and stops are its own (a resumed run's driver is new)
    stacks: str = "fresh"  # the plan's --stacks
    snapshots: bool = False  # fresh stacks from goldens (captured once per node engine)
    setup: SetupResult | None = None  # the task's setup, run on one node (its checkpoint is on this one's)


@dataclass
class TrialReturn:
    node: dict[str, str]
    started: bool = True  # False: a stop came first; nothing ran, nothing was recorded
    files: bytes = b""  # tar of the trial's directory
    error: str | None = None  # the node could not run the trial at all (no engine, a seed failed to verify)
    status: str = ""
    # Wall-clock marks (time.time()) of the node-side steps, for the driver's overhead breakdown.
    marks: dict[str, float] = field(default_factory=dict)


def node_engine() -> str:
    engine = os.environ.get(ENGINE_ENV, "").strip()
    if not engine:
        raise ForgeError(
            f"this node offers forge slots but does not say which Docker engine it serves: restart its "
            f"`ray start` with {ENGINE_ENV}=unix:///var/run/docker.sock (or the engine's address)"
        )
    return engine


def node_identity(node_id: str, engine: str) -> dict[str, str]:
    return {"id": node_id, "host": socket.gethostname(), "engine": engine}


class RelayEvents:
    """The Executor's event sink on a node: each event goes to the driver, tagged with the node."""

    def __init__(self, push: Callable[[list[Item]], None], node: dict[str, str]) -> None:
        self._push = push
        self._node = node["id"]

    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        fields.setdefault("node", self._node)
        self._push([("event", (kind, fields))])
        return {"kind": kind, **fields}

    def say(self, line: str) -> None:
        self._push([("say", line)])


class StopWatcher:
    """Polls the driver's stop level and acts on it the way ``signals.interruptible`` does locally."""

    def __init__(self, level: Callable[[], int], stop: StopState, stacks: LiveStacks) -> None:
        self._level, self._stop, self._stacks = level, stop, stacks
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="forge-stop-watch", daemon=True)

    def __enter__(self) -> StopWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        seen = 0
        while not self._done.wait(STOP_POLL_SECONDS):
            level = self._level()
            while seen < level:
                seen += 1
                self._stop.request("driver stop")  # kills the guarded runner's in-flight launches
                self._stacks.closed = True
                if seen > 1:  # the trial's own graceful `down` was just killed: redo it without waits
                    self._stacks.teardown_all(graceful=False)


@dataclass
class NodeRun:
    """One driver's run on one slot: its stacks (``stacks.open``, as a local run with one worker: a warm
    stack stays up between the run's trials here, goldens are found on this node's engine; the start bound
    and the memory budget shared with every other slot and forge process on the engine), the stop that the
    driver's stop level sets, and the directory of its trials' files. ``end`` tears it all down."""

    workdir: Path
    opened: Stacks
    closing: contextlib.ExitStack

    @classmethod
    def start(cls, project: Project, order: TrialOrder, workdir: Path) -> NodeRun:
        closing = contextlib.ExitStack()
        # No signal handlers (a Ray worker's are Ray's): the driver's stop level stops it (``StopWatcher``).
        # No trial count: the driver keeps the queue, so the warm pool does not know how many come here.
        opened = closing.enter_context(
            open_stacks(
                project,
                mode="warm" if order.stacks == "warm" else "fresh",
                runner=SubprocessRunner(default_timeout=order.timeouts.command),
                timeouts=order.timeouts,
                log_tail_lines=order.log_tail_lines,
                profiles=order.profiles,
                goldens=order.snapshots,
                workers=1,
                signals=False,
            )
        )
        return cls(workdir, opened, closing)

    @property
    def stop(self) -> StopState:
        return self.opened.stop

    @property
    def stacks(self) -> LiveStacks:
        return self.opened.live

    @property
    def backend(self) -> DockerBackend:
        return self.opened.backend

    def no_more(self) -> None:
        """The driver has handed out its whole queue: only a rerun will come here (``WarmPool.no_more``)."""
        self.backend.no_more()

    def end(self, run_id: str) -> None:
        """The run is over here (however it ended): its warm and shared stacks go, then its files."""
        try:
            self.stacks.closed = True
            try:
                self.backend.finish_run(run_id)
            finally:
                self.closing.close()
            if self.opened.left:
                raise ForgeError("the run's stacks on this node left:\n" + "\n".join(self.opened.left))
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class SetupReturn:
    """A task's setup as one node ran it: its result (the checkpoint on this node's engine), its files."""

    node: dict[str, str]
    result: SetupResult | None = None  # None: the node could not run it (``error``), or a stop came first
    files: bytes = b""  # tar of setups/<task>/
    error: str | None = None


def _executor(order: TrialOrder, node: dict[str, str], run: NodeRun, sink: RelayEvents) -> Executor:
    settings = Settings(
        run_id=order.run_id,
        run_dir=run.workdir / "run",
        timeouts=order.timeouts,
        capture_logs_on_success=order.capture_logs_on_success,
        log_tail_lines=order.log_tail_lines,
        retries=order.retries,
        node=node,
    )
    return Executor(run.backend, sink, settings, sink.say, stacks=run.stacks, stop=run.stop)


def run_setup(
    project: Project,
    order: TrialOrder,
    *,
    node: dict[str, str],
    run: NodeRun,
    push: Callable[[list[Item]], None],
    stop_level: Callable[[], int],
) -> SetupReturn:
    """Run ``order.task``'s setup here, once for the whole run (``run.setup``): its stack provisioned,
    the step run, the stack checkpointed on this node's engine as the run's own, the stack torn down."""
    try:
        task = project.task(order.task)
    except ForgeError as e:
        return SetupReturn(node, error=str(e))
    sink = RelayEvents(push, node)
    executor = _executor(order, node, run, sink)
    with StopWatcher(stop_level, run.stop, run.stacks):
        result = executor.setup(task)
    d = run.workdir / "run" / SETUPS_DIR / order.task
    return SetupReturn(node, result, tar_dir(d) if d.is_dir() else b"")


def export_checkpoint(run: NodeRun, checkpoint_id: str) -> CheckpointCopy:
    """The run's checkpoint taken here, packed for the other nodes' engines."""
    backend = run.backend
    return backend.checkpoints.export(backend.ctx, checkpoint_id, run.workdir / "transfer")


def adopt_checkpoint(run: NodeRun, copy: CheckpointCopy, run_id: str) -> str:
    """Another node's checkpoint of the run, loaded and verified on this node's engine as the run's own
    here (removed as the run ends here, or by ``forge reap`` on this engine once this process is gone)."""
    backend = run.backend
    return backend.checkpoints.adopt(backend.ctx, copy, run_id, run.workdir / "transfer")


def run_trial(
    project: Project,
    order: TrialOrder,
    *,
    node: dict[str, str],
    run: NodeRun,
    push: Callable[[list[Item]], None],
    stop_level: Callable[[], int],
) -> TrialReturn:
    """Run one trial of ``project`` (shipped and verified: ``slot``) here, in ``run`` (Ray-free)."""
    marks: dict[str, float] = {}
    try:
        task = project.task(order.task)
    except ForgeError as e:
        return TrialReturn(node, error=str(e))
    stop, stacks = run.stop, run.stacks
    sink = RelayEvents(push, node)
    executor = _executor(order, node, run, sink)
    settings = executor.s
    if order.prior:  # a rerun counts on from the attempts already on record
        untar_into(order.prior, trial_dir(settings.run_dir, order.task, order.index))
    if order.setup is not None:  # run on one node for all: this node's engine has its checkpoint
        executor.know_setup(order.setup)
    marks["trial_start"] = time.time()
    with StopWatcher(stop_level, stop, stacks):
        result = executor.run_trial(task, order.index)
    marks["trial_end"] = time.time()
    files = tar_dir(trial_dir(settings.run_dir, order.task, order.index))
    marks["tarred"] = time.time()
    return TrialReturn(node, files=files, status=result.status, marks=marks)


def tar_dir(path: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        tar.add(path, arcname=".")
    return buf.getvalue()


def untar_into(data: bytes, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")


__all__ = [
    "Item",
    "NodeRun",
    "RelayEvents",
    "SetupReturn",
    "StopWatcher",
    "TrialOrder",
    "TrialReturn",
    "adopt_checkpoint",
    "export_checkpoint",
    "node_engine",
    "run_setup",
    "run_trial",
]
