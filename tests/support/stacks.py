"""Small stacks on the stand-in images, and a ``Project`` built straight from them.

One definition for the integration modules (``--import-mode=importlib``: test modules cannot import each
other, so these used to be copied into each of them).

The service dicts are shared objects: never mutate one; vary a copy (``{**PG, "ports": [...]}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from forgelib.runner import Runner
from forgelib.spec import models as m
from forgelib.spec.digest import seed_digest
from forgelib.stacks.provision import StackContext, TrialSpec, provision_trial
from forgelib.stacks.stack import Stack

# Bounds for provisioning in these tests: generous for a busy shared engine, short enough that a hang fails
# the test instead of stalling the suite.
TIMEOUTS = m.Timeouts(compose_up=120, recipe=60, teardown=60, command=30)

PG: dict[str, Any] = {
    "image": "forgelib/postgres:15",
    "environment": {"POSTGRES_HOST_AUTH_METHOD": "trust"},
    # SIGINT is postgres's "fast" shutdown (SIGTERM, "smart", waits for clients to disconnect). The stand-in
    # image's STOPSIGNAL says the same; spelled out so the stack does not depend on the image for it.
    "stop_signal": "SIGINT",
    "healthcheck": {
        # -h 127.0.0.1: during first-start initialisation the server listens on its socket only, so a TCP
        # probe passes only once initialisation is over and the server is really up.
        "test": ["CMD", "pg_isready", "-h", "127.0.0.1", "-U", "postgres"],
        "interval": "1s",
        "retries": 60,
    },
}

MARIADB: dict[str, Any] = {
    "image": "forgelib/mariadb:10.11",
    "environment": {"MARIADB_ROOT_PASSWORD": "root", "MARIADB_DATABASE": "app"},
    "healthcheck": {
        # over TCP: during first-start initialisation the server listens on its socket only
        "test": ["CMD", "mariadb-admin", "ping", "-h", "127.0.0.1", "-uroot", "-proot"],
        "interval": "1s",
        "retries": 60,
    },
}

REDIS: dict[str, Any] = {
    "image": "forgelib/redis:7.0",
    # `up --wait` returns only once Redis answers, not merely once the container runs.
    "healthcheck": {"test": ["CMD", "redis-cli", "PING"], "interval": "1s", "retries": 30},
}

# sleep in the background and `wait`: the shell stays free to run the trap, so SIGTERM (and Ctrl-C) end the
# container at once instead of after compose's stop timeout.
_WAIT = "trap 'exit 0' TERM INT; sleep infinity & wait"

IDLE: dict[str, Any] = {  # a container that only waits, ending at once on SIGTERM
    "image": "forgelib/python:3.11",
    "command": ["sh", "-c", _WAIT],
}

# IDLE with /work present: the oracle's workstation in the run packs (the oracle writes /work/out.txt).
RUNNER: dict[str, Any] = {**IDLE, "command": ["sh", "-c", f"mkdir -p /work && {_WAIT}"]}


def make_project(
    root: Path,
    services: Mapping[str, Mapping[str, Any]],
    *,
    seeds: Mapping[str, tuple[Path, m.SeedKind]] | None = None,
    reset: Mapping[str, str | tuple[str, Mapping[str, Any]]] | None = None,
    isolation: Mapping[str, m.Isolation] | None = None,
    name: str = "itest",
    volumes: Mapping[str, Any] | None = None,
) -> m.Project:
    """A project built straight from models (no project.yaml, no loader): writes ``root/compose.yaml``.

    ``seeds``: seed name -> (path, kind), digested here. ``reset``: service -> seed name, or
    (seed name, recipe options). ``isolation``: service -> isolation; a service not named there is RESET
    when it has a ``reset`` binding, else EPHEMERAL. ``name`` goes into the compose project names.
    ``volumes``: the compose file's top-level named volumes.
    """
    seeds = seeds or {}
    reset = reset or {}
    isolation = isolation or {}
    root.mkdir(parents=True, exist_ok=True)
    compose_file = root / "compose.yaml"
    compose: dict[str, Any] = {"services": dict(services)}
    if volumes:
        compose["volumes"] = dict(volumes)
    compose_file.write_text(yaml.safe_dump(compose))
    svc: dict[str, m.Service] = {}
    for n in services:
        binding = reset.get(n)
        default = m.Isolation.RESET if binding is not None else m.Isolation.EPHEMERAL
        svc[n] = m.Service(n, isolation.get(n, default), _binding(binding) if binding is not None else None)
    # resolved, as the loader does: error messages name the resolved path
    seed_models = {n: m.Seed(n, p.resolve(), k, seed_digest(p.resolve(), k)) for n, (p, k) in seeds.items()}
    env = m.EnvironmentManifest((compose_file,), svc, compose)
    return m.Project(name, root, root / "project.yaml", "", seed_models, env, ())


def _binding(spec: str | tuple[str, Mapping[str, Any]]) -> m.ResetBinding:
    # a bare seed name keeps ResetBinding's default (empty) options, as the loader gives an option-less reset
    return m.ResetBinding(spec) if isinstance(spec, str) else m.ResetBinding(*spec)


def provision(
    project: m.Project, run_id: str, tmp_path: Path, runner: Runner, idx: int = 0, *, snapshots: bool = False
) -> Stack:
    """Trial ``idx`` of the project's default environment, with the shared ``TIMEOUTS`` (``snapshots``:
    from goldens)."""
    ctx = StackContext(project, TIMEOUTS, runner, goldens=snapshots)
    return provision_trial(ctx, TrialSpec(None, run_id, idx, tmp_path / f"trial-{idx}"))
