"""The ``forge run --cluster`` side: trials placed on Ray nodes' slots, one source of truth on the driver.

Each node offers ``forge_docker: SLOTS``; each unit is held by one long-lived slot actor (``slot``) that
runs one trial at a time through ``node.run_trial`` (the local trial code path against the node's engine).
The driver keeps the queue: it hands a trial to a free slot (spreading over the nodes), drains the busy
slots' buffered events into ``events.jsonl`` every tick (a trial's events carry the node that ran it),
unpacks each finished trial's files into ``trials/<task>/<idx>/`` before appending the events that say it
finished, and so leaves a run directory of the same shape as a local run — summary.json, the table, JUnit
and ``--resume`` read it unchanged.

A trial whose slot (its node, or its process) is lost mid-trial is recorded as a failed attempt of kind
``node_lost`` and handed to another slot when ``lifecycle.retries_after_node_loss`` says so (the first loss
always, later ones from the plan's ``retries``, which the nodes spend too); its stack stays on the lost
node's engine under its owner labels for ``forge reap`` there. Ctrl-C: every busy slot is told to stop
(like a signal locally: launches refused and killed, stacks torn down); the driver waits for the trials to
come back torn down, then re-raises. Queued trials are never sent, so ``--resume`` runs them. However the
run ends, the driver then ends it on every slot it used (``Slot.end``): a ``--stacks warm`` run's warm
stacks and every run's shared stacks there are torn down (a killed driver's: by the slot's silence).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forgelib.cluster import RESOURCE
from forgelib.cluster.bundle import pack
from forgelib.cluster.connect import NodeInfo, import_ray
from forgelib.cluster.node import SetupReturn, TrialOrder, TrialReturn, tar_dir, untar_into
from forgelib.cluster.slot import IDLE_SECONDS, RETIRE_IDLE_SECONDS, Slot, code_digest, retirement
from forgelib.errors import ForgeError
from forgelib.grading.gradedoc import write_yaml
from forgelib.grading.score import failed_grade
from forgelib.run import events as ev
from forgelib.run.execute import Settings, record_attempt
from forgelib.run.lifecycle import Phase, Termination, retries_after_node_loss
from forgelib.run.results import TrialResult, shelve_attempt, trial_dir
from forgelib.run.setup import SETUP_FILE, SETUPS_DIR, SetupResult
from forgelib.spec.models import Project, Task
from forgelib.stacks.stack import Stack

log = logging.getLogger("forgelib.cluster")
NODE_LOST = "node_lost"
WAIT_SECONDS = 0.25  # how often the driver drains the busy slots while trials run
NAMESPACE = "forgelib"  # the slots' Ray namespace: every driver finds the same slots by name
TAKE_OVER_SECONDS = 180.0  # a resumed run waits this long for its killed driver's trials to come down
SLOT_CONCURRENCY = 4  # a slot serves drain/stop calls (and queues other drivers' trials) while one runs
# Ray renices every worker process to 15 (its worker_niceness, so the raylet and GCS stay responsive), and a
# slot's trial would inherit it: compose, docker exec and the readiness polls are children of the slot. A
# local trial runs them at the user's niceness, 0, and a pack's timeouts are set on local runs; at 15 a
# node's trial loses the CPU to every other process of that host at 0. So a slot asks for 0, as Ray's own job
# supervisor actor does for itself (no privilege needed: a worker starts at the raylet's niceness and only
# lowers its priority when asked). Parity, not speed: a node's trial should run as a local one does, with
# the same timeouts meaning the same thing (benchmarks/README.md, "Figures behind the code's choices").
SLOT_RUNTIME_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}


@dataclass(frozen=True)
class SlotRef:
    node_id: str
    index: int
    actor: Any  # the slot's Ray actor handle


@dataclass
class _Attempt:
    """One order of a trial to a slot (a trial lost with its node gets a new one)."""

    task: Task
    index: int
    retries_left: int  # of the plan's retries: sent with the order, less what the node spends (trial_attempt)
    node: str | None = None  # the node id its events came from
    phase: str = Phase.PENDING.value
    started: float = 0.0
    number: int = 1  # the attempt number the node's events report
    losses: int = 0  # nodes lost under this trial so far
    avoid: frozenset[str] = field(default_factory=frozenset)  # nodes lost under this trial


class Cluster:
    """A joined cluster for one run: its slots (started by the first run, reused after) and the project."""

    def __init__(self, project: Project, output: Path, nodes: Sequence[NodeInfo]) -> None:
        self.ray = import_ray()
        self.nodes = list(nodes)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._affinity = NodeAffinitySchedulingStrategy
        self.code = code_digest()
        # This driver's token, on its trials' orders and its drains and stops: a slot tells its events and
        # stops from those of a killed driver of the same run (resumed by this one) by it.
        self.driver = uuid.uuid4().hex[:16]
        self.bundle_ref = self.ray.put(pack(project, exclude=[output]))
        self.used: dict[tuple[str, int], SlotRef] = {}  # the slots this driver handed trials to
        # The slots holding a task's setup checkpoint on their node's engine (the capturing one, and one
        # adopting slot per other node): their run ends after the others', so that no other slot's warm
        # stack still runs on the checkpoint's images when they remove it.
        self.holders: set[tuple[str, int]] = set()
        actor = self.ray.remote(Slot)
        # Interleaved by node (n0s0, n1s0, n0s1, ...): a run smaller than the cluster still spreads out.
        self.slots = [
            SlotRef(n.node_id, i, self._slot(actor, n.node_id, i))
            for i in range(max(n.slots for n in self.nodes))
            for n in self.nodes
            if i < n.slots
        ]
        # Each slot's "started" answer: a new slot waits for its unit of the node (held by another run's or
        # other forgelib code's slot), and every call to it blocks until then. The driver never waits on a
        # slot that has not started: its drains and stops skip it, and Ctrl-C cancels it (``cancel``).
        self._ready = {(s.node_id, s.index): s.actor.__ray_ready__.remote() for s in self.slots}
        self._started: set[tuple[str, int]] = set()  # answered once: asked no more (drains ask every tick)

    def _slot(self, actor: Any, node_id: str, index: int) -> Any:
        """The node's slot ``index`` for this forgelib code: the running one, or started now (a new slot
        answers once its process has started; calls queue until then)."""
        return actor.options(
            name=f"forge-slot-{node_id}-{index}-{self.code}",
            namespace=NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            max_restarts=0,
            max_task_retries=0,
            max_concurrency=SLOT_CONCURRENCY,
            num_cpus=0,
            resources={RESOURCE: 1},
            scheduling_strategy=self._affinity(node_id, soft=False),
            runtime_env=SLOT_RUNTIME_ENV,
        ).remote(node_id)

    def other_code_slots(self) -> list[str]:
        """Running slots of other forgelib code on this run's nodes: they hold forge_docker units (so this
        run's slots may wait for them) until they idle out."""
        from ray.util import list_named_actors

        ours = {n.node_id for n in self.nodes}
        names = [a["name"] for a in list_named_actors(all_namespaces=True)
                 if a.get("namespace") == NAMESPACE]  # fmt: skip
        return sorted(
            n for n in names
            if n.startswith("forge-slot-") and not n.endswith(f"-{self.code}") and n.split("-")[2] in ours
        )  # fmt: skip

    def retire_other_code_slots(self, names: Sequence[str]) -> list[str]:
        """Retire the idle ones of ``names`` (slots of other forgelib code on this run's nodes) so that this
        run's slots get their units now instead of when they idle out; returns those still busy."""
        calls = []
        for name in names:
            try:
                handle = self.ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:  # gone meanwhile
                continue
            retire = getattr(handle, "retire", None)  # slots of forgelib code that has Slot.retire
            if retire is not None:
                calls.append((name, retire.remote(RETIRE_IDLE_SECONDS)))
            else:  # older slots: the same decision through Ray's __ray_call__ (a DeveloperAPI actor method
                # that runs a function on the actor's instance; Ray ships the function by value)
                calls.append((name, handle.__ray_call__.remote(retirement(RETIRE_IDLE_SECONDS))))
        busy = []
        for name, ref in calls:
            try:
                self.ray.get(ref)  # returns only when the slot stays: a retired one exits first
            except self.ray.exceptions.RayError:  # exited (retired), or died on its own: its unit is free
                continue
            busy.append(name)
        return busy

    def reap(self, run_id: str) -> None:
        """Resuming ``run_id``: stop what its killed driver still runs on the slots (they stop it by
        themselves only after ``DRIVER_SILENCE``), wait for it to come down, then reap its leftovers."""
        taken = self.ray.get(
            [s.actor.take_over.remote(run_id, self.driver, TAKE_OVER_SECONDS) for s in self.slots]
        )
        if not all(taken):
            busy = sorted({s.node_id for s, ok in zip(self.slots, taken, strict=True) if not ok})
            raise ForgeError(
                f"cannot resume {run_id} yet: trials of its killed driver are still tearing down on node(s) "
                f"{', '.join(busy)}; try again in a minute"
            )
        first = {s.node_id: s for s in reversed(self.slots)}
        failed = [t for t in self.ray.get([s.actor.reap.remote(run_id) for s in first.values()]) if t]
        if failed:
            raise ForgeError(
                f"cannot resume {run_id}: leftovers of the killed session remain:\n" + "\n".join(failed)
            )

    def end(self, run_id: str) -> None:
        """The run is over: every slot it used tears its stacks of the run down (a lost slot's went with
        it); raises ``ForgeError`` naming the slots that could not."""
        failed = []
        for holders in (False, True):
            refs = [
                (s, s.actor.end.remote(run_id, self.driver))
                for key, s in self.used.items()
                if ((key in self.holders) is holders) and self.started(s)
            ]
            for s, ref in refs:
                try:
                    self.ray.get(ref)
                except self.ray.exceptions.RayTaskError as e:  # the slot could not tear a stack down
                    failed.append(f"node {s.node_id} slot {s.index}: {str(e).splitlines()[-1]}")
                except self.ray.exceptions.RayError:  # lost with its node or process: reaped there
                    continue
        if failed:
            raise ForgeError(
                "ending the run on its nodes failed (forge reap on those nodes removes what is left):\n"
                + "\n".join(failed)
            )

    def started(self, slot: SlotRef) -> bool:
        """Whether ``slot``'s process has started (or died after starting): calls to it return."""
        key = (slot.node_id, slot.index)
        if key in self._started:
            return True
        ref = self._ready.get(key)
        if ref is None or self.ray.wait([ref], timeout=0)[0]:
            self._started.add(key)
            return True
        return False

    def cancel(self, slot: SlotRef) -> None:
        """A slot that has not started: its creation cancelled, with the calls queued for it. Nothing of it
        ran (should it start right now, its trial's stack is a dead owner's for ``forge reap``)."""
        self.ray.kill(slot.actor, no_restart=True)

    def alive(self, node_id: str | None) -> bool:
        return any(n["NodeID"] == node_id and n.get("Alive") for n in self.ray.nodes())


@dataclass(frozen=True)
class ClusterBackend:
    """``run_project``'s run-level hooks on a cluster (trials provision on their nodes, not here)."""

    cluster: Cluster

    def provision(self, task: Task, **kwargs: Any) -> Stack:
        raise ForgeError("bug: a cluster run provisions on its nodes")

    def capture_logs(self, trial: Stack, dest_dir: Path, tail_lines: int) -> None:
        raise ForgeError("bug: a cluster run captures logs on its nodes")

    def teardown(self, trial: Stack, *, graceful: bool = True) -> float:
        raise ForgeError("bug: a cluster run tears down on its nodes")

    def run_host(self, argv: Any, **kwargs: Any) -> Any:
        raise ForgeError("bug: a cluster run grades (and runs its judges) on its nodes")

    def launch_host(self, argv: Any, **kwargs: Any) -> Any:
        raise ForgeError("bug: a cluster run has no command agents (forge run refuses --agent there)")

    def checkpoint(self, trial: Stack, run_id: str) -> str:
        raise ForgeError("bug: a cluster run checkpoints a task's setup on its node (ClusterExecutor)")

    def discard_leftovers(self, run_id: str) -> None:
        self.cluster.reap(run_id)

    def finish_run(self, run_id: str) -> None:
        self.cluster.end(run_id)


class ClusterExecutor:
    """``run_project``'s executor for a cluster: same ``run(trials)`` contract as ``execute.Executor``."""

    def __init__(
        self,
        cluster: Cluster,
        events: ev.EventLog,
        settings: Settings,
        progress: Callable[[str], None],
        profiles: tuple[str, ...] = (),
        *,
        stacks: str = "fresh",
        snapshots: bool = False,
    ) -> None:
        self.c = cluster
        self.profiles = profiles
        self.stacks = stacks
        self.snapshots = snapshots
        self.ray = cluster.ray
        self.events = events
        self.s = settings
        self.say = progress
        self._queue: deque[_Attempt] = deque()
        self._free: list[SlotRef] = list(cluster.slots)
        self._inflight: dict[Any, tuple[_Attempt, SlotRef]] = {}
        self._by_key: dict[ev.TrialKey, _Attempt] = {}
        self._stopping = False
        self._drained = False  # the slots were told the queue is empty (``_tell_drained``)
        self._notices: list[Any] = []  # refs of those calls, read back as they finish
        self._setups: dict[str, SetupResult] = {}  # each setup task's, run once on one node (``_setup``)
        self._unfit: dict[str, frozenset[str]] = {}  # task -> nodes its checkpoint could not be copied to

    def run(self, trials: Sequence[tuple[Task, int]]) -> list[TrialResult]:
        nodes = len({s.node_id for s in self.c.slots})
        self.say(f"cluster: {nodes} node(s), {len(self.c.slots)} forge slot(s)")
        if stale := self.c.other_code_slots():
            busy = self.c.retire_other_code_slots(stale)
            if retired := len(stale) - len(busy):
                self.say(f"retired {retired} idle slot(s) of other forgelib code on these nodes")
            if busy:
                self.say(
                    f"warning: {len(busy)} slot(s) of other forgelib code on these nodes are busy "
                    f"({', '.join(busy[:4])}{', ...' if len(busy) > 4 else ''}); this run's slots wait for "
                    f"their units until they idle out ({IDLE_SECONDS / 60:.0f} min), or restart those "
                    f"nodes' Ray"
                )
        try:
            for task in {t.name: t for t, _ in trials if t.setup is not None}.values():
                self._setup(task)
            self._queue.extend(
                _Attempt(task, index, self.s.retries, avoid=self._unfit.get(task.name, frozenset()))
                for task, index in trials
            )
            while self._queue or self._inflight:
                self._dispatch()
                self._tick(rerun=True)
        except KeyboardInterrupt:
            self._interrupt()
            raise
        return []

    # ------------------------------------------------------------------------------------ tasks' setups
    def _setup(self, task: Task) -> None:
        """``task``'s setup, once for the run, on one slot (``Slot.setup``); its checkpoint then copied to
        one slot of every other node (``Slot.export`` -> Ray's object store -> ``Slot.adopt``: loaded and
        verified there), so every node's trials fork the same state. The setup's files land in
        ``setups/<task>/`` as a local run's; a node the copy failed on runs none of the task's trials."""
        slot = self._free[0]
        order = self._order(task, 0, self.s.retries, b"")
        self.c.used[(slot.node_id, slot.index)] = slot
        self.c.holders.add((slot.node_id, slot.index))
        d = self.s.run_dir / SETUPS_DIR / task.name
        t0 = time.monotonic()
        try:
            asked = slot.actor.setup.remote(self.c.bundle_ref, order, self.c.code)
            ret: SetupReturn = self._await(asked, [slot])
            error = ret.error
        except self.ray.exceptions.RayError as e:
            ret, error = SetupReturn({"id": slot.node_id}), f"its node was lost: {str(e).splitlines()[0]}"
        if ret.files:
            untar_into(ret.files, d)
        result = ret.result
        if result is None:
            stopped = error is None
            result = SetupResult(
                task.name, False, None, time.monotonic() - t0, {}, d,
                error="interrupted" if stopped else error, interrupted=stopped,
            )  # fmt: skip
            self.events.append(ev.SETUP_FINISHED, **result.record())
        result = dataclasses.replace(result, dir=d)
        self._setups[task.name] = result
        if self._stopping:  # Ctrl-C during the setup: its record is in, what it took ends with the run
            raise KeyboardInterrupt
        if not result.ok or result.checkpoint is None:
            return
        others = list({s.node_id: s for s in reversed(self._free) if s.node_id != slot.node_id}.values())
        if not others:
            return
        t1 = time.monotonic()
        copy = slot.actor.export.remote(self.s.run_id, self.c.driver, result.checkpoint)
        adopts = []
        for other in others:
            self.c.used[(other.node_id, other.index)] = other
            self.c.holders.add((other.node_id, other.index))
            adopts.append((other, other.actor.adopt.remote(self.c.bundle_ref, order, self.c.code, copy)))
        unfit: set[str] = set()
        marks: dict[str, float] = {}
        for other, ref in adopts:
            try:
                back: TrialReturn = self._await(ref, [other])
                why, marks = back.error, back.marks or marks
            except self.ray.exceptions.RayError as e:
                why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if why:
                unfit.add(other.node_id)
                self.say(
                    f"{task.name} setup        WARNING node {other.node_id[:12]} runs none of its trials "
                    f"(its checkpoint could not be copied there): {why}"
                )
        self._unfit[task.name] = frozenset(unfit)
        if self._stopping:
            raise KeyboardInterrupt
        copied = len(others) - len(unfit)
        seconds = time.monotonic() - t1
        copies = {
            "nodes": copied, "seconds": round(seconds, 3), "bytes": int(marks.get("bytes", 0)),
            "load_seconds": round(marks.get("adopt", 0.0), 3), "failed": sorted(unfit),
        }  # fmt: skip
        d.mkdir(parents=True, exist_ok=True)
        write_yaml(d / SETUP_FILE, {**result.record(), "dir": str(d), "copies": copies})
        self.say(
            f"{task.name} setup        checkpoint {result.checkpoint} copied to {copied} other node(s) "
            f"({marks.get('bytes', 0) / 1e6:.1f} MB) in {seconds:.1f}s"
        )

    def _await(self, ref: Any, slots: list[SlotRef]) -> Any:
        """``ref``'s value, draining ``slots``' events meanwhile. Ctrl-C stops those slots (a second one
        hurries them) and still waits for the value, so that what they took is on record for the run's
        end to remove; it sets ``_stopping``, and the caller raises once that record is in."""
        level = 0
        while True:
            try:
                done, _ = self.ray.wait([ref], num_returns=1, timeout=WAIT_SECONDS)
                self._drain(slots)
                if done:
                    break
            except KeyboardInterrupt:
                level = min(level + 1, 2)
                self._stopping = True
                for s in slots:
                    s.actor.stop.remote(self.s.run_id, level, self.c.driver)
        return self.ray.get(ref)

    def _dispatch(self) -> None:
        while self._queue and self._free and not self._stopping:
            a = self._queue[0]
            slot = next((s for s in self._free if s.node_id not in a.avoid), None)
            if slot is None:
                if not self._inflight:  # only the lost nodes' slots are left: run it there after all
                    slot = self._free[0]
                else:
                    return
            self._queue.popleft()
            self._free.remove(slot)
            self._submit(a, slot)
        if not self._queue and not self._drained:
            self._tell_drained()
        if self._queue and not self._free and not self._inflight:
            raise ForgeError(
                f"every forge slot of the cluster is gone; {len(self._queue)} trial(s) were not run "
                f"(forge run --resume {self.s.run_id} --cluster ... runs them once nodes are back)"
            )

    def _tell_drained(self) -> None:
        """Every trial queued was handed out: a warm run's slots keep a stack given back from now on as it
        is (``Slot.no_more``), so the run's end need not wait for resets no trial needs. Not waited for
        (a slot still starting answers when it has); a rerun queued later takes such a stack and resets
        it first, and the slots are told again once the queue empties again."""
        self._drained = True
        if self.stacks != "warm":
            return
        for slot in self.c.used.values():
            self._notices.append(slot.actor.no_more.remote(self.s.run_id, self.c.driver))

    def _read_notices(self) -> None:
        """The ``no_more`` calls that finished (an error there only cost a reset ahead: nothing to do)."""
        if not self._notices:
            return
        done, self._notices = self.ray.wait(self._notices, num_returns=len(self._notices), timeout=0)
        for ref in done:
            with contextlib.suppress(self.ray.exceptions.RayError):
                self.ray.get(ref)

    def _order(self, task: Task, index: int, retries: int, prior: bytes) -> TrialOrder:
        return TrialOrder(
            run_id=self.s.run_id,
            task=task.name,
            index=index,
            timeouts=self.s.timeouts,
            capture_logs_on_success=self.s.capture_logs_on_success,
            log_tail_lines=self.s.log_tail_lines,
            retries=retries,  # the node's executor spends them (lifecycle.should_retry) and no more
            profiles=self.profiles,
            prior=prior,
            driver=self.c.driver,
            stacks=self.stacks,
            snapshots=self.snapshots,
            setup=self._setups.get(task.name),
        )

    def _submit(self, a: _Attempt, slot: SlotRef) -> None:
        d = trial_dir(self.s.run_dir, a.task.name, a.index)
        order = self._order(a.task, a.index, a.retries_left, tar_dir(d) if d.is_dir() else b"")
        self.c.used[(slot.node_id, slot.index)] = slot
        a.started = time.time()
        a.node = slot.node_id
        ref = slot.actor.run.remote(self.c.bundle_ref, order, self.c.code)
        self._inflight[ref] = (a, slot)
        self._by_key[(a.task.name, a.index)] = a

    def _tick(self, *, rerun: bool) -> None:
        refs = list(self._inflight)
        if not refs:
            return
        done, rest = self.ray.wait(refs, num_returns=1, timeout=WAIT_SECONDS)
        if done and rest:
            more, _ = self.ray.wait(rest, num_returns=len(rest), timeout=0)
            done += more
        lost: list[tuple[_Attempt, str]] = []
        finished: list[tuple[_Attempt, TrialReturn]] = []
        busy = [slot for _, slot in self._inflight.values()]  # finished ones too: their last events
        for ref in done:
            a, slot = self._inflight.pop(ref)
            try:
                ret: TrialReturn = self.ray.get(ref)
            except self.ray.exceptions.RayTaskError as e:  # our code raised on the node: a bug
                self._free.append(slot)
                finished.append((a, TrialReturn({"id": a.node or "?"}, error=f"internal error: {e}")))
                continue
            except self.ray.exceptions.RayError as e:  # the node, its raylet or the slot's process died
                lost.append((a, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
                continue
            self._free.append(slot)
            log.debug(
                "cluster trial %s[%s] on %s: sent %.3f, back %.3f, node marks %s",
                a.task.name, a.index, slot.node_id[:12], a.started, time.time(), ret.marks,
            )  # fmt: skip
            if not ret.started:  # a stop came first: nothing ran, nothing was recorded
                continue
            if ret.files:  # before its trial_finished event is appended below
                dest = trial_dir(self.s.run_dir, a.task.name, a.index)
                if dest.exists():
                    shutil.rmtree(dest)
                untar_into(ret.files, dest)
            finished.append((a, ret))
        self._drain(busy)
        self._read_notices()
        for a, ret in finished:
            if ret.error is not None:
                self._record_here(a, Termination.PROVISION_ERROR, ret.error, "node", ret.node)
        for a, why in lost:
            self._lost(a, why, rerun=rerun)

    def _drain(self, slots: list[SlotRef]) -> None:
        """Every busy slot's buffered events, appended in the order each slot recorded them (a slot that has
        not started has none, and a call to it would wait until it starts)."""
        refs = [s.actor.drain.remote(self.s.run_id, self.c.driver) for s in slots if self.c.started(s)]
        for ref in refs:
            try:
                items = self.ray.get(ref)
            except self.ray.exceptions.RayError:  # a lost slot: its trial comes back as lost
                continue
            for item, payload in items:
                if item == "say":
                    self.say(str(payload))
                    continue
                kind, fields = payload
                if kind == ev.SETUP_FINISHED:  # its files are unpacked here, not left on the node
                    fields = {**fields, "dir": str(self.s.run_dir / SETUPS_DIR / str(fields.get("task")))}
                a = self._by_key.get((fields.get("task"), fields.get("index")))
                if a is not None:
                    a.node = fields.get("node", a.node)
                    a.phase = fields.get("phase", a.phase)
                    a.number = int(fields.get("attempt") or a.number)
                    if kind == ev.TRIAL_ATTEMPT:  # the node retried: one of the plan's retries is spent
                        a.retries_left -= 1
                self.events.append(kind, **fields)

    def _lost(self, a: _Attempt, why: str, *, rerun: bool) -> None:
        where = f"node {a.node}" if a.node else "its node"
        gone = "NodeDiedError" in why or not self.c.alive(a.node)
        state = "lost" if gone else "alive, but the trial's slot process died"
        # The phase is the last one the driver drained from the slot: a node that dies between two drains
        # takes its newer events with it, so "pending" only says that none had come back yet.
        when = f"during {a.phase}" if a.phase != Phase.PENDING.value else "before its progress came back"
        reason = f"{NODE_LOST}: {where} ({state}) {when}: {why}"
        if not rerun:  # stopping: left unfinished, so `--resume` runs it
            self.say(f"{a.task.name}[{a.index}] {reason}")
            return
        left = retries_after_node_loss(a.retries_left, a.losses + 1)
        self._record_here(
            a, Termination.ENGINE_LOST, reason, NODE_LOST, {"id": a.node or "?"}, retried=left is not None
        )
        if left is not None:
            self.say(f"{a.task.name}[{a.index}] {reason}; running it again on another node")
            avoid = a.avoid | {a.node} if a.node else a.avoid
            # Its attempt number counts on from the lost one, also when it is lost before any event.
            again = _Attempt(
                a.task, a.index, left, number=a.number + 1, losses=a.losses + 1, avoid=frozenset(avoid)
            )
            self._queue.appendleft(again)
            self._drained = False

    def _record_here(
        self,
        a: _Attempt,
        term: Termination,
        error: str,
        stage: str,
        node: dict[str, str],
        *,
        retried: bool = False,
    ) -> None:
        """An attempt the node could not finish, recorded here through the executor's ``record_attempt``; a
        retried one (``trial_attempt``, as the local retries record it) is shelved under attempts/<n>."""
        threshold = a.task.grading.threshold if a.task.grading else 1.0
        r = TrialResult(
            run_id=self.s.run_id,
            task=a.task.name,
            index=a.index,
            termination=term,
            grade=failed_grade([error], threshold),
            started_at=a.started,
            finished_at=time.time(),
            provision_stage=stage,
            error=error,
            node=node,
            attempt=a.number,
            retried=retried,
        )
        if a.phase == Phase.PENDING.value:  # never started on the node: its attempt still counts
            self.events.append(
                ev.TRIAL_STATE, task=a.task.name, index=a.index, phase="provisioning", attempt=a.number
            )
        d = trial_dir(self.s.run_dir, a.task.name, a.index)
        record_attempt(self.events, self.say, d, r, error_stage=stage)
        if retried:  # no stack here to tear down first: its files go to attempts/<n> now
            shelve_attempt(d, a.number)

    def _interrupt(self) -> None:
        self._stopping = True
        self._queue.clear()  # never sent: `--resume` runs them
        for ref, (_, slot) in list(self._inflight.items()):
            if not self.c.started(slot):  # its trial never began: unsent, as the queue's
                self.c.cancel(slot)
                del self._inflight[ref]
        self._stop_slots(1)
        self.say("interrupted: no new trials; every node tears down its live stacks")
        self.events.append(ev.RUN_INTERRUPTED)
        level = 1
        while self._inflight:
            try:
                self._tick(rerun=False)
            except KeyboardInterrupt:
                level = min(level + 1, 2)
                self._stop_slots(level)

    def _stop_slots(self, level: int) -> None:
        refs = [
            slot.actor.stop.remote(self.s.run_id, level, self.c.driver) for _, slot in self._inflight.values()
        ]
        for ref in refs:
            try:
                self.ray.get(ref)
            except self.ray.exceptions.RayError:  # a lost slot has nothing left to stop
                continue


__all__ = ["NODE_LOST", "Cluster", "ClusterBackend", "ClusterExecutor"]
