"""Direct loopback connections (forgelib.stacks.connect) on the real engine: the override publishes each reset
postgres/redis service's port on 127.0.0.1 only, and psycopg / redis reach the seeded state through it
with the credentials the seed used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.stacks import IDLE, PG, REDIS, make_project, provision

from forgelib.errors import ForgeError
from forgelib.runner import SubprocessRunner
from forgelib.spec.models import SeedKind
from forgelib.stacks import connect
from forgelib.stacks.provision import teardown_trial

pytestmark = pytest.mark.integration

RDB = Path(__file__).parents[2] / "examples/multi_service_cache_debug/assets/cache_poisoned.rdb"


def test_postgres_and_redis_reached_directly_on_loopback(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    (tmp_path / "seed.sql").write_text("create table t (v text); insert into t values ('seeded');\n")
    # A password and a non-default user/database: the DSN must carry what the seed connected with.
    creds = {"POSTGRES_USER": "app", "POSTGRES_PASSWORD": "s3 cr:et", "POSTGRES_DB": "shop"}
    pg = {**PG, "environment": creds}
    pg["healthcheck"] = {**PG["healthcheck"], "test": ["CMD", "pg_isready", "-h", "127.0.0.1", "-U", "app"]}
    project = make_project(
        tmp_path / "p",
        {"db": pg, "cache": REDIS, "idle": IDLE},
        seeds={"sql": (tmp_path / "seed.sql", SeedKind.SQL_DUMP), "rdb": (RDB, SeedKind.REDIS_DUMP)},
        reset={"db": "sql", "cache": "rdb"},
    )
    trial = provision(project, run_id, tmp_path, runner)
    try:
        # Published on loopback only, at an engine-chosen port (never 0.0.0.0: nothing leaves this machine).
        inspect = runner.run(["docker", "inspect", f"{trial.name}-db-1", f"{trial.name}-cache-1"]).stdout
        ports = [c["HostConfig"]["PortBindings"] for c in json.loads(inspect)]
        bindings = [b for p in ports for bs in p.values() for b in bs]
        assert bindings and {b["HostIp"] for b in bindings} == {"127.0.0.1"}
        params = connect.postgres(trial, "db")
        assert (params.host, params.user, params.dbname) == ("127.0.0.1", "app", "shop")
        with params.connect() as conn:
            assert conn.execute("select v from t").fetchall() == [("seeded",)]
        import psycopg

        with psycopg.connect(connect.postgres_dsn(trial, "db")) as conn:
            assert conn.execute("select current_user, current_database()").fetchone() == ("app", "shop")
        client = connect.redis_client(trial, "cache")
        assert client.get("order:4021") is not None  # the seed's stale order
        assert connect.redis_url(trial, "cache").startswith("redis://127.0.0.1:")
        # The ephemeral service publishes nothing it did not ask for.
        with pytest.raises(ForgeError, match="5432"):
            trial.compose.port("idle", 5432)
    finally:
        teardown_trial(trial)
