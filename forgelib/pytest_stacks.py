"""The stacks the pytest plugin hands to tests: provisioned, reused, reset and torn down per process.

Kept apart from ``pytest_plugin`` (the pytest glue) so it imports no pytest and the plugin module stays
cheap to import: nothing here is loaded until a test asks for ``forge_stack``.

* ``StackPool`` — one per pytest process (each xdist worker has its own): a run id naming the worker, a
  temp dir for the trials' override files and logs, the ``LiveStacks`` registry the signal handler tears
  down, and the projects loaded so far. A thin front end over ``stacks.DockerBackend``, ``forge run``'s
  own: a fresh backend for a function-scoped test, a scope's backend with a warm pool for module/session
  scope; every backend shares the process's shared stacks and cache, so an all-``shared`` environment is
  one stack for the session whichever scope asks. Every stack goes back through the backend it came from.
* ``ForgeStack`` — what a test gets: ``exec`` (through the runner seam), ``url``/``port`` (published ports),
  ``postgres``/``redis`` (direct loopback clients) and ``log_tails`` for the report of a failed test.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from forgelib.custody import PYTEST_DIR
from forgelib.errors import ForgeError, Interrupted, ProvisionError
from forgelib.kinds import KINDS
from forgelib.labels import owned_temp_dir
from forgelib.provision import DEFAULT_TASK, ProvisionCache, ProvisionedTrial, StackContext
from forgelib.resolved import ResolvedConfig
from forgelib.runner import Result, Runner, SubprocessRunner
from forgelib.signals import LiveStacks, StopState
from forgelib.spec.models import Project, Task, Timeouts
from forgelib.stacks import DockerBackend, SharedStacks

if TYPE_CHECKING:
    import psycopg
    import redis

log = logging.getLogger("forgelib.pytest")

RUN_PREFIX = "pytest"
DEFAULT_LOG_TAIL = 50  # lines per service attached to a failed test's report


def run_id_for(testrun: str, worker: str | None) -> str:
    """The ``io.forgelib.run`` label of one pytest process's stacks: the session's id, then the xdist
    worker (``pytest-1a2b3c4d-gw0``), so the controller can reap a crashed worker's stacks by run id."""
    base = f"{RUN_PREFIX}-{testrun[:8]}"
    return f"{base}-{worker}" if worker else base


class ProvisionFailed(Exception):
    """``ProvisionError`` plus the service logs it left on disk (read before the temp dir goes)."""

    def __init__(self, error: ProvisionError, logs: Mapping[str, str]) -> None:
        super().__init__(str(error))
        self.error = error
        self.logs = dict(logs)


_P = TypeVar("_P")


@dataclass(repr=False)
class ForgeStack:
    """One provisioned stack, as a test sees it (the ``forge_stack`` fixture's value)."""

    trial: ProvisionedTrial
    project: Project
    task: Task | None
    run_id: str
    timeouts: Timeouts
    _closers: list[Callable[[], object]] = field(default_factory=list, repr=False)

    def __repr__(self) -> str:  # pytest prints fixture values in failure reports: keep it one short line
        task = self.task.name if self.task is not None else "(default environment)"
        return f"<ForgeStack {self.name}: {self.project.name} {task}>"

    @property
    def name(self) -> str:
        """The compose project name (``docker compose -p NAME ...`` reaches the stack by hand)."""
        return self.trial.name

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(ResolvedConfig.of(self.trial.config).services)

    @property
    def bare_seeds(self) -> Mapping[str, Path]:
        """service -> the absolute host path of its seed's extra mount (``Recipe.seed_mount``: a ``bare``
        seed, mounted read-only in the service at ``/run/forge/seeds/<seed>``, named by ``FORGE_SEED_<SEED>``
        there)."""
        return {svc: m.host_path for svc, m in self.trial.bare_seeds.items()}

    def exec(
        self,
        service: str,
        argv: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> Result:
        """``docker compose exec`` in ``service`` through the runner; a non-zero exit raises
        ``CommandError`` (with argv, rc and output tails) unless ``check=False``."""
        return self.trial.compose.exec(
            service,
            argv,
            input=input,
            env=env,
            workdir=workdir,
            user=user,
            timeout=self.timeouts.command if timeout is None else timeout,
            check=check,
        )

    def port(self, service: str, container_port: int) -> tuple[str, int]:
        """(host, port) where the host reaches ``service:container_port`` (the port must be published)."""
        return self.trial.compose.port(service, container_port)

    def url(self, service: str, container_port: int, path: str = "") -> str:
        """``http://127.0.0.1:PORT`` (plus ``path``) for ``service``'s published ``container_port``."""
        host, port = self.port(service, container_port)
        if path and not path.startswith("/"):
            path = "/" + path
        return f"http://{host}:{port}{path}"

    def postgres(
        self, service: str, *, database: str | None = None, autocommit: bool = True
    ) -> psycopg.Connection[Any]:
        """A psycopg connection to ``service`` on its loopback port, as its seed connected (user, database
        and password from the resolved compose config). Autocommit by default; closed when the test ends
        (``with`` closes it sooner)."""
        from forgelib import connect

        conn = self._direct(service, lambda: connect.postgres(self.trial, service, database=database))
        client = conn.connect(autocommit=autocommit)
        self.on_release(client.close)
        return client

    def postgres_dsn(self, service: str, *, database: str | None = None) -> str:
        """The libpq connection string of ``postgres`` (for code under test that connects itself)."""
        from forgelib import connect

        return self._direct(service, lambda: connect.postgres(self.trial, service, database=database)).dsn()

    def redis(self, service: str, *, db: int = 0, decode_responses: bool = False) -> redis.Redis:
        """A ``redis.Redis`` client of ``service`` on its loopback port (its ``--requirepass``, if any);
        closed when the test ends."""
        from forgelib import connect

        params = self._direct(service, lambda: connect.redis(self.trial, service, db=db))
        client = params.client(decode_responses=decode_responses)
        self.on_release(client.close)
        return client

    def redis_url(self, service: str, *, db: int = 0) -> str:
        from forgelib import connect

        return self._direct(service, lambda: connect.redis(self.trial, service, db=db)).url()

    def _direct(self, service: str, params: Callable[[], _P]) -> _P:
        try:
            return params()
        except ForgeError as e:
            if "does not publish" not in str(e):
                raise
            seeded = " or ".join(s for k in KINDS if k.client for s in k.seeds)
            raise ForgeError(
                f"{e} (forge publishes the port of each reset service seeded by {seeded} on "
                f'127.0.0.1; for any other service, publish it in the compose file, e.g. ports: ["5432"])'
            ) from e

    def log_tails(self, lines: int = DEFAULT_LOG_TAIL) -> dict[str, str]:
        """service -> its last ``lines`` log lines (never raises: it explains a failure)."""
        return {svc: self.trial.compose.log_tail(svc, lines) for svc in self.services}

    def on_release(self, closer: Callable[[], object]) -> None:
        """Run ``closer`` when the test that holds the stack ends (clients opened for it are closed)."""
        self._closers.append(closer)

    def release(self) -> None:
        """End of one test's use: close what it opened, newest first (the stack itself stays up)."""
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception as e:  # noqa: BLE001 - a client that cannot close must not keep the stack up
                log.warning("closing a client of %s failed: %s", self.name, e)


@dataclass
class StackPool:
    """The stacks of one pytest process. Not thread-safe: pytest runs a process's tests one at a time."""

    run_id: str
    timeouts: Timeouts = field(default_factory=Timeouts)
    log_tail_lines: int = DEFAULT_LOG_TAIL
    runner: Runner = field(default_factory=lambda: SubprocessRunner(default_timeout=Timeouts().command))
    stacks: LiveStacks = field(default_factory=LiveStacks)
    stop: StopState | None = None  # set while the test loop runs inside signals.interruptible
    notes: list[str] = field(default_factory=list)  # for the terminal summary
    profiles: tuple[str, ...] = ()  # compose profiles enabled in every stack (ini `forge_profiles`)
    _root: Path | None = None
    _projects: dict[Path, Project] = field(default_factory=dict)
    _index: Iterator[int] = field(default_factory=itertools.count)
    # As ``forge run``'s backend owns them, shared by every backend of the process: the shared stacks
    # (environments whose services are all ``shared``: one stack for every test that names them) and what
    # provisioning learns once.
    _shared: SharedStacks = field(default_factory=SharedStacks)
    _cache: ProvisionCache = field(default_factory=ProvisionCache)
    _covered: bool = False  # the shared stacks are registered for Ctrl-C's sweep (and close())

    # ------------------------------------------------------------------------------------- lifecycle

    def _guarded(self) -> Runner:
        # After Ctrl-C/SIGTERM nothing new is launched; teardown and log capture still pass.
        return self.stop.guard(self.runner) if self.stop is not None else self.runner

    def root(self) -> Path:
        if self._root is None:
            # Named after this process, so the reaper removes it once a kill left it behind.
            self._root = owned_temp_dir(PYTEST_DIR)
        return self._root

    def load(self, path: Path) -> Project:
        """The project at ``path``, loaded (and its digests verified) once per process."""
        key = path.resolve()
        if key not in self._projects:
            from forgelib.spec.loader import load_project_config

            self._projects[key] = load_project_config(key)
        return self._projects[key]

    def backend(self, project: Project, *, warm: bool = False) -> DockerBackend:
        """A backend of ``project`` over this process's shared stacks and cache; ``warm``: with a warm pool
        of its own (one scope's: a stack per environment, evicting none), as ``forge run --stacks warm``."""
        ctx = StackContext(
            project, self.timeouts, self._guarded(), self._cache, self.log_tail_lines, self.profiles
        )
        pool = None
        if warm:
            from forgelib.warm import WarmPool

            pool = WarmPool(
                ctx,
                workers=1_000,  # one test at a time here: keep a stack per environment, evict none
                stacks=self.stacks,
                stopping=lambda: self.stop is not None and self.stop.requested,
            )
        return DockerBackend(ctx, shared=self._shared, pool=pool)

    def provision(self, project_dir: Path, task_name: str | None) -> ForgeStack:
        """A stack of ``task_name`` (None: the project's default environment) for one test, seeds applied:
        a fresh one (an all-``shared`` environment: the session's one stack).

        Raises ``ProvisionFailed`` (the stack is down by then) with the service logs provisioning saved.
        """
        project = self.load(project_dir)
        return self._take(self.backend(project), project, task_name)

    def _take(self, backend: DockerBackend, project: Project, task_name: str | None) -> ForgeStack:
        """A stack from ``backend``, registered to go back to it (``give_back``, or a Ctrl-C's sweep)."""
        task = project.task(task_name) if task_name else None
        index = next(self._index)
        trial_dir = self.root() / f"{index}"
        if not self._covered:  # the session's shared stacks go at close() (or with a Ctrl-C)
            self.stacks.add(
                f"{self.run_id}-shared", lambda graceful: self._shared.teardown_run(self.run_id), started=True
            )
            self._covered = True
        as_task = task or Task(DEFAULT_TASK, project.path, "", project.environment)
        try:
            trial = backend.provision(as_task, run_id=self.run_id, trial_index=index, trial_dir=trial_dir)
        except ProvisionError as e:
            raise ProvisionFailed(e, _log_files(trial_dir / "services", self.log_tail_lines)) from e
        try:
            self.stacks.add(trial.name, lambda graceful: backend.teardown(trial, graceful=graceful))
        except Interrupted:  # a stop came first: the registry is closed, so give it back here
            backend.teardown(trial, graceful=False)
            raise
        if trial.stack.get("replaced"):
            self.notes.append(f"{trial.name} replaces a stack not proven clean: {trial.stack['replaced']}")
        return ForgeStack(trial, project, task, self.run_id, self.timeouts)

    # -------------------------------------------------- stacks tests share (module / session scope)

    def acquire(
        self, project_dir: Path, task_name: str | None, warm: dict[Path, DockerBackend]
    ) -> ForgeStack:
        """A stack the tests of one scope share, from that scope's ``warm`` backends (one per project,
        each with its warm pool: the warm stacks of ``forge run --stacks warm``). Before every reuse its
        reset services are reset in place and fingerprint-checked and its other services recreated; a stack
        that cannot be proven clean is replaced by a fresh one (noted in the session summary)."""
        project = self.load(project_dir)
        backend = warm.get(project.root)
        if backend is None:
            backend = warm[project.root] = self.backend(project, warm=True)
        return self._take(backend, project, task_name)

    def give_back(self, stack: ForgeStack, warm: dict[Path, DockerBackend]) -> None:
        """The test is over: close its clients; the stack goes back to its backend (a warm one keeps it)."""
        self.teardown(stack)

    def close_warm(self, warm: dict[Path, DockerBackend]) -> None:
        """The scope is over: every warm stack of it goes."""
        errors = []
        for backend in warm.values():
            try:
                backend.close_warm()
            except ForgeError as e:
                errors.append(str(e))
        warm.clear()
        if errors:
            raise ForgeError("\n".join(errors))

    def teardown(self, stack: ForgeStack) -> None:
        """Close the stack's clients and give it back to its backend: a fresh one removed (``down
        --volumes``), the session's shared one left up, a warm one kept for the scope's next test. A
        failure raises."""
        stack.release()
        if stack.name not in self.stacks.names():
            return  # a Ctrl-C (or -x) sweep removed it already
        why = self.stacks.teardown(stack.name)
        if why is not None:
            raise ForgeError(f"tearing down {stack.name} failed: {why}")

    def close(self) -> list[str]:
        """End of the session: remove whatever is still registered, the images built for ``build:``
        services (as ``forge run`` does at its end) and the temp dir; the failures."""
        report = self.stacks.teardown_all()
        failed = [f"{name}: {why}" for name, why in sorted(report.failed.items())]
        try:
            self._cache.builds.finish(self.runner, self.timeouts.command)
        except ForgeError as e:
            failed.append(str(e))
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
        return failed


def _log_files(services: Path, lines: int) -> dict[str, str]:
    """service -> the last ``lines`` of the log a failed provision saved as ``services/<svc>.log``."""
    out = {}
    for path in sorted(services.glob("*.log")) if services.is_dir() else ():
        with contextlib.suppress(OSError):
            text = path.read_text(encoding="utf-8", errors="replace").splitlines()
            out[path.stem] = "\n".join(text[-lines:])
    return out
