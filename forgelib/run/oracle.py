"""Running a task's oracle (the reference solution standing in for an agent) in its service.

``command`` is exec'd as argv; ``script`` is a host file streamed on stdin to ``interpreter`` (never read
into memory, never quoted into a shell string). The timeout is the task's, capped by the run config's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from forgelib.errors import CommandTimeout, ForgeError, Interrupted
from forgelib.grading.checks import exec_failure
from forgelib.runner import file_tail, secret_values
from forgelib.spec.models import Oracle
from forgelib.stacks.stack import ServiceAccess


@dataclass(frozen=True)
class OracleResult:
    ok: bool
    timed_out: bool
    rc: int | None
    seconds: float
    stdout: str
    stderr: str
    error: str | None = None  # the one-line reason when not ok

    def reason(self) -> str:
        return f"Oracle failed: {self.error}"


def effective_timeout(oracle: Oracle, cap: float) -> float:
    return min(oracle.timeout, cap)


def run_oracle(
    stack: ServiceAccess,
    oracle: Oracle,
    *,
    timeout: float,
    out_dir: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    stem: str = "oracle",
) -> OracleResult:
    """Run ``oracle``; its output goes to ``out_dir/<stem>.{stdout,stderr}`` when given (streamed there,
    never held in memory: the result keeps the last ``runner.FILE_TAIL`` bytes of each). ``extra_env``: what
    forge tells the oracle (a bare seed's path); the task's own ``env`` wins on a clash. A task's ``setup:``
    step runs the same way (``stem="setup"``)."""
    argv = list(oracle.command) if oracle.command is not None else list(oracle.interpreter)
    stdin = oracle.script if oracle.command is None else None
    shown = " ".join(argv) + (f" < {stdin}" if stdin else "")
    stdout_path = stderr_path = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        stdout_path, stderr_path = out_dir / f"{stem}.stdout", out_dir / f"{stem}.stderr"
        stdout_path.write_bytes(b"")  # there even when docker cannot exec at all
        stderr_path.write_bytes(b"")
    try:
        r = stack.exec(
            oracle.service,
            argv,
            stdin=stdin,
            timeout=timeout,
            env={**(extra_env or {}), **oracle.env} or None,
            workdir=oracle.workdir,
            check=False,
            # `--env NAME=value` is in the argv: the task's secrets and forge's own (the MCP token)
            secrets=sorted(secret_values({**(extra_env or {}), **oracle.env})),
            stdout_path=stdout_path,
            stderr_path=stderr_path,
        )
    except Interrupted:  # the stop killed or refused its exec: the trial is interrupted, not failed
        raise
    except CommandTimeout as e:
        out = file_tail(stdout_path) if stdout_path is not None else e.stdout_tail
        res = OracleResult(
            False, True, None, timeout, out, e.stderr_tail, exec_failure(shown, oracle.service, e)
        )
    except ForgeError as e:  # docker could not exec (service gone, program missing)
        res = OracleResult(False, False, None, 0.0, "", str(e), exec_failure(shown, oracle.service, e))
        if stderr_path is not None:
            stderr_path.write_text(res.stderr)
    else:
        if stdout_path is not None:
            r = dataclasses.replace(r, stdout=file_tail(stdout_path))
        err = exec_failure(shown, oracle.service, r) if r.rc != 0 else None
        res = OracleResult(r.rc == 0, False, r.rc, r.seconds, r.stdout, r.stderr, err)
    return res
