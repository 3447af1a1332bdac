"""The ``forge run --cluster`` side: trials placed on Ray nodes, one source of truth on the driver.

Each trial is one Ray task needing one ``forge_docker`` slot; it runs ``node.run_trial`` (the local trial
code path against the node's engine). The driver alone writes the run directory: it drains the relay into
``events.jsonl`` (a trial's events carry the node that ran it), unpacks each finished trial's files into
``trials/<task>/<idx>/`` before appending the events that say it finished, and so leaves a run directory
of the same shape as a local run — summary.json, the table, JUnit and ``--resume`` read it unchanged.

A trial whose node (or worker process) is lost mid-trial is recorded as a failed attempt of kind
``node_lost`` and placed again, once; its stack stays on the lost node's engine under its owner labels for
``forge reap`` there. Ctrl-C: every node is told to stop (like a signal locally: launches refused and
killed, stacks torn down); the driver waits for the trials to come back torn down, then re-raises.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgelib.cluster import RESOURCE
from forgelib.cluster.bundle import Bundle, pack
from forgelib.cluster.connect import NodeInfo, import_ray
from forgelib.cluster.node import TrialOrder, TrialReturn, run_trial, tar_dir, untar_into
from forgelib.cluster.relay import Relay
from forgelib.errors import ForgeError
from forgelib.run import events as ev
from forgelib.run.execute import Settings, TrialHandle
from forgelib.run.grading import failed_grade
from forgelib.run.lifecycle import Phase, Termination
from forgelib.run.results import TrialResult, shelve_attempt, trial_dir, write_trial
from forgelib.spec.models import Project, Task

NODE_LOST = "node_lost"
WAIT_SECONDS = 0.25  # how often the driver drains the relay while trials run
ATTEMPTS = 2  # a trial whose node is lost runs once more


def _remote_trial(bundle: Bundle, order: TrialOrder, relay: Any) -> TrialReturn:
    """The Ray task (on a node): the relay's calls are awaited, so events arrive before the return."""
    import ray

    return run_trial(
        bundle,
        order,
        node_id=ray.get_runtime_context().get_node_id(),
        push=lambda items: ray.get(relay.push.remote(items)),
        stop_level=lambda: int(ray.get(relay.stop_level.remote())),
    )


def _reap_here(run_id: str) -> str:
    """``forge reap --run RUN_ID`` on a node's engine (resuming a killed cluster run)."""
    import os

    from forgelib.cluster.node import node_engine
    from forgelib.custody import reap_dead_owners
    from forgelib.runner import SubprocessRunner

    os.environ["DOCKER_HOST"] = node_engine()
    report = reap_dead_owners(SubprocessRunner(), run_id)
    return report.table() if report.failed else ""


@dataclass
class _Attempt:
    task: Task
    index: int
    attempt: int
    node: str | None = None  # the node id its events came from
    phase: str = Phase.PENDING.value
    started: float = 0.0
    number: int = 1  # the attempt number the node's events report


class Cluster:
    """A joined cluster for one run: the relay, the shipped project, the remote functions."""

    def __init__(self, project: Project, output: Path, nodes: Sequence[NodeInfo]) -> None:
        self.ray = import_ray()
        self.nodes = list(nodes)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._affinity = NodeAffinitySchedulingStrategy
        here = self.ray.get_runtime_context().get_node_id()
        # On the driver's own node, so the relay lives exactly as long as the driver and no worker node's
        # loss takes the run's events with it.
        self.relay = (
            self.ray.remote(num_cpus=0)(Relay)
            .options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
            .remote()
        )
        self.bundle_ref = self.ray.put(pack(project, exclude=[output]))
        self.trial_fn = self.ray.remote(num_cpus=0, resources={RESOURCE: 1}, max_retries=0)(_remote_trial)

    def slots(self) -> int:
        return sum(n.slots for n in self.nodes)

    def reap(self, run_id: str) -> None:
        fn = self.ray.remote(num_cpus=0, max_retries=0)(_reap_here)
        refs = [
            fn.options(scheduling_strategy=self._affinity(n.node_id, soft=False)).remote(run_id)
            for n in self.nodes
        ]
        failed = [t for t in self.ray.get(refs) if t]
        if failed:
            raise ForgeError(
                f"cannot resume {run_id}: leftovers of the killed session remain:\n" + "\n".join(failed)
            )

    def alive(self, node_id: str | None) -> bool:
        return any(n["NodeID"] == node_id and n.get("Alive") for n in self.ray.nodes())


@dataclass(frozen=True)
class ClusterBackend:
    """``run_project``'s run-level hooks on a cluster (trials provision on their nodes, not here)."""

    cluster: Cluster

    def provision(self, task: Task, **kwargs: Any) -> TrialHandle:
        raise ForgeError("bug: a cluster run provisions on its nodes")

    def capture_logs(self, trial: TrialHandle, dest_dir: Path, tail_lines: int) -> None:
        raise ForgeError("bug: a cluster run captures logs on its nodes")

    def teardown(self, trial: TrialHandle, *, graceful: bool = True) -> float:
        raise ForgeError("bug: a cluster run tears down on its nodes")

    def run_host(self, argv: Any, **kwargs: Any) -> Any:
        raise ForgeError("bug: a cluster run grades (and runs its judges) on its nodes")

    def discard_leftovers(self, run_id: str) -> None:
        self.cluster.reap(run_id)

    def finish_run(self, run_id: str) -> None:
        return None


class ClusterExecutor:
    """``run_project``'s executor for a cluster: same ``run(trials)`` contract as ``execute.Executor``."""

    def __init__(
        self,
        cluster: Cluster,
        events: ev.EventLog,
        settings: Settings,
        progress: Callable[[str], None],
        profiles: tuple[str, ...] = (),
    ) -> None:
        self.c = cluster
        self.profiles = profiles
        self.ray = cluster.ray
        self.events = events
        self.s = settings
        self.say = progress
        self._inflight: dict[Any, _Attempt] = {}
        self._by_key: dict[ev.TrialKey, _Attempt] = {}

    def run(self, trials: Sequence[tuple[Task, int]]) -> list[TrialResult]:
        self.say(f"cluster: {len(self.c.nodes)} node(s), {self.c.slots()} forge slot(s)")
        for task, index in trials:
            self._submit(_Attempt(task, index, 1))
        try:
            while self._inflight:
                self._tick(rerun=True)
        except KeyboardInterrupt:
            self._interrupt()
            raise
        return []

    def _submit(self, a: _Attempt) -> None:
        order = TrialOrder(
            run_id=self.s.run_id,
            task=a.task.name,
            index=a.index,
            timeouts=self.s.timeouts,
            capture_logs_on_success=self.s.capture_logs_on_success,
            log_tail_lines=self.s.log_tail_lines,
            retries=self.s.retries,
            profiles=self.profiles,
            prior=tar_dir(d) if (d := trial_dir(self.s.run_dir, a.task.name, a.index)).is_dir() else b"",
        )
        a.started = time.time()
        ref = self.c.trial_fn.remote(self.c.bundle_ref, order, self.c.relay)
        self._inflight[ref] = a
        self._by_key[(a.task.name, a.index)] = a

    def _tick(self, *, rerun: bool) -> None:
        refs = list(self._inflight)
        done, rest = self.ray.wait(refs, num_returns=1, timeout=WAIT_SECONDS)
        if done and rest:
            more, _ = self.ray.wait(rest, num_returns=len(rest), timeout=0)
            done += more
        lost: list[tuple[_Attempt, str]] = []
        finished: list[tuple[_Attempt, TrialReturn]] = []
        for ref in done:
            a = self._inflight.pop(ref)
            try:
                ret: TrialReturn = self.ray.get(ref)
            except self.ray.exceptions.RayTaskError as e:  # our code raised on the node: a bug
                finished.append((a, TrialReturn({"id": a.node or "?"}, error=f"internal error: {e}")))
                continue
            except self.ray.exceptions.RayError as e:  # the node, its raylet or the worker died
                lost.append((a, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
                continue
            if ret.files:  # before its trial_finished event is appended below
                dest = trial_dir(self.s.run_dir, a.task.name, a.index)
                if dest.exists():
                    shutil.rmtree(dest)
                untar_into(ret.files, dest)
            finished.append((a, ret))
        self._drain()
        for a, ret in finished:
            if ret.error is not None:
                self._record_here(a, Termination.PROVISION_ERROR, ret.error, "node", ret.node)
        for a, why in lost:
            self._lost(a, why, rerun=rerun)

    def _drain(self) -> None:
        for item, payload in self.ray.get(self.c.relay.drain.remote()):
            if item == "say":
                self.say(str(payload))
                continue
            kind, fields = payload
            a = self._by_key.get((fields.get("task"), fields.get("index")))
            if a is not None:
                a.node = fields.get("node", a.node)
                a.phase = fields.get("phase", a.phase)
                a.number = int(fields.get("attempt") or a.number)
            self.events.append(kind, **fields)

    def _lost(self, a: _Attempt, why: str, *, rerun: bool) -> None:
        where = f"node {a.node}" if a.node else "its node"
        gone = "NodeDiedError" in why or not self.c.alive(a.node)
        state = "lost" if gone else "alive, but the trial's worker died"
        reason = f"{NODE_LOST}: {where} ({state}) during {a.phase}: {why}"
        if not rerun:  # stopping: left unfinished, so `--resume` runs it
            self.say(f"{a.task.name}[{a.index}] {reason}")
            return
        final = a.attempt >= ATTEMPTS
        self._record_here(
            a, Termination.ENGINE_LOST, reason, NODE_LOST, {"id": a.node or "?"}, retried=not final
        )
        if not final:
            self.say(f"{a.task.name}[{a.index}] {reason}; running it again on another node")
            self._submit(_Attempt(a.task, a.index, a.attempt + 1))

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
        """An attempt the node could not finish: its record and files written by the driver; a retried one
        (``trial_attempt``, as the local retries record it) is shelved under attempts/<n>."""
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
        write_trial(d, r)
        fields = {**r.event_fields(), "error_stage": stage}
        if retried:
            self.events.append(ev.TRIAL_ATTEMPT, **fields)
            shelve_attempt(d, a.number)
        else:
            self.events.append(ev.TRIAL_FINISHED, **fields)
        word = "retrying" if retried else "done"
        self.say(f"{r.task}[{r.index}] {word:<13} {r.wall_seconds:7.1f}s {r.status} {stage}")

    def _interrupt(self) -> None:
        level = 1
        self.ray.get(self.c.relay.set_stop.remote(level))
        self.say("interrupted: no new trials; every node tears down its live stacks")
        self.events.append(ev.RUN_INTERRUPTED)
        while self._inflight:
            try:
                self._tick(rerun=False)
            except KeyboardInterrupt:
                level = min(level + 1, 2)
                self.ray.get(self.c.relay.set_stop.remote(level))


__all__ = ["NODE_LOST", "Cluster", "ClusterBackend", "ClusterExecutor"]
