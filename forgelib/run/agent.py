"""Running a command agent: the solver a run config's ``agent:`` (or ``forge run --agent``) names.

For each trial forge writes the task's instruction (``instruction.txt``) and the trial manifest
(``manifest.json``, see ``forgelib.run.manifest``) and runs the agent's argv with both on hand: the
instruction on stdin, the files' paths in ``FORGE_INSTRUCTION`` / ``FORGE_MANIFEST``, the trial's MCP
server in ``FORGE_MCP_URL`` / ``FORGE_MCP_TOKEN``. Its stdout and stderr stream to ``agent.stdout`` /
``agent.stderr`` in the trial directory (the result keeps their last ``runner.FILE_TAIL`` bytes).

On the host it goes through the runner seam tagged ``run`` (a launch verb): in its own process group, which
its timeout and a stop's kill end whole (grandchildren included). In a service it is exec'd in that
service's container (tagged ``exec``), the files copied in first; its timeout ends the ``docker exec``.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from forgelib.errors import CommandTimeout, ForgeError, Interrupted, ProgramNotFound
from forgelib.errors import tail as text_tail
from forgelib.runner import Result, file_tail
from forgelib.spec.models import Agent
from forgelib.stacks.stack import ServiceAccess

INSTRUCTION_FILE = "instruction.txt"
MANIFEST_FILE = "manifest.json"
STDOUT_FILE, STDERR_FILE = "agent.stdout", "agent.stderr"
IN_SERVICE_DIR = "/tmp/forge-agent"


@dataclass(frozen=True)
class AgentResult:
    ok: bool
    timed_out: bool
    rc: int | None
    seconds: float
    stdout: str  # tails
    stderr: str
    error: str | None = None  # the one-line reason when not ok

    def reason(self) -> str:
        return f"Agent failed: {self.error}"


class HostLauncher(Protocol):
    """A command on the host, its output streamed to files (``Backend.launch_host``)."""

    def __call__(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        cwd: Path,
        env: Mapping[str, str],
        stdin: Path,
        stdout_path: Path,
        stderr_path: Path,
        secrets: Sequence[str],
    ) -> Result: ...


def agent_env(
    agent: Agent, files: Mapping[str, str], mcp_url: str | None, token: str | None
) -> dict[str, str]:
    """What forge tells the agent (its own ``env`` wins on a clash, except over the token's name)."""
    env = {"FORGE_INSTRUCTION": files["instruction"], "FORGE_MANIFEST": files["manifest"]}
    if mcp_url is not None and token is not None:
        env |= {"FORGE_MCP_URL": mcp_url, "FORGE_MCP_TOKEN": token}
    return {**env, **agent.env}


def write_inputs(out_dir: Path, instruction: str, manifest: Mapping[str, Any]) -> tuple[Path, Path]:
    """instruction.txt and manifest.json in the trial directory (kept as evidence of what it was told)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ins, man = out_dir / INSTRUCTION_FILE, out_dir / MANIFEST_FILE
    ins.write_text(instruction, encoding="utf-8")
    man.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return ins, man


def in_service_files() -> dict[str, str]:
    return {
        "instruction": f"{IN_SERVICE_DIR}/{INSTRUCTION_FILE}",
        "manifest": f"{IN_SERVICE_DIR}/{MANIFEST_FILE}",
    }


def run_agent(
    agent: Agent,
    *,
    out_dir: Path,
    env: Mapping[str, str],
    secrets: Sequence[str],
    host: HostLauncher,
    stack: ServiceAccess,
    command_timeout: float,
) -> AgentResult:
    """Run ``agent`` once for the trial whose inputs ``write_inputs`` put in ``out_dir``."""
    stdout_path, stderr_path = out_dir / STDOUT_FILE, out_dir / STDERR_FILE
    stdout_path.write_bytes(b"")  # there even when it cannot start at all
    stderr_path.write_bytes(b"")
    shown = " ".join(agent.command)
    instruction = out_dir / INSTRUCTION_FILE
    try:
        if agent.on_host:
            cwd = agent.source.parent if agent.source is not None else out_dir
            r = host(
                agent.command, timeout=agent.timeout, cwd=cwd, env=env, stdin=instruction,
                stdout_path=stdout_path, stderr_path=stderr_path, secrets=secrets,
            )  # fmt: skip
        else:
            _copy_in(stack, agent.where, out_dir, command_timeout, secrets)
            r = stack.exec(
                agent.where, agent.command, stdin=instruction, timeout=agent.timeout, env=dict(env),
                workdir=agent.workdir, check=False, secrets=secrets,
                stdout_path=stdout_path, stderr_path=stderr_path,
            )  # fmt: skip
    except Interrupted:  # the stop killed (or refused) it: the trial is interrupted, not failed
        raise
    except CommandTimeout as e:
        return AgentResult(
            False, True, None, agent.timeout, file_tail(stdout_path), e.stderr_tail,
            f"`{shown}` {_where(agent)} outlived its timeout of {agent.timeout:g}s and was killed"
            + (" (its whole process group)" if agent.on_host else ""),
        )  # fmt: skip
    except ProgramNotFound as e:
        stderr_path.write_text(str(e))
        return AgentResult(
            False, False, None, 0.0, "", str(e), f"agent program {e.program!r} not found {_where(agent)}"
        )
    except ForgeError as e:  # docker could not exec (service gone), or the files could not be copied in
        stderr_path.write_text(str(e))
        return AgentResult(
            False, False, None, 0.0, "", str(e), f"`{shown}` {_where(agent)} could not run: {e}"
        )
    out = file_tail(stdout_path)
    if r.rc == 0:
        return AgentResult(True, False, 0, r.seconds, out, r.stderr)
    return AgentResult(
        False, False, r.rc, r.seconds, out, r.stderr, f"`{shown}` {_where(agent)} {_exit(r, agent)}"
    )


def _where(agent: Agent) -> str:
    return "on the host" if agent.on_host else f"in service {agent.where!r}"


def _exit(r: Result, agent: Agent) -> str:
    last = text_tail(r.stderr or r.stdout, 5) or "(no output)"
    if r.rc < 0:  # a signal, not Ctrl-C (that is an interruption): say which
        try:
            name = signal.Signals(-r.rc).name
        except ValueError:
            name = f"signal {-r.rc}"
        return f"was killed by {name}: {last}"
    if not agent.on_host and r.rc in (126, 127):  # docker exec's own codes: the program is not there
        return f"could not be started (exit {r.rc}): {last}"
    return f"exited {r.rc}: {last}"


def _copy_in(
    stack: ServiceAccess, service: str, out_dir: Path, timeout: float, secrets: Sequence[str]
) -> None:
    """The instruction and the manifest into the service's container, at ``IN_SERVICE_DIR`` (through the
    one exec path; ``sh`` is the one program it needs, as an oracle's default interpreter does)."""
    for name in (INSTRUCTION_FILE, MANIFEST_FILE):
        stack.exec(
            service, ["sh", "-c", 'mkdir -p "$1" && cat > "$1/$2"', "sh", IN_SERVICE_DIR, name],
            stdin=out_dir / name, timeout=timeout, check=True, secrets=secrets,
        )  # fmt: skip
