"""Each seed kind applied for real on the engine, observed from inside the container, and each recipe
failure giving the right stage and text while leaving nothing behind (checked by the run's labels)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
import yaml
from support.stacks import IDLE, PG, REDIS, TIMEOUTS, make_project, provision

from forgelib.docker import labels as lab
from forgelib.docker.compose import ComposeProject
from forgelib.errors import ProvisionError
from forgelib.runner import SubprocessRunner
from forgelib.spec.models import SeedKind
from forgelib.stacks.provision import teardown_trial
from forgelib.stacks.stack import Stack

pytestmark = pytest.mark.integration


def sh(trial: Stack, service: str, *argv: str) -> str:
    return trial.compose.exec(service, list(argv), timeout=30).stdout


def assert_gone(runner: SubprocessRunner, run_id: str) -> None:
    left = lab.resources_with_labels(runner, {lab.RUN: run_id})
    assert lab.is_empty(left), f"leaked: {left}"


# --------------------------------------------------------------------------------------------- sql_dump

SQL_SEED = (
    "create table widgets (id int primary key, name text);\ninsert into widgets values (1, 'baseline');\n"
)


def test_sql_dump_is_applied_before_dependents_start_onto_each_trials_fresh_containers(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    seed = tmp_path / "seed.sql"
    seed.write_text(SQL_SEED)  # `create table` without `if not exists`: a second apply would fail
    # `reader` queries the table once, as it starts: it can only see 'baseline' if the seed went in first.
    reader = {
        "image": "forgelib/postgres:15",
        "entrypoint": [],
        "command": [
            "sh",
            "-c",
            "psql -h app-db -U postgres -Atc 'select name from widgets' > /tmp/seen 2>&1;"
            " trap 'exit 0' TERM INT; sleep infinity & wait",
        ],
        "depends_on": {"app-db": {"condition": "service_healthy"}},
    }
    project = make_project(
        tmp_path / "p",
        {"app-db": PG, "reader": reader},
        seeds={"baseline": (seed, SeedKind.SQL_DUMP)},
        reset={"app-db": ("baseline", {})},
    )
    ids = set()
    for k in range(2):  # repeats: each trial's seed goes onto fresh containers (a re-apply would fail)
        trial = provision(project, run_id, tmp_path, runner, idx=k)
        try:
            rows = sh(trial, "app-db", "psql", "-U", "postgres", "-Atc", "select name from widgets")
            assert rows.strip() == "baseline"
            assert sh(trial, "reader", "cat", "/tmp/seen").strip() == "baseline"
            assert set(trial.timings) >= {
                "compose_config",
                "up_seeded",
                "recipe:app-db",
                "up_rest",
                "provision",
            }
            live = lab.resources_with_labels(runner, {lab.RUN: run_id, lab.TRIAL: f"default.{k}"})
            assert len(live["containers"]) == 2 and live["networks"] == [f"{trial.name}_default"]
            ids |= {r["ID"] for r in trial.compose.ps()}
        finally:
            teardown_trial(trial)
    assert len(ids) == 4
    assert_gone(runner, run_id)


def test_sql_syntax_error(docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path) -> None:
    seed = tmp_path / "bad.sql"
    seed.write_text("create table ok (id int);\nselec 1;\n")
    project = make_project(
        tmp_path / "p",
        {"app-db": PG, "idle": IDLE},
        seeds={"postgres_baseline": (seed, SeedKind.SQL_DUMP)},
        reset={"app-db": ("postgres_baseline", {})},
    )
    with pytest.raises(ProvisionError) as err:
        provision(project, run_id, tmp_path, runner)
    assert err.value.stage == "reset_recipe"
    assert err.value.reason.startswith(
        "reset recipe for service 'app-db' (seed 'postgres_baseline', kind 'sql_dump') failed: "
        f"psql step on service 'app-db': seed file {seed.resolve()} (on psql's stdin): "
    )
    # the cause, then the short command; the whole argv and the output tails only in the trial's files
    assert 'ERROR:  syntax error at or near "selec"' in err.value.reason
    assert err.value.reason.endswith("(`psql` in service `app-db`, rc 3)"), err.value.reason
    assert "docker exec" not in err.value.reason
    assert "docker exec -i " in (tmp_path / "trial-0" / "provision-error.txt").read_text()
    logs = tmp_path / "trial-0" / "services"
    assert sorted(p.name for p in logs.iterdir()) == ["app-db.log", "idle.log"]
    assert "database system is ready to accept connections" in (logs / "app-db.log").read_text()
    assert_gone(runner, run_id)


# --------------------------------------------------------------------------------------- filesystem_dir


def _seed_tree(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / ".hidden").write_text("dot\n")
    (root / "sub" / "data.bin").write_bytes(bytes(range(256)) * 40)
    (root / "sub" / "deeper" / "name with spaces.txt").write_text("x y\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "link").symlink_to("run.sh")
    return root


def _tree(root: Path) -> dict[str, bytes | str | None]:
    out: dict[str, bytes | str | None] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = f"-> {p.readlink()}" if p.is_symlink() else (p.read_bytes() if p.is_file() else None)
    return out


def test_filesystem_dir_result_matches_the_seed(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    seed = _seed_tree(tmp_path / "tree")
    box = dict(IDLE)
    box["command"] = [
        "sh",
        "-c",
        "mkdir -p /work/old && echo stale > /work/.stale && echo junk > /work/old/x;"
        " trap 'exit 0' TERM INT; sleep infinity & wait",
    ]
    project = make_project(
        tmp_path / "p",
        {"box": box},
        seeds={"ws": (seed, SeedKind.FILESYSTEM_DIR)},
        reset={"box": ("ws", {"target": "/work"})},
    )
    trial = provision(project, run_id, tmp_path, runner)
    try:
        back = tmp_path / "back"
        back.mkdir()
        trial.compose.cp("box:/work/.", str(back))
        assert _tree(back) == _tree(seed)  # same entries, same bytes; .stale and old/ are gone
    finally:
        teardown_trial(trial)


def test_seed_not_a_directory(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    seed = tmp_path / "tree"
    seed.mkdir()
    project = make_project(
        tmp_path / "p",
        {"box": IDLE},
        seeds={"ws": (seed, SeedKind.FILESYSTEM_DIR)},
        reset={"box": ("ws", {})},
    )
    seed.rmdir()
    seed.write_text("not a directory\n")  # replaced after load
    with pytest.raises(ProvisionError) as err:
        provision(project, run_id, tmp_path, runner)
    assert err.value.stage == "reset_recipe"
    assert err.value.reason == (
        "reset recipe for service 'box' (seed 'ws', kind 'filesystem_dir') failed: "
        f"guard step on service 'box': seed 'ws' is not a directory: {seed.resolve()}"
    )
    assert (tmp_path / "trial-0" / "services" / "box.log").exists()
    assert_gone(runner, run_id)


# ------------------------------------------------------------------------------------------- redis_dump


@pytest.fixture(scope="session")
def rdb_seed(docker_ready: None, runner: SubprocessRunner, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real dump.rdb holding order:4021=processing, written by the stand-in Redis itself."""
    root = tmp_path_factory.mktemp("rdb")
    (root / "compose.yaml").write_text(yaml.safe_dump({"services": {"cache": REDIS}}))
    c = ComposeProject(f"it-rdb-{secrets.token_hex(4)}", (root / "compose.yaml",), runner, TIMEOUTS)
    try:
        c.up(["cache"])
        c.exec("cache", ["redis-cli", "SET", "order:4021", "processing"], timeout=30)
        c.exec("cache", ["redis-cli", "SAVE"], timeout=30)
        c.cp("cache:/data/dump.rdb", str(root / "seed.rdb"))
    finally:
        c.down()
    return root / "seed.rdb"


def test_redis_dump_survives_default_save_points(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path, rdb_seed: Path
) -> None:
    assert rdb_seed.read_bytes().startswith(b"REDIS0010")
    project = make_project(
        tmp_path / "p",
        {"cache": REDIS},
        seeds={"cache_seed": (rdb_seed, SeedKind.REDIS_DUMP)},
        reset={"cache": ("cache_seed", {})},
    )
    trial = provision(project, run_id, tmp_path, runner)
    try:
        # the image runs with Redis's default save points: a `restart` here would have lost the seed
        assert sh(trial, "cache", "redis-cli", "--raw", "CONFIG", "GET", "save").split()[1:] != []
        assert sh(trial, "cache", "redis-cli", "--raw", "GET", "order:4021").strip() == "processing"
    finally:
        teardown_trial(trial)


def test_corrupt_rdb_is_a_ping_stage_error(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.rdb"
    bad.write_bytes(b"REDIS0010" + b"\xfa\x09garbage!" * 64)
    project = make_project(
        tmp_path / "p",
        {"cache": REDIS},
        seeds={"cache_seed": (bad, SeedKind.REDIS_DUMP)},
        reset={"cache": ("cache_seed", {})},
    )
    with pytest.raises(ProvisionError) as err:
        provision(project, run_id, tmp_path, runner)
    assert err.value.stage == "reset_recipe"
    assert err.value.reason.startswith(
        "reset recipe for service 'cache' (seed 'cache_seed', kind 'redis_dump') failed: "
        "ping step on service 'cache': Redis exited after the seed was copied in"
    )
    assert "container log (tail):" in err.value.reason
    assert "Short read or OOM loading DB" in err.value.reason or "Bad file format" in err.value.reason
    assert_gone(runner, run_id)


def test_newer_rdb_version_is_refused_before_the_container_is_touched(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path, rdb_seed: Path
) -> None:
    newer = tmp_path / "newer.rdb"
    newer.write_bytes(b"REDIS0012" + rdb_seed.read_bytes()[9:])
    project = make_project(
        tmp_path / "p",
        {"cache": REDIS},
        seeds={"cache_seed": (newer, SeedKind.REDIS_DUMP)},
        reset={"cache": ("cache_seed", {})},
    )
    with pytest.raises(ProvisionError) as err:
        provision(project, run_id, tmp_path, runner)
    assert err.value.reason == (
        "reset recipe for service 'cache' (seed 'cache_seed', kind 'redis_dump') failed: "
        "preflight step on service 'cache': seed 'cache_seed' is RDB version 12, but the service runs "
        "Redis 7.0.15, which loads RDB versions up to 10: re-save the seed with that Redis version "
        "(or older), or use a newer Redis image"
    )
    # the log shows one clean start: no stop/start happened
    log = (tmp_path / "trial-0" / "services" / "cache.log").read_text()
    assert log.count("Ready to accept connections") == 1
