"""Fakes for the run orchestrator: a stack answering exec/port from a Python function, a backend that
provisions such stacks (or raises ProvisionError on cue), and builders for tasks."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from forgelib.docker.resolved import ResolvedConfig
from forgelib.errors import CommandTimeout, ProvisionError
from forgelib.grading.checks import ExecOptions
from forgelib.run.execute import TrialRequest
from forgelib.runner import Result
from forgelib.spec.models import Check, EnvironmentManifest, Grading, Oracle, Task
from forgelib.stacks.stack import Stack

Answer = Callable[[str, tuple[str, ...], Mapping[str, Any]], Result]


def ok(stdout: str = "", rc: int = 0, stderr: str = "") -> Result:
    return Result(("fake",), rc, stdout, stderr, 0.01)


@dataclass
class FakeStack:
    """exec/port answered by ``answer(service, argv, kwargs)``; every call recorded."""

    answer: Answer
    # The default task's app-db (postgres by its POSTGRES_* contract) published on loopback, as forge's
    # override publishes a seeded service's port.
    ports: dict[tuple[str, int], tuple[str, int]] = field(
        default_factory=lambda: {("app-db", 5432): ("127.0.0.1", 49153)}
    )
    calls: list[tuple[str, tuple[str, ...], dict[str, Any]]] = field(default_factory=list)

    def exec(self, service: str, argv: Sequence[str], **o: Unpack[ExecOptions]) -> Result:
        kw = {
            "stdin": o.get("stdin"), "timeout": o["timeout"], "env": o.get("env"),
            "workdir": o.get("workdir"), "secrets": tuple(o.get("secrets", ())),
        }  # fmt: skip
        self.calls.append((service, tuple(argv), kw))
        path, err_path = o.get("stdout_path"), o.get("stderr_path")
        try:
            r = self.answer(service, tuple(argv), kw)
        except CommandTimeout as e:  # what it printed before the kill is in the files (as the real runner)
            if path is not None:
                path.write_text(e.stdout_tail)
            if err_path is not None:
                err_path.write_text(e.stderr_tail)
            raise
        if err_path is not None:  # as the real runner: stderr to the file, its tail in the result
            err_path.write_text(r.stderr)
        if path is None:
            return r
        path.write_text(r.stdout)  # as the real runner: stdout to the file, none in the result
        return dataclasses.replace(r, stdout="")

    def port(self, service: str, container_port: int) -> tuple[str, int]:
        return self.ports[(service, container_port)]


# The provisioning sub-phases the fake backend reports (a real one: compose_config, up_seeded, ...).
FAKE_PROVISION_PHASES = {"compose_up": 1.0, "seed:app-db": 0.5}


@dataclass
class FakeHandle:
    name: str
    compose: FakeStack
    timings: dict[str, float] = field(default_factory=lambda: dict(FAKE_PROVISION_PHASES))
    config: Mapping[str, Any] = field(default_factory=dict)  # the resolved compose config
    bare_seeds: Mapping[str, Any] = field(default_factory=dict)  # service -> BareMount
    ports: Mapping[str, list[str]] = field(default_factory=dict)
    snapshots: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source: Mapping[str, Any] = field(default_factory=dict)
    pooled: bool = False
    environment: EnvironmentManifest | None = None  # the task's (its seed bindings)

    # What consumers read of a Stack's services and how they reach them: Stack's own code, over the fake.
    @property
    def resolved(self) -> ResolvedConfig:
        return ResolvedConfig.of(self.config)

    services = Stack.services
    service = Stack.service
    kind = Stack.kind
    exec = Stack.exec
    port = Stack.port


SETUP_INDEX = -1  # the key of a task's setup stack in FakeBackend's records (its trials count from 0)


@dataclass
class FakeBackend:
    """Provisions FakeStacks; ``fail`` maps (task, index) to a ProvisionError to raise instead."""

    answer: Answer
    fail: dict[tuple[str, int], ProvisionError] = field(default_factory=dict)
    on_provision: Callable[[str, int], None] | None = None
    provisioned: list[tuple[str, int]] = field(default_factory=list)
    torn_down: list[str] = field(default_factory=list)
    logs_captured: list[str] = field(default_factory=list)
    leftovers_discarded: list[str] = field(default_factory=list)
    finished_runs: list[str] = field(default_factory=list)
    stacks: dict[tuple[str, int], FakeStack] = field(default_factory=dict)
    host_answer: Callable[[tuple[str, ...], str | None], Result] = lambda argv, input: ok()
    host_calls: list[tuple[tuple[str, ...], Path, dict[str, str], str | None]] = field(default_factory=list)
    launch_answer: Callable[[tuple[str, ...], Mapping[str, Any]], Result] = lambda argv, options: ok()
    launches: list[tuple[tuple[str, ...], dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    checkpoints: list[str] = field(default_factory=list)  # the stacks checkpointed (tasks' setups)
    requests: list[dict[str, Any]] = field(default_factory=list)  # every provision's keywords

    def provision(self, task: Task, **trial: Unpack[TrialRequest]) -> FakeHandle:
        run_id, trial_index, trial_dir = trial["run_id"], trial["trial_index"], trial["trial_dir"]
        on_phase, attempt = trial.get("on_phase"), trial.get("attempt", 1)
        key = (task.name, SETUP_INDEX if trial.get("setup") else trial_index)
        with self.lock:
            self.provisioned.append(key)
            self.requests.append({"task": task.name, **trial})
        if self.on_provision is not None:
            self.on_provision(*key)
        if key in self.fail:
            (trial_dir / "services").mkdir(parents=True, exist_ok=True)
            (trial_dir / "services" / "app-db.log").write_text("psql: ERROR\n")
            raise self.fail[key]
        if on_phase is not None:
            on_phase("compose_up", 1.0)
        stack = FakeStack(self.answer)
        with self.lock:
            self.stacks[key] = stack
        tail = "setup" if trial.get("setup") else str(trial_index)
        name = f"proj-{run_id}-{task.name}-{tail}".lower() + (f"-a{attempt}" if attempt > 1 else "")
        return FakeHandle(name, stack, config=task.environment.compose, environment=task.environment)

    def capture_logs(self, trial: Any, dest_dir: Path, tail_lines: int) -> None:
        dest_dir.mkdir(parents=True, exist_ok=True)
        (dest_dir / "app-db.log").write_text(f"log of {trial.name}\n")
        with self.lock:
            self.logs_captured.append(trial.name)

    def teardown(self, trial: Any, *, graceful: bool = True) -> float:
        with self.lock:
            self.torn_down.append(trial.name)
        return 0.1

    def run_host(
        self, argv: Sequence[str], *, timeout: float, cwd: Path, env: Mapping[str, str], input: str | None
    ) -> Result:
        with self.lock:
            self.host_calls.append((tuple(argv), cwd, dict(env), input))
        return self.host_answer(tuple(argv), input)

    def launch_host(self, argv: Sequence[str], **options: Any) -> Result:
        with self.lock:
            self.launches.append((tuple(argv), dict(options)))
        return self.launch_answer(tuple(argv), options)

    def checkpoint(self, trial: Any, run_id: str) -> str:
        with self.lock:
            self.checkpoints.append(trial.name)
        return f"ck-{len(self.checkpoints):012x}"

    def discard_leftovers(self, run_id: str) -> None:
        self.leftovers_discarded.append(run_id)

    def finish_run(self, run_id: str) -> None:
        self.finished_runs.append(run_id)


def make_task(
    name: str = "read_widget",
    *,
    oracle: Oracle | None = None,
    checks: Sequence[Check] = (),
    threshold: float = 1.0,
    compose: Mapping[str, Any] | None = None,
) -> Task:
    env = EnvironmentManifest(
        compose_files=(Path("/p/compose.yaml"),),
        services={},
        compose=compose
        or {"services": {"app-db": {"environment": {"POSTGRES_USER": "app", "POSTGRES_DB": "shop"}}}},
    )
    grading = Grading(Path(f"/p/tasks/{name}/grading.yaml"), tuple(checks), threshold) if checks else None
    return Task(name, Path(f"/p/tasks/{name}/task.yaml"), "", env, oracle, grading)


def widget_task(name: str = "read_widget") -> Task:
    """An oracle writing /work/out.txt, a file check on it and a sql check on app-db."""
    return make_task(
        name,
        oracle=Oracle(service="runner", command=("python3", "/pack/oracle.py"), timeout=30),
        checks=[
            Check("out_file", "file", {"service": "runner", "path": "/work/out.txt", "equals": "baseline"}),
            Check("db_row", "sql", {"service": "app-db", "query": "select 1", "equals": "1"}, weight=2),
        ],
    )


def good_answer(service: str, argv: tuple[str, ...], kw: Mapping[str, Any]) -> Result:
    if argv[0] == "cat":
        return ok("baseline\n")
    if argv[0] == "psql":
        return ok("1\n")
    return ok()
