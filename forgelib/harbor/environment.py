"""harbor's ``forge`` environment: a harbor task's compose stack provisioned, seeded, reset and reaped by
forge (``harbor run --env forgelib.harbor:ForgeEnvironment``).

The lifecycle maps onto ``TaskStacks`` (forgelib.harbor.stacks: forge run's own backends); the I/O goes
through forge's one way into a container (``ComposeProject.exec``: ``docker exec`` through the runner
seam) and ``docker cp`` (dockerargv). Every blocking call runs on a daemon thread, so trials run
concurrently and a cancelled trial never holds the process's exit.

How harbor's contract is met:
- ``exec``: ``bash -c`` in ``main`` (harbor's images ship bash; its tasks rely on it), ``sh -c`` in the
  other services (their images are anyone's), with cwd (default: the task's workdir), env (harbor's
  persistent and scoped env merged), user (default: ``default_user``). A ``timeout_sec`` runs the command
  under ``/usr/bin/timeout`` in the container (a host-side kill of ``docker exec`` would leave the command
  running) and raises ``RuntimeError("Command timed out after N seconds")`` as harbor's docker environment
  does.
- files and directories: ``docker cp`` into / out of the service's container, parents made first.
- ``stop(delete)``: a fresh stack is torn down whatever ``delete`` says (forge leaves nothing; there is
  nothing to keep for a later ``harbor`` command); a warm one goes back to its pool, reset before the next
  trial. Before that, the task's forge ``grading.yaml`` (if any) is evaluated on the stack and written to
  ``verifier/forge_grade.json``, and every service's log tail to ``forge/services/``.
- capabilities: ``docker_compose`` only (per-service operations reach every service of the stack). Not
  ``mounted``: a warm stack outlives a trial, so its containers cannot bind one trial's host directories;
  harbor downloads the log directories instead. A reused warm stack's ``main`` comes with them made
  (mode 777, as ``ensure_dirs`` makes them), copied into it before it started, off the trial's path.
  No network policies, GPUs, TPUs, Windows or SSH streams:
  forge does not provide them, so harbor refuses such tasks before start.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.options import EnvironmentOptions
from pydantic import Field

from forgelib.docker import argv as dk
from forgelib.errors import CommandTimeout, ForgeError
from forgelib.harbor import stacks as hs
from forgelib.stacks.provision import capture_logs
from forgelib.stacks.stack import Stack

TIMEOUT_BIN = "/usr/bin/timeout"  # coreutils and busybox both put it here
KILL_GRACE = 5  # seconds a timed-out command gets after SIGTERM before SIGKILL
HOST_GRACE = 15.0  # the host-side limit's margin over the in-container one, which fires first
NO_LIMIT = 7 * 24 * 3600.0  # exec without a timeout: unbounded (the runner wants a number)
COPY_TIMEOUT = 600.0  # one docker cp (harbor's own transfers allow as long)
LOG_TAIL_LINES = 200
GRADE_FILE = "forge_grade.json"
STACK_FILE = "forge_stack.json"

_T = TypeVar("_T")


class ForgeOptions(EnvironmentOptions):  # type: ignore[misc]  # Any where harbor is absent
    """``--ek`` options of the forge environment."""

    stacks: Literal["fresh", "warm"] = Field(
        default="fresh",
        description="fresh: a new stack per trial; warm: stacks reused across the trials of a task "
        "(attempts, agents, retries), reset in place and fingerprint-verified before each (a stack not "
        "proven clean is replaced)",
    )
    goldens: bool = Field(
        default=False,
        description="reset services start from golden snapshots (captured by the first trial needing one): "
        "every fresh stack, and each warm stack's first provisioning",
    )
    workers: int = Field(default=0, ge=0, description="a warm pool's most stacks at once; 0: one per core")


def _in_thread(fn: Callable[[], _T], *, on_abandon: Callable[[_T], None] | None = None) -> asyncio.Future[_T]:
    """``fn()`` on a daemon thread, as a future of the running loop. A caller cancelled meanwhile does not
    wait for it; ``on_abandon(result)`` then runs in the thread once ``fn`` is done (a stack nobody will
    use goes back)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[_T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def work() -> None:
        try:
            value = fn()
        except BaseException as e:  # noqa: BLE001  # handed to the awaiting task, which raises it
            _call_soon(loop, settle, False, e)
            return
        abandoned = fut.cancelled() or not _call_soon(loop, settle, True, value)
        if abandoned and on_abandon is not None:
            on_abandon(value)

    threading.Thread(target=work, name="forge-harbor", daemon=True).start()
    return fut


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> bool:
    try:
        loop.call_soon_threadsafe(fn, *args)
        return True
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        return False


_closers: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}


def _close_with_loop() -> None:
    """Once per event loop: tear every stack down as the loop ends. ``asyncio.run`` (harbor's
    ``run_async``) cancels the tasks left when its coroutine returns or is interrupted (Ctrl-C, SIGTERM),
    while threads can still be started; ``atexit`` comes too late for a warm pool's parallel teardown."""
    loop = asyncio.get_running_loop()
    if loop not in _closers:
        _closers[loop] = loop.create_task(_closer(), name="forge-harbor-closer")


async def _closer() -> None:
    try:
        await asyncio.Event().wait()
    finally:
        await _in_thread(hs.close_all)


class ForgeEnvironment(BaseEnvironment):  # type: ignore[misc]  # Any where harbor is absent
    """A harbor task's stack, provisioned by forge: ``main`` is the agent's container."""

    options_model = ForgeOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._trial: Stack | None = None
        self._stacks: hs.TaskStacks | None = None
        self._record: dict[str, Any] = {}  # forge_stack.json as the start wrote it
        super().__init__(*args, **kwargs)
        opts = self.options
        assert isinstance(opts, ForgeOptions)
        self._mode = hs.Mode(stacks=opts.stacks, goldens=opts.goldens, workers=opts.workers)

    @staticmethod
    def type() -> str:
        return "forge"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(docker_compose=True)

    def _validate_definition(self) -> None:
        """The task's forge spec, loaded and verified now. A bad one (no spec, a spec error with file:line
        and the fix) is raised by ``start``: harbor records it as the trial's exception, without a
        traceback on the console, and the job goes on with its other tasks."""
        self._problem: ForgeError | None = None
        try:
            self._task = hs.load_task(self.environment_dir)
            self._spec = hs.spec_file(self.environment_dir)
        except ForgeError as e:
            self._problem = e

    # ----------------------------------------------------------------------------------- lifecycle

    async def start(self, force_build: bool) -> None:
        if self._problem is not None:
            raise self._problem
        _close_with_loop()
        mode, spec, task = self._mode, self._spec, self._task
        dirs = self._mount_targets(writable_only=True)

        def acquire() -> Stack:
            self._stacks = hs.stacks_for(spec, mode)
            self._stacks.furnish(hs.MAIN, dirs)
            return self._stacks.acquire(task)

        def abandon(trial: Stack) -> None:
            if self._stacks is not None:
                self._stacks.release(trial, graceful=False)

        t0 = time.monotonic()
        self._trial = await _in_thread(acquire, on_abandon=abandon)
        stacks = self._stacks
        assert stacks is not None
        record = hs.describe(self._trial, stacks.run_id)
        self.logger.debug("forge stack %s (%s, reuse %s)", record["stack"], record["mode"], record["reuse"])
        self._write_record(record)
        acquired = time.monotonic()
        # A reused warm stack's main came with harbor's log directories, made while it was not yet
        # started (``TaskStacks.furnish``); any other makes them now, as harbor's environments do.
        furnished = stacks.furnished(self._trial, hs.MAIN, dirs)
        if not furnished:
            await self.ensure_dirs(dirs)
        record["furnished"] = furnished
        self._record = {**record, "start": _seconds(acquire=acquired - t0, dirs=time.monotonic() - acquired)}
        self._write_record(self._record)

    def _write_record(self, record: dict[str, Any]) -> None:
        """The trial's ``forge_stack.json``: its stack, and what its start and stop spent where."""
        where = self.trial_paths.trial_dir / STACK_FILE
        where.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    async def stop(self, delete: bool) -> None:
        trial, stacks = self._trial, self._stacks
        self._trial = None
        if trial is None or stacks is None:
            return

        def finish() -> None:
            t0 = time.monotonic()
            took: dict[str, float] = {}

            def timed(step: str, fn: Callable[[], None]) -> None:
                began = time.monotonic()
                try:
                    fn()
                finally:
                    took[step] = time.monotonic() - began

            try:
                # Both read the stack as the trial left it, neither changes it: side by side, then the
                # release (a warm stack's reset starts there).
                out = self.trial_paths.trial_dir / "forge"
                with ThreadPoolExecutor(max_workers=1, thread_name_prefix="forge-harbor-logs") as ex:
                    logs = ex.submit(timed, "logs", lambda: capture_logs(trial, out, LOG_TAIL_LINES))
                    timed("grade", lambda: self._grade(trial, stacks))
                    logs.result()
            finally:
                graded = time.monotonic()
                stacks.release(trial)
            if self._record:
                # grade_and_logs is the window; grade and logs, inside it side by side, each its own.
                stop = _seconds(grade_and_logs=graded - t0, release=time.monotonic() - graded)
                self._write_record({**self._record, "stop": stop, "stop_parts": _seconds(**took)})

        await _in_thread(finish)

    def _grade(self, trial: Stack, stacks: hs.TaskStacks) -> None:
        """The task's forge grading.yaml on the stack before it is reset, beside harbor's reward."""
        if self._task.grading is None:
            return
        from forgelib.inspect.grade import explain, grade_stack  # forge's grading of one stack (no inspect)

        out = self.trial_paths.verifier_dir
        out.mkdir(parents=True, exist_ok=True)
        try:
            g = grade_stack(trial, self._task, stacks.runner, env={}, timeouts=stacks.timeouts)
            record: dict[str, Any] = {
                "pass": g.binary_pass,
                "score": g.score,
                "threshold": g.threshold,
                "checks": [{"name": o.name, "passed": o.passed, "observed": o.observed} for o in g.checks],
                "explanation": explain(g),
            }
        except ForgeError as e:
            record = {"pass": False, "score": 0.0, "error": str(e)}
        (out / GRADE_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")

    # ------------------------------------------------------------------------------------------- I/O

    def _live(self) -> Stack:
        if self._trial is None:
            raise RuntimeError(f"forge environment {self.session_id}: not started (or already stopped)")
        return self._trial

    def _container(self, service: str | None) -> tuple[Stack, str]:
        trial = self._live()
        name = service or hs.MAIN
        if name not in trial.environment.services:
            raise ValueError(
                f"service {name!r} is not a service of this task's stack ({trial.environment.compose_file}); "
                f"its services: {', '.join(sorted(trial.environment.services))}"
            )
        return trial, name

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        return await self._exec(
            hs.MAIN, command, cwd or self.task_env_config.workdir, self._merge_env(env), timeout_sec,
            self._resolve_user(user),
        )  # fmt: skip

    async def service_exec(
        self,
        command: str,
        *,
        service: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        if self.is_main_service(service):
            return await self.exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        assert service is not None
        # Other services do not inherit main's workdir, default user or persistent env (as harbor's docker).
        return await self._exec(service, command, cwd, env, timeout_sec, user)

    async def _exec(
        self,
        service: str,
        command: str,
        cwd: str | None,
        env: dict[str, str] | None,
        timeout_sec: int | None,
        user: str | int | None,
    ) -> ExecResult:
        trial, name = self._container(service)
        shell = ["bash", "-c", command] if name == hs.MAIN else ["sh", "-c", command]
        argv = shell if not timeout_sec else [TIMEOUT_BIN, "-k", f"{KILL_GRACE}s", f"{timeout_sec}s", *shell]
        limit = NO_LIMIT if not timeout_sec else timeout_sec + KILL_GRACE + HOST_GRACE

        def run() -> ExecResult:
            with tempfile.TemporaryDirectory(dir=trial.trial_dir) as tmp:
                out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
                try:
                    r = trial.compose.exec(
                        name, argv, env=env, workdir=cwd, user=None if user is None else str(user),
                        timeout=limit, check=False, stdout_path=out, stderr_path=err,
                    )  # fmt: skip
                except CommandTimeout:
                    raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
                if timeout_sec and r.rc == 124:
                    raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
                return ExecResult(stdout=_text(out), stderr=_text(err), return_code=r.rc)

        return await _in_thread(run)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._copy_in(hs.MAIN, Path(source_path), target_path, directory=False)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._copy_in(hs.MAIN, Path(source_dir), target_dir, directory=True)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self._copy_out(hs.MAIN, source_path, Path(target_path), directory=False)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self._copy_out(hs.MAIN, source_dir, Path(target_dir), directory=True)

    async def service_download_file(
        self, source_path: str, target_path: Path | str, *, service: str | None = None
    ) -> None:
        await self._copy_out(service or hs.MAIN, source_path, Path(target_path), directory=False)

    async def service_download_dir(
        self, source_dir: str, target_dir: Path | str, *, service: str | None = None
    ) -> None:
        await self._copy_out(service or hs.MAIN, source_dir, Path(target_dir), directory=True)

    async def stop_service(self, service: str) -> None:
        trial, name = self._container(service)
        container = trial.compose.container(name)
        await _in_thread(lambda: self._docker(trial, dk.stop([container])))

    async def _copy_in(self, service: str, source: Path, target: str, *, directory: bool) -> None:
        trial, name = self._container(service)
        container = trial.compose.container(name)
        parent = target if directory else str(Path(target).parent)
        src = f"{source}/." if directory else str(source)

        def run() -> None:
            made = trial.compose.exec(name, ["mkdir", "-p", parent], timeout=COPY_TIMEOUT, check=False)
            if made.rc != 0:
                raise RuntimeError(f"making {parent} in service {name} failed: {made.stderr.strip()}")
            self._docker(trial, dk.cp(src, f"{container}:{target}"))

        await _in_thread(run)

    async def _copy_out(self, service: str, source: str, target: Path, *, directory: bool) -> None:
        trial, name = self._container(service)
        container = trial.compose.container(name)

        def run() -> None:
            (target if directory else target.parent).mkdir(parents=True, exist_ok=True)
            src = f"{container}:{source.rstrip('/')}/." if directory else f"{container}:{source}"
            self._docker(trial, dk.cp(src, str(target)))

        await _in_thread(run)

    def _docker(self, trial: Stack, argv: list[str]) -> None:
        r = trial.compose.runner.run(argv, timeout=COPY_TIMEOUT, check=False)
        if r.rc != 0:
            said = (r.stderr.strip() or r.stdout.strip() or f"exit status {r.rc}").splitlines()[-1]
            raise RuntimeError(f"{shlex.join(argv)} failed: {said}")


def _seconds(**steps: float) -> dict[str, float]:
    return {k: round(v, 3) for k, v in steps.items()}


def _text(path: Path) -> str | None:
    if not path.exists():
        return None
    data = path.read_bytes()
    return data.decode("utf-8", errors="replace") if data else None
