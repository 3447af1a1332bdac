"""The orchestrator: trials on a thread pool, each walked through ``lifecycle`` one phase at a time.

Each trial is fully isolated (its own compose project, its own directory); the only shared things are the
event log (thread-safe) and the progress stream. The Docker work sits behind ``Backend`` so the whole
orchestrator runs in unit tests with a fake. On Ctrl-C: stop launching, tear down every live stack, let
the in-flight workers wind down, record ``run_interrupted``, re-raise.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Unpack

from forgelib.docker.engine import unreachable
from forgelib.errors import ForgeError, Interrupted, ProvisionError
from forgelib.grading.checks import ReadOnce, evaluate
from forgelib.grading.judge import HostRun, JudgeError, run_judge
from forgelib.grading.score import (
    CheckOutcome,
    ComponentResult,
    Grade,
    failed_grade,
    grade_by,
    judge_component,
    mutates,
    threshold_of,
)
from forgelib.grading.traces import TRACE_FILE, read_trace
from forgelib.run import events as ev
from forgelib.run import manifest, tools
from forgelib.run.agent import (
    INSTRUCTION_FILE,
    MANIFEST_FILE,
    AgentResult,
    HostLauncher,
    agent_env,
    in_service_files,
    run_agent,
    write_inputs,
)
from forgelib.run.ids import new_run_id
from forgelib.run.lifecycle import Flow, Outcome, Phase, Progress, Termination, advance, start
from forgelib.run.oracle import OracleResult, effective_timeout, run_oracle
from forgelib.run.ready import ready_breakdown
from forgelib.run.results import (
    TrialResult,
    shelve_attempt,
    trial_dir,
    write_junit,
    write_summary,
    write_trial,
)
from forgelib.run.setup import STAGE, SetupResult, TaskSetups
from forgelib.runner import secret_values
from forgelib.spec.models import LOG_TAIL_LINES, Agent, Check, Component, Task, Timeouts
from forgelib.stacks.live import LiveStacks, StopState
from forgelib.stacks.stack import ServiceAccess, Stack, TrialRequest

log = logging.getLogger("forgelib.run")

Progressor = Callable[[str], None]


class Backend(Protocol):
    """Provisioning as the orchestrator needs it; ``stacks.DockerBackend`` is the real one."""

    def provision(self, task: Task, **trial: Unpack[TrialRequest]) -> Stack:
        """A provisioned stack; raises ProvisionError only after capturing logs and tearing down.

        ``attempt`` > 1 is a retry: its stack must be a fresh one (a new compose project), never the last
        attempt's, even if that one's teardown failed."""
        ...

    def capture_logs(self, trial: Stack, dest_dir: Path, tail_lines: int) -> None: ...
    def teardown(self, trial: Stack, *, graceful: bool = True) -> float:
        """Remove the stack; ``graceful=False`` (a second Ctrl-C) skips the containers' stop timeout."""
        ...

    def discard_leftovers(self, run_id: str) -> None:
        """Remove stacks of ``run_id`` whose owner died (a killed run being resumed)."""
        ...

    def checkpoint(self, trial: Stack, run_id: str) -> str:
        """Checkpoint a task's setup stack as the run's own (removed by ``finish_run``); its id. A trial
        provisioned with ``checkpoint=`` that id starts from a fork of it."""
        ...

    @property
    def run_host(self) -> HostRun:
        """Run a command on the host (a grading judge without a service), ``check=False``."""
        ...

    @property
    def launch_host(self) -> HostLauncher:
        """Run a host command agent (``check=False``) in its own process group, its output streamed to
        the files; a stop kills its group (``Interrupted``), as its timeout does (``CommandTimeout``)."""
        ...

    def finish_run(self, run_id: str) -> None:
        """Release what the run shared between trials (a shared stack); called once, however it ended."""
        ...


class EventSink(Protocol):
    """Where a trial's events go: the run's ``EventLog``, or on a cluster node the relay to the driver."""

    def append(self, kind: str, **fields: Any) -> dict[str, Any]: ...


class TrialRunner(Protocol):
    def run(self, trials: Sequence[tuple[Task, int]]) -> list[TrialResult]: ...


# Builds what runs a run's trials from its event log and settings: ``Executor`` here, or (``--cluster``)
# ``forgelib.cluster.driver.ClusterExecutor``.
ExecutorFactory = Callable[[ev.EventLog, "Settings"], TrialRunner]


@dataclass(frozen=True)
class Settings:
    run_id: str
    run_dir: Path
    timeouts: Timeouts = field(default_factory=Timeouts)
    capture_logs_on_success: bool = False
    log_tail_lines: int = LOG_TAIL_LINES
    workers: int = 1
    retries: int = 0
    node: dict[str, str] | None = None  # set on a cluster node: recorded on each trial it runs
    agent: Agent | None = None  # what solves every trial; None: each task's oracle


@dataclass
class _Trial:
    """The mutable facts one worker gathers about its trial while the lifecycle walks it."""

    task: Task
    index: int
    dir: Path
    started: float = field(default_factory=time.time)
    timings: dict[str, float] = field(default_factory=dict)
    handle: Stack | None = None
    grade: Grade | None = None
    provision_stage: str | None = None
    ports: dict[str, list[str]] = field(default_factory=dict)
    stack: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    oracle: dict[str, Any] | None = None
    solver: dict[str, Any] | None = None
    teardown_error: str | None = None
    log_capture_error: str | None = None
    snapshots: dict[str, Any] = field(default_factory=dict)
    # time to ready and what it waited on (run/ready.py)
    ready: dict[str, float] = field(default_factory=dict)
    attempt: int = 1
    earlier: list[dict[str, Any]] = field(default_factory=list)  # the retried attempts, oldest first
    result: TrialResult | None = None  # the current attempt's, once RECORD wrote it

    def next_attempt(self, attempt: int) -> None:
        """Forget the last attempt's facts (its files were shelved under attempts/)."""
        self.attempt = attempt
        self.started = time.time()
        self.timings, self.handle, self.grade, self.provision_stage = {}, None, None, None
        self.error, self.oracle, self.teardown_error, self.log_capture_error = None, None, None, None
        self.solver = None
        self.result, self.ports, self.snapshots, self.ready = None, {}, {}, {}


class Executor:
    def __init__(
        self,
        backend: Backend,
        events: EventSink,
        settings: Settings,
        progress: Progressor,
        *,
        stacks: LiveStacks | None = None,
        stop: StopState | None = None,
    ) -> None:
        self.backend = backend
        self.events = events
        self.s = settings
        self._progress = progress
        # The one registry of live stacks: from signals.interruptible (the CLI), so its sweep sees every
        # stack a worker brought up, or our own. SIGTERM acts like Ctrl-C; a second signal hurries.
        self._stacks = stacks if stacks is not None else LiveStacks()
        self._signal_stop = stop
        self._print_lock = threading.Lock()
        self._stop = threading.Event()
        self._interrupted_recorded = False  # RUN_INTERRUPTED is in the log (once)
        self._teardowns: ThreadPoolExecutor | None = None  # fresh stacks come down here, off the workers
        self._downs: list[Future[tuple[Outcome, bool | None]]] = []
        # Each task's setup step, once (run/setup.py): its stack is registered like a trial's, so a stop
        # tears it down too.
        self._setups = TaskSetups(
            backend, events, run_id=settings.run_id, run_dir=settings.run_dir, say=self.say,
            stopping=self.stopping, log_tail_lines=settings.log_tail_lines,
            register=lambda st: self._stacks.add(
                st.name, lambda graceful: self.backend.teardown(st, graceful=graceful), started=True
            ),
            teardown=lambda st: self._stacks.teardown(st.name), background=self._in_background,
        )  # fmt: skip

    def setup(self, task: Task) -> SetupResult:
        """``task``'s setup, run now unless it ran already (a cluster node runs it alone this way)."""
        return self._setups.result(task)

    def know_setup(self, result: SetupResult) -> None:
        """A setup that ran elsewhere: its task's trials here start from its checkpoint (``TaskSetups``)."""
        self._setups.known(result)

    # -------------------------------------------------------------------------------------- the pool

    def run(self, trials: Sequence[tuple[Task, int]]) -> list[TrialResult]:
        """Run ``trials`` (task, index) on ``workers`` threads; results in completion order."""
        results: list[TrialResult] = []
        pool = ThreadPoolExecutor(max_workers=max(1, self.s.workers), thread_name_prefix="forge-trial")
        futures: list[Future[TrialResult]] = []
        deferred = self._signal_stop.deferred if self._signal_stop is not None else contextlib.nullcontext
        # A fresh stack's graceful `down` runs beside the worker's next trial, not before it: it is off the
        # critical path once the trial is on record.
        downs = ThreadPoolExecutor(max_workers=max(1, self.s.workers), thread_name_prefix="forge-down")
        self._teardowns = downs
        try:
            # One by one into the list `_interrupt` cancels: a Ctrl-C between two submits still finds every
            # trial submitted so far.
            for task, idx in trials:
                futures.append(pool.submit(self.run_trial, task, idx))
            pending: set[Future[TrialResult]] = set(futures)
            while pending:
                # A signal must not raise inside `wait` (see StopState.defer): it is recorded there and
                # raised here, at the next wake-up (the wait below is bounded, so that comes soon).
                with deferred():
                    done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                results.extend(f.result() for f in done)
                if self.stopping():
                    raise KeyboardInterrupt
            # The fresh stacks still coming down in the background are the run's too: waited for the same
            # way, so a Ctrl-C during the last trial's teardown stops the run (and is on record) as it did
            # when that teardown ran on the worker.
            while downing := [f for f in list(self._downs) if not f.done()]:
                with deferred():
                    wait(downing, timeout=0.25, return_when=FIRST_COMPLETED)
                if self.stopping():
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            self._interrupt(pool, futures)
            raise
        finally:
            # A second Ctrl-C (the hurry) can land anywhere in `_interrupt`, even before its first line:
            # the stop goes on record however far that got, before waiting for the workers.
            if self.stopping():
                self._record_interrupted()
            pool.shutdown(wait=True, cancel_futures=True)
            downs.shutdown(wait=True)  # every stack is down (or its failure on record) before we return
        for f in self._downs:  # what escaped a background teardown (a bug, a kill) ends the run as inline
            if not f.cancelled() and (e := f.exception()) is not None:
                raise e
        return results

    def _interrupt(self, pool: ThreadPoolExecutor, futures: Sequence[Future[TrialResult]]) -> None:
        self._stop.set()  # first: `stopping()` is how the pool's finally knows to record the stop
        self._record_interrupted()
        for f in futures:
            f.cancel()  # trials not started yet stay pending for --resume
        self.say("interrupted: no new trials; tearing down the live ones")
        # Tearing the stacks down now also ends whatever the workers are exec'ing in them.
        self._stacks.teardown_all()
        pool.shutdown(wait=True, cancel_futures=True)

    def _in_background(self, fn: Callable[[], None]) -> None:
        """``fn`` on the teardown pool (the run waits for it as for a trial's ``down``), or now when there
        is none or the run is stopping."""
        if self._teardowns is None or self.stopping():
            fn()
            return

        def call() -> tuple[Outcome, bool | None]:
            fn()
            return Outcome.OK, None

        self._downs.append(self._teardowns.submit(call))

    def _record_interrupted(self) -> None:
        if not self._interrupted_recorded:  # flagged once written: a Ctrl-C cutting the append short retries
            self.events.append(ev.RUN_INTERRUPTED)
            self._interrupted_recorded = True

    def stopping(self) -> bool:
        return self._stop.is_set() or (self._signal_stop is not None and self._signal_stop.requested)

    def say(self, line: str) -> None:
        with self._print_lock:
            self._progress(line)

    # -------------------------------------------------------------------------------------- a trial

    def run_trial(self, task: Task, index: int) -> TrialResult:
        t = _Trial(task, index, trial_dir(self.s.run_dir, task.name, index))
        # A resumed trial keeps what its earlier attempts left (shelved under attempts/) and counts on.
        first = shelve_attempt(t.dir) if t.dir.exists() else 1
        t.dir.mkdir(parents=True, exist_ok=True)
        t.attempt = first
        flow = Flow(
            task.oracle is not None or self.s.agent is not None,
            self.s.capture_logs_on_success,
            self.s.retries,
        )
        p = start(flow, first)
        entered = time.monotonic()
        while p.phase is not Phase.DONE:
            if self.stopping() and p.phase not in (Phase.RECORD, Phase.TEARDOWN):
                outcome, passed = Outcome.INTERRUPTED, None
            else:
                outcome, passed = self._step(p, t)
                if outcome is not Outcome.OK and self.stopping() and p.phase is not Phase.RECORD:
                    # The phase failed because the stop refused its commands or removed its stack.
                    outcome = Outcome.INTERRUPTED
            nxt = advance(flow, p, outcome, passed=passed)
            now = time.monotonic()
            if nxt.attempt != p.attempt:  # a retry: the last attempt is on record and torn down
                shelve_attempt(t.dir, p.attempt)
                t.next_attempt(nxt.attempt)
            if nxt.phase is not Phase.DONE:
                self.events.append(
                    ev.TRIAL_STATE, task=task.name, index=index, phase=nxt.phase.value,
                    seconds=round(now - entered, 3), worker=_worker(),
                    attempt=nxt.attempt,
                )  # fmt: skip
                self.say(f"{task.name}[{index}] {nxt.phase.value:<13} {time.time() - t.started:7.1f}s")
            p, entered = nxt, now
        if t.result is None:  # RECORD itself crashed: nothing durable, the fold sees an unfinished trial
            t.result = self._result(t, p.termination or Termination.INTERNAL_ERROR, retried=False)
        return t.result

    def _step(self, p: Progress, t: _Trial) -> tuple[Outcome, bool | None]:
        """Run the current phase; every exception becomes an outcome (a trial never kills the run)."""
        try:
            if p.phase is Phase.RECORD:
                return self._record(t, p)
            return self._PHASES[p.phase](self, t)
        except Exception as e:  # a bug (ours or a backend's): record it on this trial, go on with the rest
            log.exception("trial %s[%d] crashed in %s", t.task.name, t.index, p.phase)
            t.error = t.error or f"internal error in {p.phase.value}: {type(e).__name__}: {e}"
            return Outcome.CRASHED, None

    def _pending(self, t: _Trial) -> tuple[Outcome, bool | None]:
        return Outcome.OK, None

    def _provision(self, t: _Trial) -> tuple[Outcome, bool | None]:
        t0 = time.monotonic()
        request: TrialRequest = {
            "run_id": self.s.run_id,
            "trial_index": t.index,
            "trial_dir": t.dir,
            "on_phase": lambda phase, secs: self._provision_phase(t, phase, secs),
            "attempt": t.attempt,
        }
        if t.task.setup is not None:  # every trial of the task starts from its setup's checkpoint
            setup = self._setups.result(t.task)
            t.timings["setup_wait"] = time.monotonic() - t0
            if setup.interrupted:
                return Outcome.INTERRUPTED, None
            if not setup.ok:
                return self._provision_failed(t, STAGE, setup.reason(), t0)
            request["checkpoint"] = setup.checkpoint
            t0 = time.monotonic()  # the stack's own provisioning starts now (the wait is setup_wait)
        try:
            handle = self.backend.provision(t.task, **request)
        except Interrupted:  # the stop's doing, not the pack's: no provision stage on record
            t.timings["provision"] = time.monotonic() - t0
            return Outcome.INTERRUPTED, None
        except ProvisionError as e:
            return self._provision_failed(t, e.stage, e.reason, t0)
        except ForgeError as e:  # e.g. docker missing: provisioning could not even start
            return self._provision_failed(t, "provision", str(e), t0)
        t.handle = handle
        t.ports = {svc: list(p) for svc, p in handle.ports.items() if p}
        t.stack = dict(handle.source)
        slower = t.stack.pop("ephemeral_recreated", None)  # handed to the run's first trial of its stack only
        if slower:
            self.events.append(
                ev.WARM_EPHEMERAL_RECREATED, task=t.task.name, index=t.index, stack=t.stack.get("name"),
                reason=slower,
            )  # fmt: skip
            self.say(f"{t.task.name}[{t.index}] warm stack {t.stack.get('name')}: {slower}")
        if t.stack.get("replaced"):
            self.events.append(
                ev.STACK_REPLACED, task=t.task.name, index=t.index, stack=t.stack.get("name"),
                reason=t.stack["replaced"],
            )  # fmt: skip
            self.say(f"{t.task.name}[{t.index}] warm stack replaced by a fresh one: {t.stack['replaced']}")
        # Up already, so registered even after a stop: the lifecycle sends it straight to teardown.
        self._stacks.add(
            handle.name, lambda graceful: self.backend.teardown(handle, graceful=graceful), started=True
        )
        t.timings.update({k: float(v) for k, v in handle.timings.items()})
        t.timings["provision"] = time.monotonic() - t0
        self._record_goldens(t, handle.snapshots)
        self._record_ready(t)
        return Outcome.OK, None

    def _record_ready(self, t: _Trial) -> None:
        """Time to ready (from the ask for a stack until the solver may start: the provision phase) and
        what it waited on; the backend's decision for the stack (reuse, grow, ahead, fresh...) as an event."""
        assert t.handle is not None
        reused = t.handle.pooled and int(t.stack.get("reuse") or 0) > 0
        t.ready = ready_breakdown(t.timings, t.timings["provision"], reused=reused)
        pool = t.stack.pop("pool", None)
        if pool:
            self.events.append(ev.STACK_ACQUIRED, task=t.task.name, index=t.index, **pool, ready=t.ready)

    def _record_goldens(self, t: _Trial, snapshots: Mapping[str, Mapping[str, Any]]) -> None:
        """trial.yaml's ``snapshots``; a discarded golden is also an event and a warning (loud fallback)."""
        t.snapshots = {svc: dict(rec) for svc, rec in snapshots.items()}
        for svc, rec in snapshots.items():
            gone = rec.get("discarded")
            if gone:
                self.events.append(
                    ev.GOLDEN_DISCARDED, task=t.task.name, index=t.index, service=svc,
                    golden=gone.get("golden"), reason=gone.get("reason"),
                )  # fmt: skip
                self.say(
                    f"{t.task.name}[{t.index}] WARNING golden {gone.get('golden')} of {svc} discarded "
                    f"({gone.get('reason')}); seeded the normal way"
                )

    def _provision_phase(self, t: _Trial, phase: str, seconds: float) -> None:
        # Recorded as they happen, so a failed provision still shows where its time went.
        t.timings[phase] = seconds
        elapsed = time.time() - t.started
        self.say(f"{t.task.name}[{t.index}] {'provisioning':<13} {elapsed:7.1f}s ({phase}: {seconds:.1f}s)")

    def _provision_failed(self, t: _Trial, stage: str, reason: str, t0: float) -> tuple[Outcome, bool | None]:
        t.timings["provision"] = time.monotonic() - t0
        t.provision_stage = stage
        t.error = reason
        t.grade = failed_grade([f"Provisioning failed at {stage}: {reason}"], threshold_of(t.task.grading))
        # The engine going away is not the pack's fault: retryable, unlike a deterministic provision error.
        return (Outcome.LOST if unreachable(reason) else Outcome.FAILED), None

    def _solve(self, t: _Trial) -> tuple[Outcome, bool | None]:
        """The solver's phase: the run's command agent, else the task's oracle; the trial's tool server
        (``run.tools``) up around it when it gets one, and closed however it ends."""
        assert t.handle is not None
        agent = self.s.agent
        wanted = agent is not None or tools.declares_tools(t.task)
        in_stack = agent is None or not agent.on_host
        t0 = time.monotonic()
        t.solver = {"kind": "oracle"} if agent is None else {
            "kind": "command", "name": agent.label, "where": agent.where,
        }  # fmt: skip
        try:
            with tools.serving(t.handle, t.task, t.dir, wanted=wanted, in_stack=in_stack) as srv:
                if srv is not None:
                    t.timings["tools_start"] = time.monotonic() - t0
                    t.solver["tools"] = {"trace": TRACE_FILE}
                if agent is None:
                    return self._oracle(t, srv)
                return self._agent(t, agent, srv)
        except Interrupted:  # the stop killed or refused a command: neither a failure nor a crash
            t.timings["solve"] = time.monotonic() - t0
            return Outcome.INTERRUPTED, None

    def _agent(self, t: _Trial, agent: Agent, srv: tools.Serving | None) -> tuple[Outcome, bool | None]:
        assert t.handle is not None and t.solver is not None
        files = (
            {"instruction": str(t.dir / INSTRUCTION_FILE), "manifest": str(t.dir / MANIFEST_FILE)}
            if agent.on_host
            else in_service_files()
        )
        url = srv.url_for(agent.on_host) if srv is not None else None
        token = srv.token if srv is not None else None
        ident = manifest.TrialIdent(self.s.run_id, t.task.name, t.index, t.attempt)
        doc = manifest.build(
            trial=ident, instruction=t.task.instruction, where=agent.where, stack=t.handle, files=files,
            mcp=manifest.Access(url, token) if url is not None and token is not None else None,
        )  # fmt: skip
        write_inputs(t.dir, t.task.instruction, doc)
        env = agent_env(agent, files, url, token)
        # Redacted from every line forge logs: the token, and the agent's own secrets (an API key in `env:`).
        secrets = sorted({*([token] if token else []), *secret_values(agent.env)})
        r = run_agent(
            agent, out_dir=t.dir, env=env, secrets=secrets, host=self.backend.launch_host,
            stack=t.handle.compose, command_timeout=self.s.timeouts.command,
        )  # fmt: skip
        t.timings["solve"] = r.seconds
        t.solver |= {"rc": r.rc, "timed_out": r.timed_out, "seconds": round(r.seconds, 3)}
        return _solve_outcome(t, r)

    def _oracle(self, t: _Trial, srv: tools.Serving | None) -> tuple[Outcome, bool | None]:
        assert t.task.oracle is not None and t.handle is not None and t.solver is not None
        oracle = t.task.oracle
        timeout = effective_timeout(oracle, self.s.timeouts.oracle)
        # A seed mounted in the oracle's service: its variable names where the file is mounted.
        seed_env = {
            k: v
            for m in t.handle.bare_seeds.values()
            if m.service == oracle.service
            for k, v in m.env().items()
        }
        url = srv.url_for(False) if srv is not None else None
        if srv is not None and url is not None:  # the oracle runs in the stack: it reaches the server there
            seed_env |= {"FORGE_MCP_URL": url, "FORGE_MCP_TOKEN": srv.token}
        r = run_oracle(t.handle.compose, oracle, timeout=timeout, out_dir=t.dir, extra_env=seed_env)
        t.timings["solve"] = r.seconds
        t.oracle = {"rc": r.rc, "timed_out": r.timed_out, "seconds": round(r.seconds, 3)}
        t.solver |= t.oracle
        return _solve_outcome(t, r)

    def _grading(self, t: _Trial) -> tuple[Outcome, bool | None]:
        assert t.handle is not None
        handle = t.handle
        t0 = time.monotonic()
        deadline = t0 + self.s.timeouts.grading  # one budget for all checks of the trial

        def budget() -> float:
            return max(1.0, deadline - time.monotonic())

        g = t.task.grading
        # Observations are independent reads (each a `docker exec` or an HTTP request, mostly waiting), so
        # they run at once, and so do the components; a task with a mutating HTTP check keeps its order.
        in_order = g is not None and mutates(g)
        width = 1 if in_order else GRADING_THREADS
        checks_pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="forge-check")
        # Without a mutating check every read sees the same state: a file several checks read is read once.
        stack: ServiceAccess = handle.compose if in_order else ReadOnce(handle.compose)
        trace = read_trace(t.dir / TRACE_FILE)  # the agent's tool calls, for trace checks

        def observe(checks: Sequence[Check]) -> list[CheckOutcome]:
            def one(c: Check) -> CheckOutcome:
                return evaluate(stack, c, handle.resolved, timeout=budget(), trace=trace)

            return list(checks_pool.map(one, checks))

        def judge(c: Component) -> ComponentResult:
            assert c.judge is not None and t.task.grading is not None
            env = {
                "FORGE_TASK": t.task.name, "FORGE_INSTRUCTION": t.task.instruction,
                "FORGE_RUN_ID": self.s.run_id, "FORGE_TRIAL_DIR": str(t.dir),
            }  # fmt: skip
            verdict = run_judge(
                c.name, c.judge, stack=stack, host=self.backend.run_host,
                cwd=t.task.grading.path.parent, env=env, timeout=min(c.judge.timeout, budget()),
            )  # fmt: skip
            return judge_component(c.name, c.weight, verdict)

        try:
            with ThreadPoolExecutor(max_workers=width, thread_name_prefix="forge-part") as parts_pool:

                def together(parts: Sequence[Callable[[], Any]]) -> list[Any]:
                    return [f.result() for f in [parts_pool.submit(p) for p in parts]]

                t.grade = grade_by(g, observe, judge, together=together)
        except Interrupted:  # a check's or the judge's exec killed or refused by the stop: no grade
            return Outcome.INTERRUPTED, None
        except JudgeError as e:  # no score without the judge: a named grading error, retryable
            t.error = str(e)
            t.grade = failed_grade([str(e)], threshold_of(g))
            return Outcome.FAILED, None
        finally:
            checks_pool.shutdown(wait=True)
            t.timings["grading"] = time.monotonic() - t0
        return Outcome.OK, t.grade.binary_pass

    def _capture_logs(self, t: _Trial) -> tuple[Outcome, bool | None]:
        if t.handle is None:
            return Outcome.OK, None
        t0 = time.monotonic()
        try:
            self.backend.capture_logs(t.handle, t.dir / "services", self.s.log_tail_lines)
        except ForgeError as e:  # lost diagnostics, not a lost trial
            t.log_capture_error = str(e)
        t.timings["capture_logs"] = time.monotonic() - t0
        return Outcome.OK, None

    def _record(self, t: _Trial, p: Progress) -> tuple[Outcome, bool | None]:
        """The attempt's evidence, durably, while its stack still stands: trial.yaml, grade.yaml,
        metrics.yaml, then the event (``trial_finished``, or ``trial_attempt`` for one that is retried)."""
        r = self._result(t, p.termination or Termination.INTERNAL_ERROR, retried=p.retry)
        record_attempt(self.events, self.say, t.dir, r)
        if p.retry:
            t.earlier.append(r.attempt_summary())
        t.result = r
        return Outcome.OK, None

    def _result(self, t: _Trial, term: Termination, *, retried: bool) -> TrialResult:
        if term is Termination.INTERRUPTED:
            # Whatever a phase reported while its stack was being torn down is noise: the cause is Ctrl-C.
            t.error = "interrupted before the trial finished"
            t.grade = None
        g = t.grade
        if g is None or (term is not Termination.COMPLETED and g.binary_pass):
            g = failed_grade([t.error or term.value], threshold_of(t.task.grading))
        return TrialResult(
            run_id=self.s.run_id,
            task=t.task.name,
            index=t.index,
            termination=term,
            grade=g,
            started_at=t.started,
            finished_at=time.time(),
            timings={k: round(v, 3) for k, v in t.timings.items()},
            compose_project=t.handle.name if t.handle is not None else None,
            ports=t.ports,
            bare_seeds={s: m.record() for s, m in t.handle.bare_seeds.items()}
            if t.handle is not None
            else {},
            stack=t.stack,
            provision_stage=t.provision_stage,
            error=t.error,
            oracle=t.oracle,
            solver=t.solver,
            teardown_error=t.teardown_error,
            log_capture_error=t.log_capture_error,
            snapshots=t.snapshots,
            ready=t.ready,
            attempt=t.attempt,
            retried=retried,
            earlier_attempts=tuple(t.earlier),
            node=self.s.node,
        )

    def _teardown(self, t: _Trial) -> tuple[Outcome, bool | None]:
        if t.handle is None:
            return Outcome.OK, None
        done = t.result is not None and not t.result.retried  # a retried attempt's files move on: not async
        if self._teardowns is not None and done and not t.handle.pooled and not self.stopping():
            # Its verdict is on record; the stack stays in LiveStacks (Ctrl-C, the reaper's labels) and in
            # the memory budget until its `down` is over.
            self._downs.append(self._teardowns.submit(self._tear_down, t))
            return Outcome.OK, None
        return self._tear_down(t)

    def _tear_down(self, t: _Trial) -> tuple[Outcome, bool | None]:
        assert t.handle is not None
        t0 = time.monotonic()
        t.teardown_error = self._stacks.teardown(t.handle.name)
        if t.teardown_error is not None:
            log.warning("teardown of %s failed: %s", t.handle.name, t.teardown_error)
        seconds = time.monotonic() - t0
        t.timings["teardown"] = seconds
        if t.result is not None:
            # The verdict was on record before the stack went; add how its removal went.
            t.result.timings["teardown"] = round(seconds, 3)
            t.result.teardown_error = t.teardown_error
            write_trial(t.dir, t.result)
            self.events.append(
                ev.TRIAL_TORN_DOWN, task=t.task.name, index=t.index, attempt=t.attempt,
                seconds=round(seconds, 3), error=t.teardown_error,
            )  # fmt: skip
        return Outcome.OK, None

    _PHASES: Mapping[Phase, Callable[[Executor, _Trial], tuple[Outcome, bool | None]]] = {
        Phase.PENDING: _pending,
        Phase.PROVISIONING: _provision,
        Phase.SOLVE: _solve,
        Phase.GRADING: _grading,
        Phase.CAPTURE_LOGS: _capture_logs,
        Phase.TEARDOWN: _teardown,
    }


def _solve_outcome(t: _Trial, r: AgentResult | OracleResult) -> tuple[Outcome, bool | None]:
    """How the solve phase ended, whichever solver ran: a failure's reason becomes the trial's grade."""
    if r.ok:
        return Outcome.OK, None
    t.error = r.error
    t.grade = failed_grade([r.reason()], threshold_of(t.task.grading))
    if r.timed_out:
        return Outcome.TIMED_OUT, None
    return (Outcome.LOST if unreachable(f"{r.error}\n{r.stderr}") else Outcome.FAILED), None


GRADING_THREADS = 8  # observations of one trial at once


def record_attempt(
    events: EventSink, say: Callable[[str], None], trial_dir: Path, r: TrialResult, **fields: Any
) -> None:
    """An attempt's record, the one way it is written: ``trial.yaml`` (with grade.yaml and metrics.yaml),
    then its event (``trial_finished``, or ``trial_attempt`` when ``r.retried``) and its progress line.
    The executor's RECORD phase writes through it, and so does a cluster driver for an attempt its node
    could not finish (``fields`` override the event's, e.g. the driver's ``error_stage``)."""
    write_trial(trial_dir, r)
    term = r.termination
    if r.retried:
        events.append(ev.TRIAL_ATTEMPT, **{**r.event_fields(), **fields})
        say(f"{r.task}[{r.index}] {'retrying':<13} {r.wall_seconds:7.1f}s attempt {r.attempt}: {term.value}")
    else:
        events.append(ev.TRIAL_FINISHED, **{**r.event_fields(), **fields})
        extra = f" score={r.grade.score:.2f}" if term is Termination.COMPLETED else f" {term.value}"
        say(f"{r.task}[{r.index}] {'done':<13} {r.wall_seconds:7.1f}s {r.status}{extra}")


def _worker() -> str:
    """Which worker runs this trial (the report's timeline lane): the pool thread's number."""
    return threading.current_thread().name.removeprefix("forge-trial_")


# ------------------------------------------------------------------------------------------ a whole run


@dataclass(frozen=True)
class RunPlan:
    """What to run: a new run (``resume=None``) or the unfinished trials of ``resume``."""

    tasks: Sequence[Task]  # the tasks a new run covers (in order); for a resume, where names are looked up
    repeats: int
    output: Path
    workers: int = 1
    resume: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    capture_logs_on_success: bool = False
    log_tail_lines: int = LOG_TAIL_LINES
    retries: int = 0
    project: str = ""  # recorded in run_started (where it came from), informational
    config: str = ""
    junit: Path | None = None
    # Writes report.html beside summary.json as the run ends, interrupted or not: the front end's page
    # (``forgelib.report.page.write_report``), given here so the orchestrator imports nothing above it.
    report: Callable[[Path, ev.RunState], Path] | None = None
    stacks: str = "fresh"  # recorded in run_started; the backend implements it
    agent: Agent | None = None  # what solves every trial; None: each task's oracle


def run_project(
    plan: RunPlan,
    backend: Backend,
    progress: Progressor,
    *,
    stacks: LiveStacks | None = None,
    stop: StopState | None = None,
    observer: ev.Observer | None = None,
    executor: ExecutorFactory | None = None,
) -> tuple[Path, ev.RunState]:
    """Start (or resume) a run, execute what it needs, write summary.json (and JUnit), and return the
    run's directory and final folded state.

    Ctrl-C propagates after the live stacks are torn down and the interruption is on record.
    ``observer`` sees every event of the log (the live progress display).
    """
    by_name = {t.name: t for t in plan.tasks}
    if plan.resume is None:
        run_id = new_run_id()
        run_dir = plan.output / run_id
        todo = [(t, i) for t in plan.tasks for i in range(plan.repeats)]
        log = ev.EventLog(run_dir / ev.EVENTS_FILE, observer)
        log.append(
            ev.RUN_STARTED,
            run_id=run_id,
            project=plan.project,
            config=plan.config,
            plan=[{"task": t.name, "index": i} for t, i in todo],
            settings={
                "repeats": plan.repeats,
                "workers": plan.workers,
                "retries": plan.retries,
                "stacks": plan.stacks,
                "solver": solver_record(plan.agent),
            },
            origin=ev.origin(),
        )
    else:
        run_id = plan.resume
        run_dir = plan.output / run_id
        state = load_state(run_dir)
        missing = sorted({k[0] for k in state.pending()} - by_name.keys())
        if missing:
            raise ForgeError(
                f"cannot resume {run_id}: task(s) {', '.join(missing)} are no longer in the project"
            )
        todo = [(by_name[name], i) for name, i in state.pending()]
        recorded = (state.started.get("settings") or {}).get("solver") or {"kind": "oracle"}
        if todo and recorded != solver_record(plan.agent):  # one run, one solver: its results compare
            raise ForgeError(
                f"cannot resume {run_id}: its trials were solved by {_solver_text(recorded)}, not "
                f"{_solver_text(solver_record(plan.agent))}; resume it with the same agent (--agent)"
            )
        log = ev.EventLog(run_dir / ev.EVENTS_FILE, observer)
        log.append(
            ev.RUN_RESUMED, pending=[{"task": t.name, "index": i} for t, i in todo], origin=ev.origin()
        )
        untorn = state.untorn()
        if todo or untorn:
            # A killed session may have left stacks behind (also of trials finished and on record whose
            # teardown it never completed: those are not rerun); their owner is dead, so this is safe.
            backend.discard_leftovers(run_id)
        progress(
            f"resuming {run_id}: {len(todo)} of {len(state.plan)} trial(s) left to run"
            + (f"; removed what {len(untorn)} finished trial(s) left up" if untorn else "")
        )
    settings = Settings(
        run_id=run_id,
        run_dir=run_dir,
        timeouts=plan.timeouts,
        capture_logs_on_success=plan.capture_logs_on_success,
        log_tail_lines=plan.log_tail_lines,
        workers=plan.workers,
        retries=plan.retries,
        agent=plan.agent,
    )
    try:
        with log:
            progress(f"run {run_id}: {len(todo)} trial(s), {plan.workers} worker(s) -> {run_dir}")
            if executor is None:
                Executor(backend, log, settings, progress, stacks=stacks, stop=stop).run(todo)
            else:
                executor(log, settings).run(todo)
            log.append(ev.RUN_FINISHED)
    finally:
        try:
            backend.finish_run(run_id)
        except ForgeError as e:  # reported, never masking how the run itself ended
            progress(f"warning: releasing the run's shared resources failed: {e}")
        # Interrupted or not, summary.json (and the JUnit file) describe what the log says so far.
        state = load_state(run_dir)
        write_summary(run_dir, ev.summarize(state))
        if plan.junit is not None:
            write_junit(plan.junit, state)
        if plan.report is not None:
            progress(f"report: {plan.report(run_dir, state)}")
    return run_dir, state


def solver_record(agent: Agent | None) -> dict[str, Any]:
    """What solves the run's trials, as run_started's settings (and so summary.json) say it."""
    if agent is None:
        return {"kind": "oracle"}
    return {"kind": "command", "name": agent.label, "where": agent.where, "command": list(agent.command)}


def _solver_text(record: Mapping[str, Any]) -> str:
    if record.get("kind") != "command":
        return "each task's oracle"
    return f"the agent {record.get('name')!r} ({' '.join(map(str, record.get('command') or ()))})"


def load_state(run_dir: Path) -> ev.RunState:
    path = run_dir / ev.EVENTS_FILE
    if not path.is_file():
        raise ForgeError(f"no run at {run_dir} ({ev.EVENTS_FILE} is missing)")
    state = ev.fold(ev.read_events(path))
    if state.run_id is None:
        raise ForgeError(f"{path} does not start with a run_started event; it is not a forge run log")
    return state
