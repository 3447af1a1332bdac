"""The orchestrator on a fake backend: results on disk, PROVISION_ERROR, workers, Ctrl-C, resume."""

from __future__ import annotations

import _thread
import json
import signal
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from forgelib.errors import CommandError, CommandTimeout, ProvisionError
from forgelib.run import events as ev
from forgelib.run import execute
from forgelib.run.execute import RunPlan, run_project
from forgelib.run.ids import new_run_id
from forgelib.runner import Result
from forgelib.spec.models import Check, Oracle, Task

from .fakes import FAKE_PROVISION_PHASES, FakeBackend, good_answer, make_task, ok, widget_task

RECIPE_REASON = (
    "reset recipe for service 'app-db' (seed 'postgres_baseline', kind 'sql_dump') failed: "
    'psql: ERROR:  syntax error at or near "SELEC"'
)


def plan(tmp_path: Path, tasks: list[Task], **kw: Any) -> RunPlan:
    return RunPlan(tasks=tasks, repeats=kw.pop("repeats", 2), output=tmp_path / "runs", **kw)


def run(p: RunPlan, backend: FakeBackend) -> tuple[Path, ev.RunState, list[str]]:
    out: list[str] = []
    run_dir, state = run_project(p, backend, out.append)
    return run_dir, state, out


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_new_run_ids_sort_by_time_and_are_unique() -> None:
    a, b = new_run_id(1_700_000_000), new_run_id(1_700_000_001)
    assert a < b and len({new_run_id(5) for _ in range(50)}) == 50
    assert a.startswith("20231114T221320Z-")


def test_passing_run_writes_every_file(tmp_path: Path, fake_backend: Any) -> None:
    backend = fake_backend()
    run_dir, state, out = run(plan(tmp_path, [widget_task()], junit=tmp_path / "junit.xml"), backend)
    assert [r.status for r in state.records()] == ["passed", "passed"]
    d = run_dir / "trials" / "read_widget" / "1"
    trial = load(d / "trial.yaml")
    assert trial["status"] == "passed" and trial["termination_reason"] == "COMPLETED"
    assert trial["retryable"] is False and trial["error"] is None
    # the executor times its own phases and keeps the backend's sub-phases beside them, values unchanged
    assert set(trial["timings"]) == {*FAKE_PROVISION_PHASES, "provision", "solve", "grading", "teardown"}
    assert {k: trial["timings"][k] for k in FAKE_PROVISION_PHASES} == FAKE_PROVISION_PHASES
    assert trial["compose_project"].endswith("read_widget-1")
    grade = load(d / "grade.yaml")
    assert list(grade) == ["binary_pass", "score", "threshold", "components", "checks", "reasons"]
    assert grade["binary_pass"] is True and grade["score"] == 1.0 and grade["reasons"] == []
    assert grade["components"] == {
        "out_file": pytest.approx(1 / 3, abs=1e-6),
        "db_row": pytest.approx(2 / 3, abs=1e-6),
    }
    assert grade["checks"][0] == {
        "name": "out_file", "type": "file", "weight": 1.0, "gate": False, "passed": True,
        "result": "passed", "reason": None,
        "observed": "baseline", "expected": "equals 'baseline'", "error": None,
        "decided": True, "observes": 'file {"path": "/work/out.txt", "service": "runner"}',
    }  # fmt: skip
    metrics = load(d / "metrics.yaml")
    assert metrics["checks_total"] == 2 and metrics["checks_passed"] == 2 and metrics["oracle_rc"] == 0
    assert (d / "oracle.stdout").exists()
    assert not (d / "services").exists()  # green and capture_logs_on_success is off
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["totals"]["passed"] == 2 and summary["all_passed"] is True
    assert summary["timings"]["solve"]["count"] == 2
    assert len(backend.torn_down) == 2 and backend.logs_captured == []
    cases = ET.parse(tmp_path / "junit.xml").getroot().findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == ["read_widget[0]", "read_widget[1]"]
    assert any("read_widget[0] solve" in line for line in out)  # a progress line per state change
    phases = [e["phase"] for e in ev.read_events(run_dir / ev.EVENTS_FILE) if e["kind"] == ev.TRIAL_STATE]
    assert phases.count("provisioning") == 2 and phases.count("teardown") == 2


def test_provision_error_accounting(tmp_path: Path, fake_backend: Any) -> None:
    backend = fake_backend(fail={("read_widget", 0): ProvisionError("reset_recipe", RECIPE_REASON)})
    run_dir, _, _ = run(plan(tmp_path, [widget_task()], junit=tmp_path / "j.xml"), backend)
    d = run_dir / "trials" / "read_widget" / "0"
    trial = load(d / "trial.yaml")
    assert trial["status"] == "error"
    assert trial["termination_reason"] == "PROVISION_ERROR" and trial["retryable"] is False
    assert trial["error"] == {"stage": "reset_recipe", "reason": RECIPE_REASON}
    assert trial["oracle"] is None and "oracle" not in trial["timings"]
    grade = load(d / "grade.yaml")
    assert grade["binary_pass"] is False and grade["score"] == 0.0
    assert grade["reasons"] == [f"Provisioning failed at reset_recipe: {RECIPE_REASON}"]
    assert (d / "services" / "app-db.log").exists()  # provisioning's own capture is kept
    assert ("read_widget", 0) not in backend.stacks  # the oracle never ran: there was no stack to run in
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["totals"] == {
        "trials": 2,
        "passed": 1,
        "failed": 1,
        "failed_attempts": 1,
        "retried_attempts": 0,
        "not_finished": 0,
        "errors_by_stage": {"reset_recipe": 1},
    }
    error = ET.parse(tmp_path / "j.xml").getroot().find("./testsuite/testcase/error")
    assert error is not None and error.get("type") == "PROVISION_ERROR"


def test_red_grade_captures_logs_and_oracle_failure_skips_grading(tmp_path: Path, fake_backend: Any) -> None:
    def answer(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
        if argv[0] == "python3":
            return ok(rc=2, stderr="boom")
        return good_answer(service, argv, kw)

    red = make_task("red", oracle=None, checks=widget_task().grading.checks[:1], threshold=1.0)  # type: ignore[union-attr]
    broken = make_task(
        "broken",
        oracle=Oracle(service="runner", command=("python3", "x")),
        checks=widget_task().grading.checks,  # type: ignore[union-attr]
    )
    backend = fake_backend(answer)
    backend.answer = lambda s, a, k: ok("nope") if a[0] == "cat" else answer(s, a, k)
    run_dir, state, _ = run(plan(tmp_path, [red, broken], repeats=1), backend)
    by = {r.task: r for r in state.records()}
    assert by["red"].status == "failed" and by["red"].termination.value == "COMPLETED"  # type: ignore[union-attr]
    assert (run_dir / "trials" / "red" / "0" / "services" / "app-db.log").exists()
    assert by["broken"].status == "error" and by["broken"].termination.value == "AGENT_ERROR"  # type: ignore[union-attr]
    g = load(run_dir / "trials" / "broken" / "0" / "grade.yaml")
    assert (
        g["reasons"] == ["Oracle failed: `python3 x` in service 'runner' exited 2: boom"]
        and g["checks"] == []
    )
    calls = backend.stacks[("broken", 0)].calls
    assert [c[1][0] for c in calls] == ["python3"]  # no check ran after the oracle failed
    assert len(backend.torn_down) == 2 and sorted(backend.logs_captured) == sorted(backend.torn_down)


def test_workers_2_gives_the_same_results_as_workers_1(tmp_path: Path, fake_backend: Any) -> None:
    fail = {("b", 1): ProvisionError("reset_recipe", RECIPE_REASON)}
    tasks = [widget_task("a"), widget_task("b")]

    def slow(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
        time.sleep(0.02)
        return good_answer(service, argv, kw)

    def outcome(workers: int) -> list[tuple[Any, ...]]:
        _, state, _ = run(
            plan(tmp_path / str(workers), tasks, repeats=3, workers=workers),
            fake_backend(slow, fail=dict(fail)),
        )
        sm = ev.summarize(state)
        return [(t["task"], t["index"], t["status"], t["score"], t["reasons"]) for t in sm["trials"]] + [
            tuple(sorted(sm["totals"].items(), key=str))
        ]

    assert outcome(1) == outcome(2)


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt for this test, whatever the process inherited: a shell's background
    job, nohup and some CI runners start it with SIGINT ignored, and then `interrupt_main` does nothing."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture
def ctrl_c(ctrl_c_raises: None, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Press Ctrl-C from a worker's fake exec: delivered once the main thread waits for its trials in the
    executor's loop, as a person's Ctrl-C comes while a trial runs. Pressed sooner (a worker racing ahead
    of a main thread slowed by a loaded machine, still inside ``ThreadPoolExecutor.submit``), the
    KeyboardInterrupt lands before the executor holds that trial's future or thread: the run ends
    without waiting for the trial, and its record is read before the trial's (``pending``)."""
    waiting = threading.Event()
    real_wait = execute.wait

    def wait(*args: Any, **kw: Any) -> Any:
        waiting.set()
        return real_wait(*args, **kw)

    monkeypatch.setattr(execute, "wait", wait)

    def press() -> None:
        assert waiting.wait(60), "the main thread never waited for its trials"
        _thread.interrupt_main()

    return press


@dataclass
class _SignalsTeardown(FakeBackend):
    """A fake backend that sets ``done`` once it has torn a stack down: an oracle stuck "running" waits
    for it, as a real exec runs on until the main thread's stop removes its stack."""

    done: threading.Event = field(default_factory=threading.Event)

    def teardown(self, trial: Any, *, graceful: bool = True) -> float:
        seconds = super().teardown(trial, graceful=graceful)
        self.done.set()
        return seconds


def test_ctrl_c_tears_down_live_stacks_and_resume_finishes_the_rest(
    tmp_path: Path, fake_backend: Any, ctrl_c: Callable[[], None]
) -> None:
    tasks = [widget_task("a")]
    torn_down = threading.Event()

    def answer(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
        if argv[0] == "python3" and not torn_down.is_set():
            ctrl_c()  # Ctrl-C arrives while trial a[0]'s oracle runs...
            # ...and the oracle runs on until the main thread's stop removed its stack, as a real exec does
            assert torn_down.wait(60), "the main thread never tore the stack down"
        return good_answer(service, argv, kw)

    backend = _SignalsTeardown(answer, done=torn_down)
    p = plan(tmp_path, tasks, repeats=3)
    with pytest.raises(KeyboardInterrupt):
        run_project(p, backend, lambda line: None)
    assert backend.provisioned == [("a", 0)]  # stopped launching
    assert len(backend.torn_down) == 1  # torn down exactly once (main thread or worker, not both)
    (run_dir,) = (tmp_path / "runs").iterdir()
    state = ev.fold(ev.read_events(run_dir / ev.EVENTS_FILE))
    assert state.interrupted
    assert state.trials[("a", 0)].status == "interrupted"
    assert state.pending() == [("a", 0), ("a", 1), ("a", 2)]
    assert json.loads((run_dir / "summary.json").read_text())["interrupted"] is True

    backend2 = fake_backend()
    resume = plan(tmp_path, tasks, repeats=3, resume=run_dir.name)
    _, state2, out = run(resume, backend2)
    assert backend2.leftovers_discarded == [run_dir.name]
    assert sorted(backend2.provisioned) == [("a", 0), ("a", 1), ("a", 2)]
    assert [r.status for r in state2.records()] == ["passed"] * 3
    assert state2.trials[("a", 0)].attempts == 2 and not state2.interrupted
    assert out[0] == f"resuming {run_dir.name}: 3 of 3 trial(s) left to run"


@pytest.mark.parametrize("where", ["progress", "append"])
def test_a_second_ctrl_c_while_the_stop_is_handled_still_leaves_the_interruption_on_record(
    tmp_path: Path, fake_backend: Any, ctrl_c: Callable[[], None], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # The hurry (a second KeyboardInterrupt) lands while the first is being handled: as the stop's
    # progress line is printed, or inside the append of run_interrupted itself (waiting for the log's
    # lock a worker holds). The log must still say the run was interrupted, not that it was killed.
    fired = threading.Event()
    if where == "append":
        append, cut = ev.EventLog.append, []

        def cut_short(self: Any, kind: str, **fields: Any) -> dict[str, Any]:
            if kind == ev.RUN_INTERRUPTED and not cut:
                cut.append(kind)
                raise KeyboardInterrupt  # the second signal, before anything was written
            return append(self, kind, **fields)

        monkeypatch.setattr(ev.EventLog, "append", cut_short)

    def answer(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
        if argv[0] == "python3" and not fired.is_set():
            fired.set()
            ctrl_c()
        return good_answer(service, argv, kw)

    def progress(line: str) -> None:
        if where == "progress" and line.startswith("interrupted:"):
            raise KeyboardInterrupt  # the second signal

    with pytest.raises(KeyboardInterrupt):
        run_project(plan(tmp_path, [widget_task("a")], repeats=2), fake_backend(answer), progress)
    (run_dir,) = (tmp_path / "runs").iterdir()
    kinds = [e["kind"] for e in ev.read_events(run_dir / ev.EVENTS_FILE)]
    assert (
        kinds.count(ev.RUN_INTERRUPTED) == 1 and ev.fold(ev.read_events(run_dir / ev.EVENTS_FILE)).interrupted
    )


def test_resume_after_a_kill_runs_only_what_was_missing(tmp_path: Path, fake_backend: Any) -> None:
    tasks = [widget_task("a"), widget_task("b")]
    run_dir, _, _ = run(plan(tmp_path, tasks, repeats=2), fake_backend())
    log = run_dir / ev.EVENTS_FILE
    # Simulate SIGKILL: keep the log up to b[0]'s finish, then b[1] mid-oracle, then a line cut short.
    kept: list[str] = []
    for line in log.read_text().splitlines():
        e = json.loads(line)
        if e["kind"] == ev.TRIAL_STATE and (e["task"], e["index"]) == ("b", 1) and e["phase"] == "grading":
            break
        kept.append(line)
    log.write_text("\n".join(kept) + '\n{"v": 1, "kind": "trial_st')
    (run_dir / "trials" / "b" / "1" / "stale.txt").write_text("from the killed attempt")
    assert ev.fold(ev.read_events(log)).pending() == [("b", 1)]

    backend = fake_backend()
    _, state2, _ = run(plan(tmp_path, tasks, resume=run_dir.name), backend)
    assert backend.provisioned == [("b", 1)]
    assert state2.pending() == [] and all(r.status == "passed" for r in state2.records())
    assert state2.unreadable_lines == 1
    assert not (run_dir / "trials" / "b" / "1" / "stale.txt").exists()  # a fresh trial directory ...
    assert (run_dir / "trials" / "b" / "1" / "attempts" / "1" / "stale.txt").exists()  # ... losing nothing
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["totals"]["passed"] == 4 and summary["resumes"] == 1


def test_resume_of_a_finished_run_runs_nothing(tmp_path: Path, fake_backend: Any) -> None:
    run_dir, _, _ = run(plan(tmp_path, [widget_task()], repeats=1), fake_backend())
    backend = fake_backend()
    _, state, _ = run(plan(tmp_path, [widget_task()], resume=run_dir.name), backend)
    assert backend.provisioned == [] and backend.leftovers_discarded == [] and state.completed


def test_resume_of_a_missing_run_is_a_user_error(tmp_path: Path, fake_backend: Any) -> None:
    from forgelib.errors import ForgeError

    with pytest.raises(ForgeError, match="no run at"):
        run(plan(tmp_path, [widget_task()], resume="nope"), fake_backend())


def test_a_crashing_backend_is_an_internal_error_not_a_dead_run(tmp_path: Path, fake_backend: Any) -> None:
    def explode(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
        raise RuntimeError("bug")

    backend = fake_backend(explode)
    _, state, _ = run(plan(tmp_path, [widget_task()], repeats=1), backend)
    (rec,) = state.records()
    assert rec.termination is not None and rec.termination.value == "INTERNAL_ERROR"
    assert rec.reasons == ("internal error in solve: RuntimeError: bug",)
    assert len(backend.torn_down) == 1


# ------------------------------------------------------------------------ evidence first, then teardown


class _Killed(BaseException):
    """Stands in for SIGKILL: nothing of ours catches it."""


class _RecordingBackend(FakeBackend):
    """Checks at each teardown that the trial's verdict is already on disk and in the log; optionally
    dies there (a kill while the stack is being removed)."""

    def __init__(self, run_root: Path, die: bool = False) -> None:
        super().__init__(good_answer)
        self.run_root, self.die = run_root, die
        self.seen_at_teardown: list[tuple[bool, bool, bool]] = []

    def teardown(self, trial: Any, *, graceful: bool = True) -> float:
        (run_dir,) = self.run_root.iterdir()
        d = run_dir / "trials" / "read_widget" / "0"
        kinds = [e["kind"] for e in ev.read_events(run_dir / ev.EVENTS_FILE)]
        self.seen_at_teardown.append(
            ((d / "trial.yaml").is_file(), (d / "grade.yaml").is_file(), ev.TRIAL_FINISHED in kinds)
        )
        if self.die:
            raise _Killed
        return super().teardown(trial, graceful=graceful)


def test_the_verdict_is_durable_before_the_stack_is_torn_down(tmp_path: Path) -> None:
    backend = _RecordingBackend(tmp_path / "runs")
    run_dir, state, _ = run(plan(tmp_path, [widget_task()], repeats=1), backend)
    assert backend.seen_at_teardown == [(True, True, True)]
    trial = load(run_dir / "trials" / "read_widget" / "0" / "trial.yaml")
    assert "teardown" in trial["timings"] and trial["teardown_error"] is None  # completed after the down
    kinds = [e["kind"] for e in ev.read_events(run_dir / ev.EVENTS_FILE)]
    assert kinds.index(ev.TRIAL_FINISHED) < kinds.index(ev.TRIAL_TORN_DOWN)
    assert state.untorn() == [] and "teardown" in state.trials[("read_widget", 0)].timings


def test_a_kill_during_teardown_keeps_the_verdict_and_resume_removes_the_stack_without_rerunning(
    tmp_path: Path,
) -> None:
    dying = _RecordingBackend(tmp_path / "runs", die=True)
    with pytest.raises(_Killed):
        run_project(plan(tmp_path, [widget_task()], repeats=1), dying, lambda line: None)
    (run_dir,) = (tmp_path / "runs").iterdir()
    state = ev.fold(ev.read_events(run_dir / ev.EVENTS_FILE))
    assert state.pending() == [] and state.trials[("read_widget", 0)].status == "passed"
    assert state.untorn() == [("read_widget", 0)]
    assert load(run_dir / "trials" / "read_widget" / "0" / "grade.yaml")["binary_pass"] is True

    backend = FakeBackend(good_answer)
    _, state2, out = run(plan(tmp_path, [widget_task()], resume=run_dir.name), backend)
    assert backend.provisioned == []  # finished trials are never rerun ...
    assert backend.leftovers_discarded == [run_dir.name]  # ... but what their killed teardown left goes
    assert state2.completed and [r.status for r in state2.records()] == ["passed"]
    assert "removed what 1 finished trial(s) left up" in out[0]


# --------------------------------------------------------------------------------------------- retries


def _times_out_first(n: int) -> Any:
    """An oracle that times out on its first ``n`` runs, then succeeds."""
    runs: list[int] = []

    def answer(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
        if argv[0] == "python3":
            runs.append(1)
            if len(runs) <= n:
                raise CommandTimeout(list(argv), 30, stdout=f"attempt {len(runs)}\n")
        return good_answer(service, argv, kw)

    return answer


def test_a_timed_out_oracle_is_retried_on_a_fresh_stack_and_every_attempt_is_kept(
    tmp_path: Path, fake_backend: Any
) -> None:
    backend = fake_backend(_times_out_first(1))
    run_dir, state, out = run(
        plan(tmp_path, [widget_task()], repeats=1, retries=2, junit=tmp_path / "j.xml"), backend
    )
    (rec,) = state.records()
    assert rec.status == "passed" and rec.attempts == 2
    names = [h for h in backend.torn_down]
    assert len(names) == 2 and names[0] != names[1] and names[1].endswith("-a2")  # a fresh stack
    d = run_dir / "trials" / "read_widget" / "0"
    first = load(d / "attempts" / "1" / "trial.yaml")
    assert first["termination_reason"] == "AGENT_TIMEOUT" and first["retried"] is True
    assert first["attempt"] == 1 and "teardown" in first["timings"]
    assert (d / "attempts" / "1" / "oracle.stdout").read_text().strip() == "attempt 1"
    assert (d / "attempts" / "1" / "services" / "app-db.log").is_file()  # its logs were captured
    final = load(d / "trial.yaml")
    assert final["attempt"] == 2 and final["status"] == "passed" and final["retried"] is False
    assert [a["termination_reason"] for a in final["earlier_attempts"]] == ["AGENT_TIMEOUT"]
    assert final["earlier_attempts"][0]["dir"] == "attempts/1"
    events = list(ev.read_events(run_dir / ev.EVENTS_FILE))
    ends = [
        (e["kind"], e.get("attempt")) for e in events if e["kind"] in (ev.TRIAL_ATTEMPT, ev.TRIAL_FINISHED)
    ]
    assert ends == [(ev.TRIAL_ATTEMPT, 1), (ev.TRIAL_FINISHED, 2)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["all_passed"] is True
    assert summary["totals"]["retried_attempts"] == 1 and summary["totals"]["failed_attempts"] == 1
    assert summary["totals"]["errors_by_stage"] == {"solve": 1}
    assert summary["trials"][0]["earlier_attempts"][0]["termination_reason"] == "AGENT_TIMEOUT"
    case = ET.parse(tmp_path / "j.xml").getroot().find("./testsuite/testcase")
    assert case is not None and case.find("failure") is None and case.find("error") is None
    flaky = case.find("flakyError")
    assert flaky is not None and flaky.get("type") == "AGENT_TIMEOUT"
    assert any("retrying" in line for line in out)


def test_retries_run_out_and_the_last_attempt_is_the_verdict(tmp_path: Path, fake_backend: Any) -> None:
    backend = fake_backend(_times_out_first(99))
    run_dir, state, _ = run(
        plan(tmp_path, [widget_task()], repeats=1, retries=1, junit=tmp_path / "j.xml"), backend
    )
    (rec,) = state.records()
    assert rec.status == "error" and rec.termination is not None
    assert rec.termination.value == "AGENT_TIMEOUT" and rec.attempts == 2 and len(rec.earlier) == 1
    assert len(backend.provisioned) == 2
    case = ET.parse(tmp_path / "j.xml").getroot().find("./testsuite/testcase")
    assert case is not None and case.find("error") is not None and case.find("rerunError") is not None
    assert json.loads((run_dir / "summary.json").read_text())["totals"]["failed_attempts"] == 2


def test_a_provision_error_is_never_retried(tmp_path: Path, fake_backend: Any) -> None:
    backend = fake_backend(fail={("read_widget", 0): ProvisionError("reset_recipe", RECIPE_REASON)})
    run_dir, state, _ = run(plan(tmp_path, [widget_task()], repeats=1, retries=3), backend)
    assert backend.provisioned == [("read_widget", 0)]
    assert state.records()[0].termination is not None
    assert state.records()[0].termination.value == "PROVISION_ERROR"  # type: ignore[union-attr]
    assert not (run_dir / "trials" / "read_widget" / "0" / "attempts").exists()


def test_a_lost_engine_is_retried(tmp_path: Path, fake_backend: Any) -> None:
    lost: list[int] = []

    def answer(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
        if argv[0] == "python3" and not lost:
            lost.append(1)
            raise CommandError(
                ["docker", "compose", "exec"], 1,
                stderr="Cannot connect to the Docker daemon at unix:///var/run/docker.sock.",
            )  # fmt: skip
        return good_answer(service, argv, kw)

    _, state, _ = run(plan(tmp_path, [widget_task()], repeats=1, retries=1), fake_backend(answer))
    (rec,) = state.records()
    assert rec.status == "passed" and rec.earlier[0]["termination_reason"] == "ENGINE_LOST"
    assert rec.earlier[0]["error_stage"] == "engine"


def test_without_retries_a_timeout_is_final(tmp_path: Path, fake_backend: Any) -> None:
    backend = fake_backend(_times_out_first(1))
    _, state, _ = run(plan(tmp_path, [widget_task()], repeats=1), backend)
    assert state.records()[0].status == "error" and len(backend.provisioned) == 1


def test_a_failed_judge_is_a_retryable_grading_error(tmp_path: Path, fake_backend: Any) -> None:
    from forgelib.spec.models import Check, Component, Grading, Judge

    task = widget_task()
    check = Check("out_file", "file", {"service": "runner", "path": "/work/out.txt", "equals": "baseline"})
    judged = Grading(
        Path("/p/tasks/read_widget/grading.yaml"), (), 0.6,
        components=(Component("judge", 0.5, judge=Judge(("python3", "judge.py"))),
                    Component("note", 0.5, checks=(check,))),
    )  # fmt: skip
    task = Task(task.name, task.path, "", task.environment, task.oracle, judged, "say why")
    answers = iter([ok(rc=1, stderr="model unavailable"), ok('{"score": 0.9, "reason": "ok"}')])
    backend = fake_backend(host_answer=lambda argv, input: next(answers))
    run_dir, state, _ = run(plan(tmp_path, [task], repeats=1, retries=1), backend)
    (rec,) = state.records()
    assert rec.status == "passed" and rec.earlier[0]["termination_reason"] == "GRADING_ERROR"
    assert rec.earlier[0]["retryable"] is True and rec.earlier[0]["error_stage"] == "grading"
    assert (
        "judge 'judge' (`python3 judge.py` on host) exited 1: model unavailable" in rec.earlier[0]["reason"]
    )
    assert backend.host_calls[0][1] == Path("/p/tasks/read_widget")  # cwd: the grading file's directory
    assert backend.host_calls[0][2]["FORGE_INSTRUCTION"] == "say why"
    grade = load(run_dir / "trials" / "read_widget" / "0" / "grade.yaml")
    assert grade["score"] == pytest.approx(0.95) and grade["details"]["judge"]["reason"] == "ok"


@pytest.mark.parametrize("mutating", [False, True])
def test_a_file_many_checks_read_is_read_once_unless_a_check_mutates(
    tmp_path: Path, fake_backend: Any, mutating: bool
) -> None:
    note = {"service": "runner", "path": "/work/note.md"}
    checks = [Check(f"c{i}", "file", {**note, "contains": "x"}) for i in range(4)]
    if mutating:  # a POST may change the note between two reads: each check reads it itself, in order
        checks.append(Check("poke", "http", {"service": "api", "port": 80, "method": "POST", "status": 200}))
    backend = fake_backend()
    run(plan(tmp_path, [make_task("t", checks=checks)], repeats=1), backend)
    reads = [a for _, a, _ in backend.stacks[("t", 0)].calls if a == ("cat", "--", "/work/note.md")]
    assert len(reads) == (4 if mutating else 1)


@pytest.mark.parametrize("phase", ["oracle", "grading"])
def test_an_exec_the_stop_killed_leaves_an_interrupted_trial_with_no_failure_on_record(
    tmp_path: Path, fake_backend: Any, ctrl_c: Callable[[], None], phase: str
) -> None:
    """Ctrl-C while the oracle (or a check) runs: its exec dies and raises Interrupted, which now reaches the
    executor as it is (no crash, no failure): the trial is interrupted and nothing on record blames the
    oracle or a check (the record's rewrite of an interrupted trial already hid them; see the next test for
    where they showed)."""
    from forgelib.errors import Interrupted

    torn_down = threading.Event()
    program = "python3" if phase == "oracle" else "cat"

    def answer(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
        if argv[0] == program and not torn_down.is_set():
            ctrl_c()
            assert torn_down.wait(60), "the main thread never tore the stack down"
            raise Interrupted("stop requested (SIGINT): `exec` was stopped")
        return good_answer(service, argv, kw)

    run_plan = plan(tmp_path, [widget_task("a")], repeats=1)
    with pytest.raises(KeyboardInterrupt):
        run_project(run_plan, _SignalsTeardown(answer, done=torn_down), lambda line: None)
    (run_dir,) = (tmp_path / "runs").iterdir()
    state = ev.fold(ev.read_events(run_dir / ev.EVENTS_FILE))
    assert state.interrupted and state.trials[("a", 0)].status == "interrupted"
    text = "\n".join(p.read_text() for p in (run_dir / "trials" / "a" / "0").rglob("*.yaml"))
    assert "stop requested" not in text and "could not run" not in text, text


@pytest.mark.parametrize("phase", ["oracle", "grading"])
def test_an_exec_killed_by_the_stop_is_an_interruption_even_before_the_run_knows_it_is_stopping(
    tmp_path: Path, fake_backend: Any, phase: str
) -> None:
    """The signal handler kills the in-flight execs at once; the main thread sets the run's stop a moment
    later. A worker whose oracle (or check) exec died in between gets Interrupted from the runner: that
    trial is interrupted, never failed (before, its "could not run: stop requested" failed it)."""
    from forgelib.errors import Interrupted

    program = "python3" if phase == "oracle" else "cat"

    def answer(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
        if argv[0] == program:
            raise Interrupted("stop requested (SIGINT): `exec` was stopped")
        return good_answer(service, argv, kw)

    _, state, _ = run(plan(tmp_path, [widget_task("a")], repeats=1), fake_backend(answer))
    assert state.trials[("a", 0)].status == "interrupted"
