"""forgelib's pytest plugin: seeded compose stacks as fixtures (the ``pytest11`` entry point ``forgelib``).

    @pytest.mark.forge(project="examples/multi_service_postgres_reset", task="read_widget")
    def test_reads_baseline(forge_stack): ...

Inert until a test asks for ``forge_stack``: importing this module imports pytest and the standard library
only, and a session none of whose tests uses the fixture never touches Docker, installs no signal handler
and starts no reaper. A session that uses it runs the reaper once, before its first test: the process
itself, or under pytest-xdist the controller, before it hands out any test (``_heal``). ``-p no:forgelib``
turns it off altogether. The stacks themselves (provisioning, reuse, reset, teardown) are
``forgelib.pytest_plugin.stacks``; this module is the pytest glue: the marker, the fixture, the report
sections, signals and xdist.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from forgelib.pytest_plugin.stacks import ForgeStack, StackPool

MARKER = "forge"
FIXTURE = "forge_stack"
SCOPES = ("function", "module", "session")
_ARGS = ("project", "task", "scope")

_POOL = pytest.StashKey["StackPool"]()
_STACK = pytest.StashKey["ForgeStack"]()  # the stack a test holds (its log tails go into a failed report)
_LOGS = pytest.StashKey[dict[str, str]]()  # logs a failed provision left, for the item's error report
_WORKERS = pytest.StashKey[dict[str, bool]]()  # xdist controller: worker run id -> may have left stacks
_WORKER_RUN = "forgelib_run_id"  # workeroutput key: the run id of a worker that made stacks
_WORKER_NOTES = "forgelib_notes"  # workeroutput key: a worker's summary notes, printed by the controller
_NOTES = pytest.StashKey[list[str]]()  # this process's lines of the "forgelib" terminal summary section
_HEALED = pytest.StashKey[bool]()  # the session's reaper has run (in this process)
_USES_STACKS = pytest.StashKey[Path]()  # xdist controller: the dir a worker whose tests use stacks creates
_CONTROLLER_HEALS = "forgelib_uses_stacks"  # workerinput key: that file's path (local workers only)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "forge_log_tail_lines",
        "forgelib: lines of each service's log attached to a failed test's report (default 50)",
        default="50",
    )
    parser.addini(
        "forge_profiles",
        "forgelib: compose profiles to enable in every stack (like a run config's `profiles`)",
        type="args",
        default=[],
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(project, task=None, scope='function'): the compose stack `{FIXTURE}` provisions — "
        "a forgelib project directory (relative to the rootdir), one of its tasks (default: the project's "
        "own environment), and function (a fresh stack per test), module or session (one stack, its reset "
        "services reset between tests)",
    )


# ----------------------------------------------------------------------------------------------- marker


@dataclass(frozen=True)
class ForgeMarker:
    project: Path
    task: str | None
    scope: str


def _usage(text: str) -> NoReturn:
    pytest.fail(f"@pytest.mark.{MARKER}: {text}", pytrace=False)


def stack_spec(item: pytest.Item) -> ForgeMarker:
    """What the closest ``forge`` marker (function, class, then module) asks for."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        pytest.fail(
            f"{FIXTURE} needs a stack to provision: mark the test (or its class/module) with "
            f'@pytest.mark.{MARKER}(project="path/to/project", task="name")',
            pytrace=False,
        )
    if len(marker.args) > 1:
        _usage(f"takes the project as its only positional argument, got {len(marker.args)}")
    kwargs: dict[str, Any] = dict(marker.kwargs)
    if marker.args:
        if "project" in kwargs:
            _usage("project given twice (positionally and as project=)")
        kwargs["project"] = marker.args[0]
    unknown = sorted(set(kwargs) - set(_ARGS))
    if unknown:
        _usage(f"unknown argument(s) {', '.join(unknown)}; known: {', '.join(_ARGS)}")
    project, task, scope = kwargs.get("project"), kwargs.get("task"), kwargs.get("scope", "function")
    if not isinstance(project, str | Path) or not str(project):
        _usage("project= is required: the directory holding project.yaml")
    if task is not None and (not isinstance(task, str) or not task):
        _usage(f"task= must be a task name, got {task!r}")
    if scope not in SCOPES:
        _usage(f"scope={scope!r}: use one of {', '.join(SCOPES)}")
    path = Path(project)
    if not path.is_absolute():
        path = item.config.rootpath / path
    return ForgeMarker(path, task, scope)


# ---------------------------------------------------------------------------------------------- the pool


def _pool(config: pytest.Config) -> StackPool:
    """This process's stacks (each xdist worker has its own; its run id names the worker)."""
    pool = config.stash.get(_POOL, None)
    if pool is None:
        from forgelib.pytest_plugin.stacks import StackPool, run_id_for

        workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
        if workerinput is not None:
            run_id = run_id_for(str(workerinput["testrunuid"]), str(workerinput["workerid"]))
        else:
            run_id = run_id_for(secrets.token_hex(4), None)
        pool = StackPool(
            run_id,
            log_tail_lines=_tail_lines(config),
            notes=_notes(config),
            profiles=tuple(config.getini("forge_profiles")),
        )
        config.stash[_POOL] = pool
        workeroutput: dict[str, Any] | None = getattr(config, "workeroutput", None)
        if workeroutput is not None:  # tells the xdist controller this worker made stacks
            workeroutput[_WORKER_RUN] = run_id
    return pool


def _notes(config: pytest.Config) -> list[str]:
    notes = config.stash.get(_NOTES, None)
    if notes is None:
        notes = config.stash[_NOTES] = []
        workeroutput: dict[str, Any] | None = getattr(config, "workeroutput", None)
        if workeroutput is not None:  # sent to the controller (and printed there) when the worker ends
            workeroutput[_WORKER_NOTES] = notes
    return notes


def _tail_lines(config: pytest.Config) -> int:
    raw = str(config.getini("forge_log_tail_lines"))
    if not raw.strip().isdigit():
        raise pytest.UsageError(f"forge_log_tail_lines = {raw!r}: expected a number of lines")
    return int(raw)


def _get(item: pytest.Item, make: Callable[[], ForgeStack]) -> ForgeStack:
    """``make()``, with forge's failures as the test's error: its reason line, no traceback."""
    from forgelib.errors import ForgeError, Interrupted
    from forgelib.pytest_plugin.stacks import ProvisionFailed

    try:
        stack = make()
    except ProvisionFailed as e:
        item.stash[_LOGS] = e.logs
        reason = str(e.error)
    except Interrupted:
        raise
    except ForgeError as e:  # a spec error, an unknown task, no Docker: the message says what to fix
        reason = str(e)
    else:
        item.stash[_STACK] = stack
        return stack
    pytest.fail(reason, pytrace=False)  # outside the except: no "during handling..." chain in the report


class _Scoped:
    """The stacks one module (or the session) shares: one per environment, reset before each reuse
    (``StackPool.acquire``: forge's warm stacks).

    A failed provision is remembered: every later test asking for that stack errors with the same reason
    at once, as pytest does for a failing fixture of a wider scope."""

    def __init__(self, pool: StackPool) -> None:
        self.pool = pool
        self.warm: dict[Path, Any] = {}  # project root -> its backend with a warm pool (stacks.DockerBackend)
        self.failed: dict[tuple[Path, str | None], Exception] = {}

    def acquire(self, spec: ForgeMarker) -> ForgeStack:
        key = (spec.project, spec.task)
        if key in self.failed:
            raise self.failed[key]
        try:
            return self.pool.acquire(spec.project, spec.task, self.warm)
        except Exception as e:
            self.failed[key] = e
            raise

    def release(self, stack: ForgeStack) -> None:
        self.pool.give_back(stack, self.warm)

    def close(self) -> None:
        self.pool.close_warm(self.warm)


@pytest.fixture(scope="module")
def _forge_module_stacks(request: pytest.FixtureRequest) -> Iterator[_Scoped]:
    scoped = _Scoped(_pool(request.config))
    yield scoped
    scoped.close()


@pytest.fixture(scope="session")
def _forge_session_stacks(request: pytest.FixtureRequest) -> Iterator[_Scoped]:
    scoped = _Scoped(_pool(request.config))
    yield scoped
    scoped.close()


@pytest.fixture
def forge_stack(request: pytest.FixtureRequest) -> Iterator[ForgeStack]:
    """The stack ``@pytest.mark.forge(project=..., task=..., scope=...)`` names, seeds applied.

    ``scope="function"`` (default): provisioned for this test, torn down after it. ``"module"`` /
    ``"session"``: one stack shared by the module's (session's) tests that name the same project and task;
    its reset services are reset in place before every test but the first. Clients the test opened
    (``postgres``, ``redis``) are closed when it ends.
    """
    item = request.node
    spec = stack_spec(item)
    if spec.scope == "function":
        pool = _pool(request.config)
        stack = _get(item, lambda: pool.provision(spec.project, spec.task))
        try:
            yield stack
        finally:
            pool.teardown(stack)
        return
    scoped: _Scoped = request.getfixturevalue(f"_forge_{spec.scope}_stacks")
    stack = _get(item, lambda: scoped.acquire(spec))
    try:
        yield stack
    finally:
        scoped.release(stack)


# ---------------------------------------------------------------------------------------------- reports


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report carries the tail of every service's log of its stack (or, when the stack
    failed to provision, the logs provisioning saved before it tore the stack down)."""
    report = yield
    if report.failed and report.when in ("setup", "call"):
        logs = item.stash.get(_LOGS, None)
        stack = item.stash.get(_STACK, None)
        if logs is None and stack is not None:
            logs = stack.log_tails(_pool(item.config).log_tail_lines)
        for service, text in (logs or {}).items():
            report.sections.append((f"forge log: {service}", text or "(empty)"))
    if report.when == "teardown":
        if _LOGS in item.stash:
            del item.stash[_LOGS]
        if _STACK in item.stash:
            del item.stash[_STACK]
    return report


# ------------------------------------------------------------------------------------ session, signals


def _uses_stacks(session: pytest.Session) -> bool:
    return any(FIXTURE in getattr(item, "fixturenames", ()) for item in session.items)


def _heal(config: pytest.Config) -> None:
    """The reaper, once per session before its first test, as ``forge run`` does at start: leftovers of
    killed sessions (and of their killed workers) go, live owners are kept. What it removed goes into the
    session summary. Under xdist the controller runs it before it hands out the first test, so no worker
    reaps while its siblings provision; a worker killed during the session is reaped by the controller
    (``pytest_testnodedown``), or by the next session's reaper if the controller died too."""
    if config.stash.get(_HEALED, False):
        return
    config.stash[_HEALED] = True
    from forgelib.runner import SubprocessRunner
    from forgelib.stacks.backends import heal_leftovers

    heal_leftovers(SubprocessRunner(), _notes(config).append)


def _controller_heals(config: pytest.Config) -> Path | None:
    """In an xdist worker on the controller's host: the dir that tells the controller this session uses
    stacks. None where this process reaps for itself (no xdist, or a remote worker: its engine's owners
    are on its host, and there the controller can prove nothing)."""
    workerinput: dict[str, Any] = getattr(config, "workerinput", None) or {}
    flag = workerinput.get(_CONTROLLER_HEALS)
    return Path(flag) if flag else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker whose tests use stacks says so before xdist reports its collection to the controller (its
    own hook, which runs after this one): the controller then reaps before it schedules any test."""
    flag = _controller_heals(session.config)
    if flag is not None and _uses_stacks(session):
        flag.mkdir(exist_ok=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[Any]:
    """While tests that use stacks run, Ctrl-C and SIGTERM tear every live stack down before pytest
    reports the interruption (``signals.interruptible``, as in ``forge run``). Before them, the reaper."""
    if not _uses_stacks(session):
        return (yield)
    from forgelib.errors import Interrupted

    config = session.config
    heal = None
    if _controller_heals(config) is None and not config.stash.get(_HEALED, False):
        config.stash[_HEALED] = True
        heal = _notes(config).append
    pool = _pool(config)
    try:
        with pool.opened(heal=heal):  # stacks.open: the reaper first, then signals tear stacks down
            return (yield)
    except Interrupted as e:  # pytest's own way to end on Ctrl-C (exit 2), with forge's summary
        raise KeyboardInterrupt(str(e)) from None


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Iterator[None]:
    """After pytest tore down the fixtures: anything still registered goes, and the temp dir."""
    try:
        return (yield)
    finally:
        _reap_workers(session.config)  # xdist controller only (workers register nothing there)
        flag = session.config.stash.get(_USES_STACKS, None)
        if flag is not None:
            shutil.rmtree(flag, ignore_errors=True)
        pool = session.config.stash.get(_POOL, None)
        if pool is not None:
            for failed in pool.close():
                pool.notes.append(f"could not tear down {failed}; `forge reap` removes it once pytest exited")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    notes = terminalreporter.config.stash.get(_NOTES, None)
    if notes:
        terminalreporter.section("forgelib")
        for note in notes:
            terminalreporter.write_line(f"forge: {note}")


# ----------------------------------------------------------------------------- xdist, in the controller


def _worker_run_id(node: Any) -> str | None:
    workerinput = getattr(node, "workerinput", None) or {}
    if "testrunuid" not in workerinput or "workerid" not in workerinput:
        return None
    from forgelib.pytest_plugin.stacks import run_id_for

    return run_id_for(str(workerinput["testrunuid"]), str(workerinput["workerid"]))


def _reap(run_ids: list[str], notes: list[str]) -> None:
    """The reaper for these runs (it removes only stacks whose owner, a worker, is provably dead), and the
    temp dirs dead workers could not remove (named after their owner: a live one's stays)."""
    from forgelib.errors import ForgeError
    from forgelib.runner import SubprocessRunner
    from forgelib.stacks.reaper import PYTEST_DIR, reap, reap_owned_dirs

    runner = SubprocessRunner()
    try:
        for run_id in run_ids:
            report = reap(runner, run_id=run_id)
            if report.removed:
                notes.append(f"removed the stacks of {run_id}, whose worker died:\n{report.table()}")
    except ForgeError:  # no Docker here, or it does not answer: the next session's reaper tries again
        pass
    reap_owned_dirs(PYTEST_DIR)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object | None) -> None:
    """A worker finished or died. One that died (killed, crashed) never ran its own teardown: its stacks
    carry its run id and its dead pid, so the reaper removes them now rather than at the next session."""
    run_id = _worker_run_id(node)
    if run_id is None:
        return
    workers = node.config.stash.setdefault(_WORKERS, {})
    workeroutput: dict[str, Any] = getattr(node, "workeroutput", None) or {}
    workers[run_id] = error is not None or _WORKER_RUN in workeroutput
    worker = node.workerinput["workerid"]
    _notes(node.config).extend(f"[{worker}] {note}" for note in workeroutput.get(_WORKER_NOTES, ()))
    if error is not None:
        _reap([run_id], _notes(node.config))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Every worker starts as "may leave stacks" until it reports back: one killed during xdist's own
    shutdown (a Ctrl-C) never reports, and the controller's final reap must still cover it."""
    run_id = _worker_run_id(node)
    if run_id is None:
        return
    node.config.stash.setdefault(_WORKERS, {})[run_id] = True
    if node.gateway.spec.popen:  # a local worker: this process's reaper sees what it would see
        from forgelib.docker.labels import current_owner
        from forgelib.stacks.reaper import PYTEST_DIR

        me = current_owner()  # owner-named: if this process is killed, the reaper removes it
        name = f"{PYTEST_DIR}{me.pid}-{me.start_time}-uses-stacks"
        flag = node.config.stash.setdefault(_USES_STACKS, Path(tempfile.gettempdir()) / name)
        node.workerinput[_CONTROLLER_HEALS] = str(flag)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist calls this before it schedules any test: when the worker's tests use stacks, the session's
    reaper runs now, once, while no worker can be provisioning."""
    flag = node.config.stash.get(_USES_STACKS, None)
    if flag is not None and flag.exists():
        _heal(node.config)


def _reap_workers(config: pytest.Config) -> None:
    workers = config.stash.get(_WORKERS, None)
    if workers:
        _reap(sorted(run_id for run_id, maybe in workers.items() if maybe), _notes(config))
