"""One forge slot of a cluster node: a long-lived process that runs the slot's trials one at a time.

Why long-lived: a Ray task runs in a worker process that Ray starts for each driver (each ``forge run``),
and starting one (Python, Ray, forgelib's imports) is the bulk of what a cluster would otherwise add
per trial (benchmarks/README.md "Cluster"). A slot is a named,
detached Ray actor holding one ``forge_docker`` unit of its node (so Ray still runs at most SLOTS stacks on
a node): the first run on a cluster starts it, later runs (and concurrent drivers) reuse it. Its name
carries the digest of the forgelib code that runs it, so a driver never hands trials to other code; a
slot with no trial for ``IDLE_SECONDS`` exits and frees its unit (an old version's slots go that way).

Per slot it keeps the shipped project unpacked and its seeds verified once per bundle digest (the bytes
and every seed's digest are checked before the first trial that uses them), buffers each run's events for
the driver to drain (no round trip per event), holds each run's stop level, and keeps each run's
``node.NodeRun`` (its backend: a ``--stacks warm`` run's warm stack stays up here between its trials)
until the driver ends the run (``end``). A driver that stops draining for ``DRIVER_SILENCE`` seconds is
gone (killed): its trial is stopped like a Ctrl-C and its run ended here, so no stack outlives it. No
Ray here (``driver`` wraps the class with ``ray.remote``): unit-tested on its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import forgelib
from forgelib.cluster.bundle import Bundle, unpack, verify_seeds
from forgelib.cluster.node import (
    Item,
    NodeRun,
    SetupReturn,
    TrialOrder,
    TrialReturn,
    adopt_checkpoint,
    export_checkpoint,
    node_engine,
    node_identity,
    run_setup,
    run_trial,
)
from forgelib.docker.labels import owned_temp_dir
from forgelib.errors import ForgeError
from forgelib.spec.loader import load_project_config
from forgelib.spec.models import Project
from forgelib.stacks.reaper import NODE_DIR, reap_owned_dirs
from forgelib.stacks.snapshots.transfer import CheckpointCopy

DRIVER_SILENCE = 60.0  # seconds without a drain from a run's driver: it is gone, stop its trial
IDLE_SECONDS = 900.0  # a slot with no trial for this long exits (and frees its forge_docker unit)
# A slot of other forgelib code with no trial for this long is retired by a driver that needs its unit: a
# driver hands a freed slot its next queued trial within milliseconds, so by then no driver has one for it.
RETIRE_IDLE_SECONDS = 10.0
BUNDLES_KEPT = 2  # unpacked projects a slot keeps (two drivers alternating do not thrash)


def code_digest() -> str:
    """The forgelib code this process runs (content of its .py files): slots and drivers must agree."""
    root = Path(forgelib.__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


# A run as one driver runs it: (run id, the driver's token). A run resumed after its driver was killed
# has a new driver, whose trials' events and stops are not the killed driver's.
Session = tuple[str, str]


@dataclass
class _Run:
    """What a slot holds for one driver's run."""

    seen: float  # the driver's last drain (time.monotonic())
    events: list[Item] = field(default_factory=list)
    stop: int = 0
    node_run: NodeRun | None = None  # its backend and files here, from its first trial here to its end
    drained: bool = False  # the driver's queue is empty (``Slot.no_more``)


class Slot:
    def __init__(self, node_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.node_id = node_id
        self.code = code_digest()
        self._clock = clock
        reap_owned_dirs(NODE_DIR)  # slots killed with their node (or their process) left theirs
        self.home = owned_temp_dir(NODE_DIR)
        self._projects: OrderedDict[str, Project] = OrderedDict()  # bundle sha256 -> verified project
        self._runs: dict[Session, _Run] = {}
        self._mu = threading.Lock()  # guards _runs (drain/stop run on other threads than run)
        self._trial = threading.Lock()  # one trial at a time, whoever asks
        self._busy_since: float | None = None
        self._current: Session | None = None  # the run and driver of the trial running here
        self._last_trial = clock()
        threading.Thread(target=self._exit_when_idle, name="forge-slot-idle", daemon=True).start()
        threading.Thread(target=self._end_silent_runs, name="forge-slot-silence", daemon=True).start()

    # ---------------------------------------------------------------------------------- driver calls
    def run(self, bundle: Bundle, order: TrialOrder, code: str) -> TrialReturn:
        """One trial of ``order.run_id`` here, through ``node.run_trial`` (the local trial code path)."""
        with self._working(order, then=self._forget_gone_runs):
            return self._run(bundle, order, code)

    def setup(self, bundle: Bundle, order: TrialOrder, code: str) -> SetupReturn:
        """``order.task``'s setup for the whole run, here (``node.run_setup``): its checkpoint stays on this
        node's engine as the run's own until the run ends here."""
        with self._working(order):
            got = self._open(bundle, order, code)
            if isinstance(got, TrialReturn):
                return SetupReturn(got.node, error=got.error)
            session, node, project, node_run = got
            return run_setup(
                project,
                order,
                node=node,
                run=node_run,
                push=lambda items: self._push(session, items),
                stop_level=lambda: self._stop_level(session),
            )

    def export(self, run_id: str, driver: str, checkpoint_id: str) -> CheckpointCopy:
        """The run's checkpoint this slot's setup took, packed for the other nodes (``adopt``)."""
        with self._mu:
            run = self._run_state((run_id, driver))
            node_run = run.node_run
        if node_run is None:
            raise ForgeError(f"bug: no run {run_id} on this slot to export {checkpoint_id} from")
        return export_checkpoint(node_run, checkpoint_id)

    def adopt(self, bundle: Bundle, order: TrialOrder, code: str, copy: CheckpointCopy) -> TrialReturn:
        """Load another node's checkpoint of ``order.run_id`` on this node's engine as the run's own here
        (``node.adopt_checkpoint``); ``error`` set when it cannot be loaded or does not verify."""
        with self._trial:
            got = self._open(bundle, order, code)
            if isinstance(got, TrialReturn):
                return got
            _, node, _, node_run = got
            t0 = time.monotonic()
            try:
                adopt_checkpoint(node_run, copy, order.run_id)
            except ForgeError as e:
                return TrialReturn(node, error=str(e))
            self._last_trial = self._clock()
            return TrialReturn(node, marks={"bytes": float(copy.size), "adopt": time.monotonic() - t0})

    def end(self, run_id: str, driver: str = "") -> None:
        """The driver ended ``run_id`` (finished, interrupted or failed): its stacks and files here go."""
        with self._mu:
            run = self._runs.pop((run_id, driver), None)
        if run is not None and run.node_run is not None:
            os.environ["DOCKER_HOST"] = node_engine()
            run.node_run.end(run_id)

    def no_more(self, run_id: str, driver: str = "") -> None:
        """The driver has handed out every trial it has queued: a warm stack given back here is kept as
        it is for the run's end (or a rerun) instead of being reset ahead, so ``end`` need not wait."""
        with self._mu:
            run = self._run_state((run_id, driver))
            run.drained = True
            node_run = run.node_run
        if node_run is not None:
            node_run.no_more()

    def drain(self, run_id: str, driver: str = "") -> list[Item]:
        with self._mu:
            run = self._run_state((run_id, driver))
            items, run.events = run.events, []
            return items

    def stop(self, run_id: str, level: int, driver: str = "") -> None:
        with self._mu:
            run = self._run_state((run_id, driver))
            run.stop = max(run.stop, level)

    def take_over(self, run_id: str, driver: str, timeout: float) -> bool:
        """``driver`` resumes ``run_id``: every other driver's trial of it here (a killed driver's, still
        running until its silence says it is gone) is stopped like a Ctrl-C, and this waits (up to
        ``timeout`` s) for it to come down, so the resumed run neither runs that trial twice nor takes its
        events as its own. True once none runs here."""
        with self._mu:
            for (rid, drv), run in self._runs.items():
                if rid == run_id and drv != driver:
                    run.stop = max(run.stop, 1)
        deadline = self._clock() + timeout
        while (cur := self._current) is not None and cur[0] == run_id and cur[1] != driver:
            if self._clock() >= deadline:
                return False
            time.sleep(0.1)
        with self._mu:  # the killed driver's warm stacks here: its run is over on this slot
            others = [drv for rid, drv in self._runs if rid == run_id and drv != driver]
        for drv in others:
            self.end(run_id, drv)
        return True

    def retire(self, idle_seconds: float) -> bool:
        """Exit now, freeing this slot's unit, if no trial runs here and none ran for ``idle_seconds``
        (a driver of other forgelib code needs the unit); False (and nothing changes) otherwise, also
        while a run that has not ended keeps stacks here."""
        with self._mu:
            if any(run.node_run is not None for run in self._runs.values()):
                return False
        return retirement(idle_seconds)(self)

    def reap(self, run_id: str) -> str:
        """``forge reap --run RUN_ID`` on this node's engine (resuming a killed cluster run)."""
        from forgelib.runner import SubprocessRunner
        from forgelib.stacks.reaper import reap_dead_owners

        os.environ["DOCKER_HOST"] = node_engine()
        report = reap_dead_owners(SubprocessRunner(), run_id)
        return report.table() if report.failed else ""

    # ------------------------------------------------------------------------------------------ inside
    @contextlib.contextmanager
    def _working(self, order: TrialOrder, then: Callable[[], None] | None = None) -> Iterator[None]:
        """One order at a time here, the slot busy with ``order``'s run meanwhile (what the idle and
        silence watchers read); ``then``: run last, still holding the slot."""
        with self._trial:
            self._busy_since = self._clock()
            self._current = (order.run_id, order.driver)
            try:
                yield
            finally:
                self._current = None
                self._busy_since = None
                self._last_trial = self._clock()
                if then is not None:
                    then()

    def _run(self, bundle: Bundle, order: TrialOrder, code: str) -> TrialReturn:
        marks = {"entered": time.time()}
        got = self._open(bundle, order, code)
        if isinstance(got, TrialReturn):
            return got
        session, node, project, node_run = got
        marks["project"] = time.time()
        ret = run_trial(
            project,
            order,
            node=node,
            run=node_run,
            push=lambda items: self._push(session, items),
            stop_level=lambda: self._stop_level(session),
        )
        ret.marks = {**marks, **ret.marks, "cleaned": time.time()}
        return ret

    def _open(
        self, bundle: Bundle, order: TrialOrder, code: str
    ) -> TrialReturn | tuple[Session, dict[str, str], Project, NodeRun]:
        """The order's run here (its ``NodeRun``, started by its first order), or why not (a return)."""
        session = (order.run_id, order.driver)
        with self._mu:
            self._run_state(session)
        try:
            engine = node_engine()
            node = node_identity(self.node_id, engine)
        except ForgeError as e:
            return TrialReturn(node_identity(self.node_id, "?"), error=str(e))
        if code != self.code:
            return TrialReturn(
                node,
                error=f"this node runs other forgelib code (digest {self.code}) than the driver ({code}): "
                "install the same forgelib version on the driver and every node",
            )
        if self._stop_level(session) > 0:
            return TrialReturn(node, started=False)
        try:
            project = self._project(bundle)
        except ForgeError as e:
            return TrialReturn(node, error=str(e))
        os.environ["DOCKER_HOST"] = engine  # every docker/compose command of this process: the node's engine
        with self._mu:
            run = self._runs.setdefault(session, _Run(seen=self._clock()))
            if run.node_run is None:
                workdir = Path(tempfile.mkdtemp(dir=self.home, prefix="run-"))
                run.node_run = NodeRun.start(project, order, workdir)
                if run.drained:
                    run.node_run.no_more()
            node_run = run.node_run
        return session, node, project, node_run

    def _project(self, bundle: Bundle) -> Project:
        """The bundle unpacked, loaded and its seeds verified: once per digest, then from the cache."""
        if bundle.sha256 in self._projects:
            self._projects.move_to_end(bundle.sha256)
            return self._projects[bundle.sha256]
        dest = self.home / bundle.sha256[:16]
        shutil.rmtree(dest, ignore_errors=True)
        try:
            # One hash per seed: verify_seeds hashes the node's bytes against the digests the driver
            # verified, so the loader's own check of them against project.yaml (the same bytes, the same
            # digests: the bundle's sha256 covers project.yaml) would only hash every seed a second time.
            project = load_project_config(unpack(bundle, dest), verify_digests=False)
            verify_seeds(project, bundle.seeds)
        except ForgeError:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        self._projects[bundle.sha256] = project
        while len(self._projects) > BUNDLES_KEPT:
            old, _ = self._projects.popitem(last=False)
            shutil.rmtree(self.home / old[:16], ignore_errors=True)
        return project

    def _run_state(self, session: Session) -> _Run:
        run = self._runs.setdefault(session, _Run(seen=self._clock()))
        run.seen = self._clock()
        return run

    def _push(self, session: Session, items: list[Item]) -> None:
        with self._mu:
            self._runs.setdefault(session, _Run(seen=self._clock())).events.extend(items)

    def _stop_level(self, session: Session) -> int:
        with self._mu:
            run = self._runs.get(session)
            if run is None:
                return 0
            gone = self._clock() - run.seen > DRIVER_SILENCE
            return max(run.stop, 1 if gone else 0)

    def _forget_gone_runs(self) -> None:
        """End the runs whose driver is silent (gone), but not the one whose trial runs here now."""
        with self._mu:
            now = self._clock()
            cur = self._current
            gone = [s for s, run in self._runs.items() if now - run.seen > DRIVER_SILENCE and s != cur]
        for rid, drv in gone:
            try:
                self.end(rid, drv)
            except ForgeError:  # its stacks keep their owner labels: `forge reap` removes them
                continue

    def _end_silent_runs(self) -> None:
        while True:
            time.sleep(DRIVER_SILENCE / 6)
            with contextlib.suppress(Exception):  # a daemon's loop must survive; it retries next round
                self._forget_gone_runs()

    def _exit_when_idle(self) -> None:
        while True:
            time.sleep(IDLE_SECONDS / 10)
            if self._busy_since is None and self._clock() - self._last_trial > IDLE_SECONDS:
                shutil.rmtree(self.home, ignore_errors=True)
                os._exit(0)  # Ray records the actor dead and frees its resources and its name


def retirement(idle_seconds: float) -> Callable[[Any], bool]:
    """What ``Slot.retire`` does, as a function of the slot: also run, through Ray's ``__ray_call__``, in
    slots of forgelib code that predates ``retire`` (it needs only attributes they have: ``_trial``,
    ``_last_trial``, ``_clock``, ``home``). Made here rather than at module level so that Ray's pickler
    ships its code by value: by reference it would be looked up in the old slot's own forgelib, which
    has no such function. It decides holding the slot's trial lock, so no trial starts in between; it
    exits the way an idle slot does (Ray records the actor dead, frees its unit and its name)."""

    def retire(slot: Any) -> bool:
        import os
        import shutil

        lock = getattr(slot, "_trial", None)
        if lock is None or not hasattr(slot, "_last_trial") or not lock.acquire(blocking=False):
            return False
        try:
            if slot._clock() - slot._last_trial < idle_seconds:
                return False
            shutil.rmtree(slot.home, ignore_errors=True)
            os._exit(0)
        finally:
            lock.release()  # (reached only when it stays)

    return retire


__all__ = ["DRIVER_SILENCE", "IDLE_SECONDS", "RETIRE_IDLE_SECONDS", "Slot", "code_digest", "retirement"]
