"""The stacks the pytest plugin hands to tests: provisioned, reused, reset and torn down per process.

Kept apart from ``pytest_plugin`` (the pytest glue) so it imports no pytest and the plugin module stays
cheap to import: nothing here is loaded until a test asks for ``forge_stack``.

* ``StackPool`` — one per pytest process (each xdist worker has its own): a run id naming the worker, a
  temp dir for the trials' override files and logs, the process's stacks (``stacks.open``, as ``forge
  run`` opens its own: the registry the signal handler tears down, the budget and the start bound) and
  the projects loaded so far. A thin front end over its backends: a fresh one for a function-scoped
  test, a scope's backend with a warm pool for module/session scope; every backend shares the process's
  shared stacks and cache, so an all-``shared`` environment is one stack for the session whichever scope
  asks. Every stack goes back through the backend it came from.
* ``ForgeStack`` — what a test gets: a view of the one ``Stack`` handle (``forge_stack.stack``) that adds
  only the test's side: ``exec`` (through the runner seam, the session's timeout), ``url``/``port``
  (published ports), ``client``/``url`` (any kind's direct loopback client, by the service's kind) with
  the named ``postgres``/``mysql``/``redis``, the clients closed when the test ends, and ``log_tails``
  for the report of a failed test.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from forgelib.docker.labels import owned_temp_dir
from forgelib.errors import ForgeError, Interrupted, ProvisionError
from forgelib.kinds import KINDS
from forgelib.runner import Result, Runner, SubprocessRunner
from forgelib.spec.models import Project, Task, Timeouts
from forgelib.stacks import DockerBackend, Stacks, connect
from forgelib.stacks import open as open_stacks
from forgelib.stacks.live import LiveStacks, StopState
from forgelib.stacks.provision import DEFAULT_TASK
from forgelib.stacks.reaper import PYTEST_DIR
from forgelib.stacks.stack import Stack

if TYPE_CHECKING:
    import psycopg
    import pymysql
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
_C = TypeVar("_C", bound="_Closeable")


class _Closeable(Protocol):
    def close(self) -> None: ...


@dataclass(repr=False)
class ForgeStack:
    """One provisioned stack, as a test sees it (the ``forge_stack`` fixture's value).

    A view of one ``Stack`` (``stack``: the one handle, which ``forge run``, grading, the MCP tools and
    ``connect`` take; pass it to them), holding nothing of the stack's own: every stack fact is read from
    it. What the view adds is the test's: the clients opened for the test, closed when it ends; ``exec``
    bounded by the session's command timeout; the project, task and run id it was asked for; the kinds'
    clients by service (``client``, ``url``) and typed named forms for postgres, mysql and redis
    (``postgres``, ``mysql``, ``redis`` and their ``_dsn``/``_url``); ``log_tails`` for a failed test's
    report.
    """

    stack: Stack
    project: Project
    task: Task | None
    run_id: str
    timeouts: Timeouts
    _closers: list[Callable[[], object]] = field(default_factory=list, repr=False)

    def __repr__(self) -> str:  # pytest prints fixture values in failure reports: keep it one short line
        task = self.task.name if self.task is not None else "(default environment)"
        return f"<ForgeStack {self.name}: {self.project.name} {task}>"

    @property
    def trial(self) -> Stack:
        """``stack``, by the name the fixture's users may already write."""
        return self.stack

    @property
    def name(self) -> str:
        """The compose project name (``docker compose -p NAME ...`` reaches the stack by hand)."""
        return self.stack.name

    @property
    def services(self) -> tuple[str, ...]:
        return self.stack.services

    @property
    def bare_seeds(self) -> Mapping[str, Path]:
        """service -> the absolute host path of its seed's extra mount (``Recipe.seed_mount``: a ``bare``
        seed, mounted read-only in the service at ``/run/forge/seeds/<seed>``, named by ``FORGE_SEED_<SEED>``
        there)."""
        return {svc: m.host_path for svc, m in self.stack.bare_seeds.items()}

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
        return self.stack.compose.exec(
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
        return self.stack.port(service, container_port)

    def url(self, service: str, container_port: int | None = None, path: str = "", **keywords: Any) -> str:
        """``http://127.0.0.1:PORT`` (plus ``path``) for ``service``'s published ``container_port``; with no
        port, the service's connection URL as its kind writes it (``postgresql://``, ``mysql://``,
        ``redis://``; the kind's keywords: ``database``, ``db``), for code under test that connects itself."""
        if container_port is None:
            if path:
                raise ForgeError(f"url({service!r}, path={path!r}): a path needs the container port it is on")
            return self._direct(service, lambda: connect.url(self.stack, service, **keywords))
        if keywords:
            raise ForgeError(
                f"url({service!r}, {container_port}): {', '.join(keywords)} apply to no HTTP URL"
            )
        host, port = self.port(service, container_port)
        if path and not path.startswith("/"):
            path = "/" + path
        return f"http://{host}:{port}{path}"

    def client(self, service: str, **keywords: Any) -> Any:
        """A client of ``service`` on its loopback port, as its kind opens one (psycopg, PyMySQL,
        redis-py; the kind's keywords: ``database``/``autocommit``, ``db``/``decode_responses``; ``kind=``
        names the kind of a service forge does not recognise). Closed when the test ends."""
        return self._opened(self._direct(service, lambda: connect.client(self.stack, service, **keywords)))

    # The named forms: typed, with the kind given (so they also reach a service forge does not recognise).

    def postgres(
        self, service: str, *, database: str | None = None, autocommit: bool = True
    ) -> psycopg.Connection[Any]:
        """A psycopg connection to ``service`` on its loopback port, as its seed connected (user, database
        and password from the resolved compose config). Autocommit by default; closed when the test ends
        (``with`` closes it sooner)."""
        params = self._direct(service, lambda: connect.postgres(self.stack, service, database=database))
        return self._opened(params.connect(autocommit=autocommit))

    def postgres_dsn(self, service: str, *, database: str | None = None) -> str:
        """The libpq connection string of ``postgres`` (for code under test that connects itself)."""
        return self._direct(service, lambda: connect.postgres(self.stack, service, database=database)).dsn()

    def mysql(
        self, service: str, *, database: str | None = None, autocommit: bool = True
    ) -> pymysql.Connection[Any]:
        """A PyMySQL connection to a MySQL/MariaDB ``service`` on its loopback port, as its seed connected
        (root, or the binding's ``user``, password from the resolved compose config). Autocommit by
        default; closed when the test ends."""
        params = self._direct(service, lambda: connect.mysql(self.stack, service, database=database))
        return self._opened(params.connect(autocommit=autocommit))

    def mysql_url(self, service: str, *, database: str | None = None) -> str:
        """The ``mysql://`` URL of ``mysql`` (for code under test that connects itself)."""
        return self._direct(service, lambda: connect.mysql(self.stack, service, database=database)).url()

    def redis(self, service: str, *, db: int = 0, decode_responses: bool = False) -> redis.Redis:
        """A ``redis.Redis`` client of ``service`` on its loopback port (its ``--requirepass``, if any);
        closed when the test ends."""
        params = self._direct(service, lambda: connect.redis(self.stack, service, db=db))
        return self._opened(params.client(decode_responses=decode_responses))

    def redis_url(self, service: str, *, db: int = 0) -> str:
        return self._direct(service, lambda: connect.redis(self.stack, service, db=db)).url()

    def _opened(self, client: _C) -> _C:
        self.on_release(client.close)
        return client

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
        return {svc: self.stack.compose.log_tail(svc, lines) for svc in self.services}

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
    notes: list[str] = field(default_factory=list)  # for the terminal summary
    profiles: tuple[str, ...] = ()  # compose profiles enabled in every stack (ini `forge_profiles`)
    _root: Path | None = None
    _projects: dict[Path, Project] = field(default_factory=dict)
    _index: Iterator[int] = field(default_factory=itertools.count)
    # The process's stacks (``stacks.open``, as ``forge run`` opens its own): the registry the signal
    # handler tears down, the budget and start bound, and, shared by every backend of the process, the
    # shared stacks (environments whose services are all ``shared``: one stack for every test that names
    # them) and what provisioning learns once. Opened around the test loop (``opened``), or at the first
    # stack when the pool is used on its own; closed by ``close``.
    _session: Stacks | None = None
    _closing: contextlib.ExitStack[bool | None] = field(default_factory=contextlib.ExitStack)
    _left: list[str] = field(default_factory=list)  # what closed sessions could not tear down
    _covered: bool = False  # the shared stacks are registered for Ctrl-C's sweep (and close())

    # ------------------------------------------------------------------------------------- lifecycle

    @contextlib.contextmanager
    def opened(self, *, heal: Callable[[str], None] | None = None) -> Iterator[StopState]:
        """The test loop's stacks: Ctrl-C and SIGTERM tear them down (``signals.interruptible``); ``heal``:
        the reaper runs first. Everything still up goes when the block ends."""
        with self._open(signals=True, heal=heal) as session:
            self._session = session
            try:
                yield session.stop
            finally:
                self._session, self._covered = None, False
        self._left += session.left

    def _open(
        self, *, signals: bool, heal: Callable[[str], None] | None = None
    ) -> AbstractContextManager[Stacks]:
        return open_stacks(
            None, runner=self.runner, timeouts=self.timeouts, log_tail_lines=self.log_tail_lines,
            profiles=self.profiles, signals=signals, heal=heal,
        )  # fmt: skip

    def session(self) -> Stacks:
        """The process's stacks: the test loop's, else opened now (no signal handlers) until ``close``."""
        if self._session is None:
            self._session = self._closing.enter_context(self._open(signals=False))
        return self._session

    @property
    def stacks(self) -> LiveStacks:
        return self.session().live

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
        """A backend of ``project`` over this process's stacks; ``warm``: with a warm pool of its own (one
        scope's: a stack per environment while the memory budget holds them), as ``forge run --stacks
        warm``."""
        return self.session().backend_of(project, mode="warm" if warm else "fresh")

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
            shared = self.session().shared
            assert shared is not None  # opened with scope "run"
            self.stacks.add(
                f"{self.run_id}-shared", lambda graceful: shared.teardown_run(self.run_id), started=True
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
        if trial.source.get("replaced"):
            self.notes.append(f"{trial.name} replaces a stack not proven clean: {trial.source['replaced']}")
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
        session, self._session = self._session, None
        self._closing.close()
        failed = [*self._left, *(session.left if session is not None else [])]
        self._left = []
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
