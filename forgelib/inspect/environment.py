"""inspect_ai's ``forge`` sandbox type: a sample's services as ``SandboxEnvironment``s on a forge stack.

The lifecycle maps onto ``TaskStacks`` (forgelib.inspect.stacks: forge run's own backends); the I/O goes
through ``ComposeProject.exec`` (forge's one way into a container: ``docker exec`` through the runner
seam, tagged, secrets redacted). Every blocking call runs on a worker thread, so samples run concurrently.

How inspect's contract is met:
- ``exec``: input is streamed from a file (text or bytes, any size); a ``timeout`` runs the command under
  ``/usr/bin/timeout -k 5s`` in the container (``docker exec`` does not pass a kill on to the process, so a
  host-side kill would leave it running) and is reported as ``TimeoutError``; output over inspect's limit
  (``SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE``) raises ``OutputLimitExceededError``; a command the
  kernel refuses to execute raises ``PermissionError``; a container that is gone raises
  ``SandboxUnavailableError``.
- ``read_file``/``write_file``: a small POSIX sh script run by absolute path decides, in the container,
  what inspect's error types say (missing, a directory, not permitted — by the owner's mode bits too, as
  root ignores them — or over ``MAX_READ_FILE_SIZE``) and streams the bytes; parents are made on write.
"""

from __future__ import annotations

import atexit
import errno
import logging
import re
import shlex
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import anyio
from inspect_ai._util.error import PrerequisiteError
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    sandboxenv,
)
from inspect_ai.util._sandbox.environment import HostMapping, PortMapping, SandboxUnavailableError
from pydantic import BaseModel

from forgelib.docker import argv as dk
from forgelib.errors import CommandTimeout, ForgeError, ProvisionError
from forgelib.inspect import config as cfgs
from forgelib.inspect.stacks import TASK_METADATA, SampleStack, TaskStacks, default_concurrency
from forgelib.runner import SubprocessRunner, file_tail
from forgelib.stacks.reaper import reap

log = logging.getLogger("forgelib.inspect")

TIMEOUT_BIN = "/usr/bin/timeout"  # coreutils and busybox both put it here; by absolute path (inspect asks)
KILL_GRACE = 5  # seconds a timed-out command gets after SIGTERM before SIGKILL
HOST_GRACE = 15.0  # the host-side limit's margin over the in-container one, which fires first
NO_LIMIT = 7 * 24 * 3600.0  # inspect's exec without a timeout: unbounded (the runner wants a number)
FILE_TIMEOUT = 600.0  # read_file / write_file (inspect's docker sandbox allows the same)
# docker's words when the container is not there to exec into (vs. the command's own failure)
_UNAVAILABLE = re.compile(
    r"^(Error response from daemon: (Container \S+ is (not running|paused|restarting)|No such container)"
    r'|service "[^"]+" is not running)',
    re.MULTILINE,
)

# read_file: exit 10 missing, 11 a directory, 12 not readable (root ignores mode bits: the owner's read
# bit decides, as for inspect's docker sandbox), 13 larger than $2 bytes; else the bytes on stdout.
_READ = r"""f=$1
[ -d "$f" ] && exit 11
[ -e "$f" ] || exit 10
[ -r "$f" ] || exit 12
m=$(stat -c %a -- "$f") || exit 12
[ $((0$m & 0400)) -ne 0 ] || exit 12
[ "$(stat -c %s -- "$f")" -le "$2" ] || exit 13
exec cat -- "$f"
"""
# write_file: exit 11 a directory, 12 not writable (the owner's write bit too), 14 parent not made;
# 15 the write failed (stderr says why); stdin is the content.
# Reads exactly the bytes sent ($2), not until EOF: Docker can lose the EOF of a short stdin (see
# Compose.exec), and then a `cat` would wait for the call's whole timeout.
_WRITE = r"""f=$1
[ -d "$f" ] && exit 11
mkdir -p -- "$(dirname -- "$f")" || exit 14
if [ -e "$f" ]; then
  [ -w "$f" ] || exit 12
  m=$(stat -c %a -- "$f") || exit 12
  [ $((0$m & 0200)) -ne 0 ] || exit 12
fi
head -c "$2" > "$f" || exit 15
n=$(wc -c < "$f") && [ "$n" -eq "$2" ] || { echo "wrote $n of $2 bytes" >&2; exit 15; }
"""

_T = TypeVar("_T")

# One TaskStacks per sandbox config of this process (inspect's lifecycle hooks are classmethods; its
# own docker sandbox keeps its projects the same way).
_tasks: dict[str, TaskStacks] = {}
_tasks_lock = threading.Lock()


async def _thread(fn: Callable[..., _T], *args: Any, abandon: bool = False) -> _T:
    """``fn(*args)`` on a worker thread. ``abandon``: a cancelled caller (a sample stopped by Ctrl-C or a
    limit) does not wait for it; the task's cleanup kills what it runs (``TaskStacks.close``)."""
    result: _T = await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=abandon)
    return result


def _shown(e: ForgeError) -> str:
    return f"forge: {e}"


@sandboxenv(name="forge")
class ForgeSandboxEnvironment(SandboxEnvironment):  # type: ignore[misc]  # Any where inspect is absent
    """One service of a sample's forge stack."""

    def __init__(self, stack: SampleStack, service: str) -> None:
        super().__init__()
        self._sample = stack
        self._service = service
        self._working_dir: str | None = None

    # ------------------------------------------------------------------------------------- lifecycle

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return cfgs.deserialize(config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        return default_concurrency()

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        await _thread(_start, config, Path.cwd())

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        stacks = await _thread(_start, config, Path.cwd())
        wanted = metadata.get(TASK_METADATA)
        try:
            stack = await _thread(stacks.acquire, str(wanted) if wanted else None, abandon=True)
        except ProvisionError as e:  # forge's PROVISION_ERROR: the sample's error, the eval goes on
            raise RuntimeError(f"PROVISION_ERROR: {e}") from None
        except ForgeError as e:
            raise RuntimeError(_shown(e)) from None
        _record(stack, stacks.run_id)
        return {svc: cls(stack, svc) for svc in stack.services}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        if not environments:
            return
        env = next(iter(environments.values())).as_type(ForgeSandboxEnvironment)
        stacks = _tasks.get(cfgs.key(config))
        if stacks is None:  # task_cleanup came first: the stack is gone with its task
            return
        with anyio.CancelScope(shield=True):  # a stack is handed back or torn down, whatever else happens
            await _thread(lambda: stacks.release(env._sample, interrupted=interrupted))

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        with _tasks_lock:
            stacks = _tasks.pop(cfgs.key(config), None)
        if stacks is not None and cleanup:
            with anyio.CancelScope(shield=True):
                await _thread(stacks.close)

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup forge [RUN_ID]``: forge's reaper — only stacks whose owner process is
        provably gone; a live eval's stacks are kept (with the reason)."""
        report = await _thread(lambda: reap(SubprocessRunner(), run_id=id))
        print(report.table())

    # ------------------------------------------------------------------------------------------- I/O

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        return await _thread(self._exec, list(cmd), input, cwd, env or {}, user, timeout, abandon=True)

    def _exec(
        self,
        cmd: list[str],
        input: str | bytes | None,
        cwd: str | None,
        env: dict[str, str],
        user: str | None,
        timeout: int | None,
    ) -> ExecResult[str]:
        argv = cmd if timeout is None else [TIMEOUT_BIN, "-k", f"{KILL_GRACE}s", f"{timeout}s", *cmd]
        with self._scratch() as tmp:
            stdin = None
            if input is not None:
                stdin = tmp / "stdin"
                stdin.write_bytes(input.encode("utf-8") if isinstance(input, str) else input)
            out, err = tmp / "stdout", tmp / "stderr"
            t0 = time.monotonic()
            try:
                r = self._sample.stack.compose.exec(
                    self._service, argv, stdin=stdin, env=env, workdir=self._cwd(cwd), user=user,
                    timeout=NO_LIMIT if timeout is None else timeout + KILL_GRACE + HOST_GRACE,
                    check=False, stdout_path=out, stderr_path=err,
                )  # fmt: skip
            except CommandTimeout:
                raise TimeoutError(f"Command timed out after {timeout} seconds") from None
            elapsed = time.monotonic() - t0
            if timeout is not None and (r.rc == 124 or (r.rc in (137, 143) and elapsed >= timeout)):
                raise TimeoutError(f"Command timed out after {timeout} seconds")
            stdout, stderr = _output(out), _output(err)
        said = f"{stderr}\n{stdout}" if r.rc != 0 else ""  # docker's own errors go to either stream
        self._unavailable(said)
        if r.rc == 126 and "permission denied" in said.casefold():  # the runtime's, before the command ran
            raise PermissionError(errno.EACCES, said.strip(), cmd[0] if cmd else "")
        return ExecResult(success=r.rc == 0, returncode=r.rc, stdout=stdout, stderr=stderr)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        await _thread(self._write, file, contents, abandon=True)

    def _write(self, file: str, contents: str | bytes) -> None:
        with self._scratch() as tmp:
            src = tmp / "content"
            src.write_bytes(contents.encode("utf-8") if isinstance(contents, str) else contents)
            r = self._sample.stack.compose.exec(
                self._service, ["/bin/sh", "-c", _WRITE, "forge-write", file, str(src.stat().st_size)],
                stdin=src,
                timeout=FILE_TIMEOUT, check=False,
            )  # fmt: skip
        if r.rc == 0:
            return
        if r.rc == 11:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
        if r.rc == 12 or (r.rc in (14, 15) and "permission denied" in r.stderr.casefold()):
            raise PermissionError(errno.EACCES, "Permission denied", file)
        self._unavailable(r.stderr)
        raise RuntimeError(
            f"writing {file} in service {self._service} failed (exit {r.rc}): {r.stderr.strip()}"
        )

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE  # a context variable of the caller's
        data = await _thread(self._read, file, limit, abandon=True)
        return data.decode("utf-8") if text else data

    def _read(self, file: str, limit: int) -> bytes:
        with self._scratch() as tmp:
            out = tmp / "content"
            r = self._sample.stack.compose.exec(
                self._service, ["/bin/sh", "-c", _READ, "forge-read", file, str(limit)],
                timeout=FILE_TIMEOUT, check=False, stdout_path=out,
            )  # fmt: skip
            if r.rc == 0:
                data: bytes = out.read_bytes()
                return data
        if r.rc == 10:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", file)
        if r.rc == 11:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
        if r.rc == 12:
            raise PermissionError(errno.EACCES, "Permission denied", file)
        if r.rc == 13:
            raise OutputLimitExceededError(limit_str=_size(limit), truncated_output=None)
        self._unavailable(r.stderr)
        raise RuntimeError(
            f"reading {file} in service {self._service} failed (exit {r.rc}): {r.stderr.strip()}"
        )

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """``docker exec -it`` into the service's container (a login shell: bash where there is one)."""
        container = self._sample.stack.compose.container(self._service)
        shell = "command -v bash >/dev/null && exec bash -l || exec sh -l"
        argv = dk.exec(container, ["sh", "-c", shell], interactive=True, tty=True, user=user)
        return SandboxConnection(
            type="forge",
            command=shlex.join(argv),
            vscode_command=None if user else ["remote-containers.attachToRunningContainer", container],
            ports=_ports(self._sample.stack.ports.get(self._service, [])),
            container=container,
        )

    def default_polling_interval(self) -> float:
        return 0.2

    # --------------------------------------------------------------------------------------- helpers

    @property
    def stack(self) -> SampleStack:
        """The sample's view of its forge stack (``.stack``: the ``Stack``; ``forge_scorer`` grades it)."""
        return self._sample

    def _scratch(self) -> _TempDir:
        base = self._sample.stack.trial_dir
        base.mkdir(parents=True, exist_ok=True)
        return _TempDir(dir=base)

    def _cwd(self, cwd: str | None) -> str | None:
        """A relative ``cwd`` is relative to the container's working directory (asked once)."""
        if cwd is None or cwd.startswith("/"):
            return cwd
        if self._working_dir is None:
            r = self._sample.stack.compose.exec(self._service, ["/bin/sh", "-c", "pwd"], check=False)
            self._working_dir = r.stdout.strip() if r.rc == 0 and r.stdout.strip() else "/"
        return f"{self._working_dir.rstrip('/')}/{cwd}"

    def _unavailable(self, said: str) -> None:
        if _UNAVAILABLE.search(said):
            raise SandboxUnavailableError(
                f"service {self._service} of stack {self._sample.name} is not running: {said.strip()}"
            )


class _TempDir(tempfile.TemporaryDirectory[str]):
    """A scratch directory as a ``Path`` (the input, output and content files of one call)."""

    def __enter__(self) -> Path:  # type: ignore[override]
        return Path(self.name)


def _record(stack: SampleStack, run_id: str) -> None:
    """The sample's transcript says which stack it got and how (fresh, or warm: reused, reset, replaced)."""
    from inspect_ai.log import transcript

    trial = stack.stack
    how = dict(trial.source) or {"mode": "fresh"}
    transcript().info(
        {
            "stack": trial.name,
            "run_id": run_id,
            "task": stack.task.name,
            "services": list(stack.services),
            "mode": how.get("mode", "fresh"),
            "reuse": how.get("reuse", 0),
            "replaced": how.get("replaced"),
            "timings": {k: round(v, 3) for k, v in trial.timings.items()},
            "goldens": {svc: dict(g) for svc, g in trial.snapshots.items()},
        },
        source="forge",
    )


def _output(path: Path) -> str:
    """A command's stdout/stderr file as text; over inspect's limit: ``OutputLimitExceededError``."""
    if not path.exists():
        return ""
    limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
    if path.stat().st_size > limit:
        raise OutputLimitExceededError(
            limit_str=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, truncated_output=file_tail(path)
        )
    return path.read_bytes().decode("utf-8", errors="replace")


def _size(n: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} bytes"


def _ports(published: list[str]) -> list[PortMapping] | None:
    """forge's ``127.0.0.1:49153->5432/tcp`` strings as inspect's port mappings."""
    out: dict[tuple[int, str], list[HostMapping]] = {}
    for p in published:
        m = re.match(r"^(.*):(\d+)->(\d+)/(tcp|udp)$", p)
        if m:
            out.setdefault((int(m[3]), m[4]), []).append(HostMapping(host_ip=m[1], host_port=int(m[2])))
    return [
        PortMapping(container_port=c, protocol=proto, mappings=h) for (c, proto), h in out.items()
    ] or None


def _start(config: SandboxEnvironmentConfigType | None, base: Path) -> TaskStacks:
    """The config's ``TaskStacks``, started once (``task_init``; or the first ``sample_init`` when inspect's
    caller skipped ``task_init``, as a test harness may). Config and spec errors read as forge shows them
    (file:line, the fix), raised as inspect's ``PrerequisiteError``, which it prints without a traceback."""
    k = cfgs.key(config)
    with _tasks_lock:
        found = _tasks.get(k)
        if found is not None:
            return found
        try:
            stacks = TaskStacks(cfgs.settings(cfgs.parse(config), base))
            stacks.start()
        except ForgeError as e:
            raise PrerequisiteError(_shown(e)) from None
        _tasks[k] = stacks
        return stacks


@atexit.register
def _close_all() -> None:
    """Last resort: an eval that ended without ``task_cleanup`` (an error before it) leaves nothing."""
    with _tasks_lock:
        left = list(_tasks.values())
        _tasks.clear()
    for stacks in left:
        try:
            stacks.close()
        except ForgeError as e:
            log.warning("%s", e)
