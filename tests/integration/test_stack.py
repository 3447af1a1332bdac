"""A postgres + redis stack from the stand-in images, through real `docker compose`: healthchecks,
`up --wait`, a query through psql, a PING through redis-cli, `down --volumes`, and nothing left behind."""

from __future__ import annotations

import secrets
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from forgelib.docker.images import STAND_INS
from forgelib.docker.labels import COMPOSE_PROJECT, resources_with_labels
from forgelib.runner import Result, SubprocessRunner

pytestmark = pytest.mark.integration

COMPOSE = textwrap.dedent(
    """\
    services:
      db:
        image: ${FORGE_IMAGE_POSTGRES:-postgres:16}
        environment:
          POSTGRES_USER: forge
          POSTGRES_PASSWORD: forge-secret
          POSTGRES_DB: app
        volumes:
          - ./initdb:/docker-entrypoint-initdb.d:ro
        healthcheck:
          # -h 127.0.0.1: during first-start initialisation the server listens on its socket only, so a TCP
          # probe passes only once the init scripts have run
          test: ["CMD", "pg_isready", "-h", "127.0.0.1", "-U", "forge", "-d", "app"]
          interval: 1s
          timeout: 3s
          retries: 60
      cache:
        image: ${FORGE_IMAGE_REDIS:-redis:7-alpine}
        healthcheck:
          test: ["CMD", "redis-cli", "ping"]
          interval: 1s
          timeout: 3s
          retries: 60
    """
)
INIT_SQL = """\
CREATE TABLE widgets (id int PRIMARY KEY, name text NOT NULL);
INSERT INTO widgets VALUES (1, 'baseline');
"""
PROJECT_LABEL = COMPOSE_PROJECT


@dataclass
class Stack:
    runner: SubprocessRunner
    project: str
    compose_file: Path
    env: dict[str, str | None]

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> Result:
        argv = ["docker", "compose", "--project-name", self.project, "--file", str(self.compose_file), *args]
        return self.runner.run(argv, timeout=timeout, env=self.env, check=check)

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes Docker still holds for this project (kinds with none omitted)."""
        found = resources_with_labels(self.runner, {PROJECT_LABEL: self.project}, timeout=30)
        return {kind: names for kind, names in found.items() if names}


@pytest.fixture
def stack(docker_ready: None, runner: SubprocessRunner, tmp_path: Path) -> Iterator[Stack]:
    (tmp_path / "initdb").mkdir()
    (tmp_path / "initdb" / "01-widgets.sql").write_text(INIT_SQL)
    compose_file = tmp_path / "compose.yaml"
    compose_file.write_text(COMPOSE)
    # The stand-ins, explicitly: this test is about them, whatever the caller's environment selects.
    env: dict[str, str | None] = {s.var: s.tag for s in STAND_INS.values()}
    s = Stack(runner, f"forgetest-stack-{secrets.token_hex(4)}", compose_file, env)
    try:
        yield s
    finally:
        # Idempotent: after the test's own `down` this removes nothing; after a failure it removes everything.
        s.compose("down", "--volumes", "--remove-orphans", "--timeout", "5", check=False)


def test_postgres_and_redis_stack_up_query_down_leaves_nothing(stack: Stack) -> None:
    stack.compose("up", "--detach", "--wait", "--wait-timeout", "120", timeout=180)

    rows = stack.compose(
        "exec", "-T", "db", "psql", "-v", "ON_ERROR_STOP=1", "-At", "-U", "forge", "-d", "app",
        "-c", "SELECT name FROM widgets WHERE id = 1",
    )  # fmt: skip
    assert rows.stdout.strip() == "baseline"  # the init script ran, in the database POSTGRES_DB named

    # TCP with the password, as another service in the stack would connect
    tcp = stack.compose(
        "exec", "-T", "-e", "PGPASSWORD=forge-secret", "db",
        "psql", "-h", "127.0.0.1", "-At", "-U", "forge", "-d", "app", "-c", "SELECT current_user",
    )  # fmt: skip
    assert tcp.stdout.strip() == "forge"

    assert stack.compose("exec", "-T", "cache", "redis-cli", "PING").stdout.strip() == "PONG"
    assert stack.compose("exec", "-T", "cache", "redis-cli", "SET", "k", "v").stdout.strip() == "OK"
    assert stack.compose("exec", "-T", "cache", "redis-cli", "GET", "k").stdout.strip() == "v"

    assert stack.leftovers(), "the stack should be visible by its project label while it is up"
    stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "10")

    assert stack.leftovers() == {}
