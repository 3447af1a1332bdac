"""``forge checkpoint`` and ``forge restore`` on a stack ``forge provision --keep`` left up, each in its own
process as a user runs them: the checkpoint's id (and ``--json`` manifest), a restore in place that puts
postgres's rows and redis's keys back as their own clients see them (on the same host ports), an unknown
checkpoint refused with exit 1 naming where the ids are listed, and nothing left once the stack is torn
down and the checkpoint pruned. (The API's proof on the cache pack: test_checkpoints.py.)"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis
import yaml
from support.stacks import PG, REDIS

from forgelib.docker import labels as lab
from forgelib.runner import SubprocessRunner
from forgelib.spec.digest import seed_digest
from forgelib.spec.models import SeedKind
from forgelib.stacks.snapshots import checkpoints as ckstore

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

RDB = Path(__file__).resolve().parents[2] / "examples/multi_service_cache_debug/assets/cache_poisoned.rdb"


def _write_pack(root: Path, name: str) -> Path:
    (root / "assets").mkdir(parents=True)
    sql = root / "assets" / "seed.sql"
    sql.write_text("create table t (v text); insert into t values ('seeded');\n")
    rdb = root / "assets" / "cache.rdb"
    rdb.write_bytes(RDB.read_bytes())
    services = {
        "db": {**PG, "ports": ["5432"]},
        "cache": {
            **REDIS,
            "command": ["redis-server", "--save", "", "--appendonly", "no"],
            "ports": ["6379"],
        },
    }
    (root / "compose.yaml").write_text(yaml.safe_dump({"services": services}))
    seeds = {
        "sql": {"path": "assets/seed.sql", "kind": "sql_dump", "digest": seed_digest(sql, SeedKind.SQL_DUMP)},
        "rdb": {
            "path": "assets/cache.rdb",
            "kind": "redis_dump",
            "digest": seed_digest(rdb, SeedKind.REDIS_DUMP),
        },
    }
    reset = {
        svc: {"isolation": "reset", "reset": {"seed": seed}}
        for svc, seed in (("db", "sql"), ("cache", "rdb"))
    }
    environment = {"compose_file": "compose.yaml", "services": reset}
    project = {"name": name, "assets": {"seeds": seeds}, "default_environment": environment}
    (root / "project.yaml").write_text(yaml.safe_dump(project))
    return root


def _forge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forgelib", *args], capture_output=True, text=True, timeout=300, check=False
    )


def _ok(*args: str) -> str:
    done = _forge(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _port(published: list[str]) -> int:
    """``127.0.0.1:PORT->5432/tcp`` (``forge provision --json``'s services) -> PORT."""
    [address] = published
    assert address.startswith("127.0.0.1:"), address
    return int(address.split("->")[0].rpartition(":")[2])


def _observe(pg: int, rd: int) -> tuple[list[str], dict[str, bytes | None]]:
    """Table t's rows, as psql's client library reads them, and every key's type, as redis's client does."""
    with psycopg.connect(host="127.0.0.1", port=pg, user="postgres", dbname="postgres") as conn:
        rows = [str(r[0]) for r in conn.execute("select v from t order by v").fetchall()]
    client = redis.Redis(host="127.0.0.1", port=rd, socket_timeout=10)
    try:
        keys = {k.decode(): client.type(k) for k in sorted(client.scan_iter())}
    finally:
        client.close()
    return rows, keys


def _write(pg: int, rd: int, tag: str) -> None:
    with psycopg.connect(host="127.0.0.1", port=pg, user="postgres", dbname="postgres", autocommit=True) as c:
        c.execute("insert into t values (%s)", (tag,))
    client = redis.Redis(host="127.0.0.1", port=rd, socket_timeout=10)
    try:
        client.set(f"note:{tag}", tag)
    finally:
        client.close()


def test_forge_restore_puts_a_kept_stack_back_at_its_checkpoint_and_refuses_an_unknown_id(
    tmp_path: Path, runner: SubprocessRunner
) -> None:
    root = str(_write_pack(tmp_path / "pack", f"ckcli{secrets.token_hex(3)}"))
    report = json.loads(_ok("provision", "--project", root, "--keep", "--json"))
    name, run = report["name"], report["run_id"]
    ids: list[str] = []
    try:
        pg, rd = _port(report["services"]["db"]), _port(report["services"]["cache"])
        seeded = _observe(pg, rd)
        _write(pg, rd, "at-capture")
        at_capture = _observe(pg, rd)
        assert at_capture != seeded and "at-capture" in at_capture[0] and "note:at-capture" in at_capture[1]

        cid = _ok("checkpoint", name, "--project", root).strip()
        ids.append(cid)
        assert ckstore.load(runner, cid).manifest["source"] == name
        manifest = json.loads(_ok("checkpoint", name, "--project", root, "--json"))
        ids.append(manifest["id"])
        assert (
            manifest["id"] != cid
            and manifest["source"] == name
            and set(manifest["services"]) == {"db", "cache"}
        )

        _write(pg, rd, "after")
        assert _observe(pg, rd) != at_capture
        assert _ok("restore", name, cid, "--project", root).strip() == f"restored {name} to {cid}"
        assert _observe(pg, rd) == at_capture  # in place: the same host ports answer
        _write(pg, rd, "again")  # a second restore: what changed since the first
        _ok("restore", name, cid, "--project", root)
        assert _observe(pg, rd) == at_capture

        unknown = _forge("restore", name, "ck-000000000000", "--project", root)
        assert unknown.returncode == 1, unknown.stdout + unknown.stderr
        assert "Traceback" not in unknown.stderr
        assert "no checkpoint ck-000000000000" in unknown.stderr and "forge snapshots ls" in unknown.stderr
        assert _observe(pg, rd) == at_capture  # refused before touching the stack
    finally:
        _ok("teardown", "--name", name)
        for i in ids:
            pruned = json.loads(_ok("snapshots", "prune", "--checkpoint", i, "--json"))
            assert [(r["id"], r["action"]) for r in pruned] == [(i, "removed")], pruned
    assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run}))
    for i in ids:
        flt = f"label={ckstore.CHECKPOINT}={i}"
        assert runner.run(["docker", "image", "ls", "-q", "--filter", flt]).stdout.split() == []
