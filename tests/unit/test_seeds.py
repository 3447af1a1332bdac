"""Each recipe's exact argv and error texts, on the fake runner."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from forgelib.compose import ComposeProject
from forgelib.errors import CommandError, RecipeError
from forgelib.seeds import REGISTRY, ApplyContext, Memo, SeedTarget, filesystem_dir, redis_dump, sql_dump
from forgelib.spec.models import Seed, SeedKind, Timeouts
from forgelib.testing import FakeRunner

BASE = ("docker", "compose", "--ansi", "never", "--project-name", "p1", "--file", "/x/c.yaml")
T = Timeouts(recipe=40, command=9)


def ctx(
    fake: FakeRunner,
    seed_path: Path,
    kind: SeedKind,
    service: str = "svc",
    options: Mapping[str, Any] | None = None,
    environment: Mapping[str, str] | None = None,
) -> ApplyContext:
    compose = ComposeProject("p1", (Path("/x/c.yaml"),), fake, T)
    seed = Seed("s1", seed_path, kind, "sha256:unused")
    return ApplyContext(
        service,
        seed,
        dict(options or {}),
        compose=compose,
        service_config={"environment": dict(environment or {})},
        timeouts=T,
    )


# ------------------------------------------------------------------------------------------- sql_dump


@pytest.mark.parametrize(
    ("options", "environment", "user", "db"),
    [
        ({}, {}, "postgres", "postgres"),
        ({}, {"POSTGRES_USER": "app"}, "app", "app"),  # the official image: the database defaults to the user
        ({}, {"POSTGRES_USER": "app", "POSTGRES_DB": "shop"}, "app", "shop"),
        ({"user": "u", "database": "d"}, {"POSTGRES_USER": "app", "POSTGRES_DB": "shop"}, "u", "d"),
    ],
)
def test_sql_dump_argv(
    tmp_path: Path, options: dict[str, str], environment: dict[str, str], user: str, db: str
) -> None:
    dump = tmp_path / "d.sql"
    dump.write_text("select 1;")
    fake = FakeRunner()
    psql = ("psql", "-q", "-v", "ON_ERROR_STOP=1", "-U", user, "-d", db)
    fake.expect(*BASE, "exec", "-T", "app-db", *psql, exact=True)
    sql_dump.apply(ctx(fake, dump, SeedKind.SQL_DUMP, "app-db", options, environment))
    (call,) = fake.calls
    assert call.stdin == dump and call.timeout == 40  # streamed from the file, bounded by the recipe timeout


def test_sql_dump_error_carries_psql_stderr(tmp_path: Path) -> None:
    dump = tmp_path / "d.sql"
    dump.write_text("selec 1;")
    fake = FakeRunner()
    fake.expect(*BASE, "exec", rc=3, stderr='psql:<stdin>:1: ERROR:  syntax error at or near "selec"')
    with pytest.raises(RecipeError) as err:
        sql_dump.apply(ctx(fake, dump, SeedKind.SQL_DUMP, "app-db"))
    text = str(err.value)
    assert text == (
        f"psql step on service 'app-db': seed file {dump} (on psql's stdin): "
        'psql:<stdin>:1: ERROR:  syntax error at or near "selec" (`psql` in service `app-db`, rc 3)'
    )


def test_sql_dump_guard(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"^guard step on service 'db': seed 's1' is not a file: "):
        sql_dump.check(SeedTarget("db", Seed("s1", tmp_path, SeedKind.SQL_DUMP, "")))


# ------------------------------------------------------------------------------------- filesystem_dir


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / ".env").write_text("A=1\n")
    (root / "sub" / "f.txt").write_text("hello\n")
    return root


SHA_ENV, SHA_F = "0b" * 32, "58" * 32


def _listing(target: str) -> str:
    return "\n".join([f"{target}/sub", f"{SHA_ENV}  {target}/.env", f"{SHA_F}  {target}/sub/f.txt"])


def test_filesystem_dir_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = _tree(tmp_path / "seed")
    hashes = {".env": SHA_ENV, "f.txt": SHA_F}
    monkeypatch.setattr(filesystem_dir, "file_sha256", lambda p: hashes[p.name])
    fake = FakeRunner()
    fake.expect(*BASE, "exec", "-T", "box", "mkdir", "-p", "/work", exact=True)
    fake.expect(*BASE, "exec", "-T", "box", "find", "/work", "-mindepth", "1", "-delete", exact=True)
    fake.expect(*BASE, "cp", f"{seed}/.", "box:/work", exact=True)
    listing = ("find", "/work", "-mindepth", "1", "(", "-type", "f", "-exec", "sha256sum", "{}", "+", ")")
    fake.expect(*BASE, "exec", "-T", "box", *listing, "-o", "-print", exact=True, stdout=_listing("/work"))
    c = ctx(fake, seed, SeedKind.FILESYSTEM_DIR, "box", {"target": "/work/"})
    filesystem_dir.check(c)
    filesystem_dir.apply(c)
    assert len(fake.calls) == 4
    assert all(call.timeout == 40 for call in fake.calls)


def _direct(c: ApplyContext) -> ApplyContext:
    import dataclasses

    return dataclasses.replace(c, compose=dataclasses.replace(c.compose, direct=True))


def test_filesystem_dir_warm_reset_and_fingerprint_exec_through_the_one_direct_path(tmp_path: Path) -> None:
    """The warm hot path (reset, fingerprint) goes through ``ComposeProject.exec`` like every other exec:
    ``docker exec -i`` into the container; where it is not running, compose answers and names the service."""
    fake = FakeRunner()
    c = _direct(ctx(fake, tmp_path, SeedKind.FILESYSTEM_DIR, "box", {"target": "/work"}))
    box = ("docker", "exec", "-i", "p1-box-1", "sh", "-c")
    fake.expect(*box, filesystem_dir._RESET_SH, "forge-reset", "/work", "/pristine", exact=True, times=1)
    listing = f"d\t\n{filesystem_dir._SEPARATOR}d\t\n"
    fake.expect(*box, filesystem_dir._FINGERPRINT_SH, exact=False, times=1, stdout=listing)
    filesystem_dir.reset(c, "/pristine")
    assert set(filesystem_dir.fingerprint(c)) == {"tree", "pristine"}
    assert all(call.timeout == 40 for call in fake.calls) and len(fake.calls) == 2
    gone = "Error response from daemon: Container abc is not running"
    fake.expect("docker", "exec", rc=1, stderr=gone)
    fake.expect(*BASE, "exec", "-T", "box", rc=1, stderr='service "box" is not running')
    with pytest.raises(RecipeError, match=r"^reset step on service 'box': .*service \"box\" is not running"):
        filesystem_dir.reset(c, "/pristine")
    with pytest.raises(RecipeError, match=r"^fingerprint step on service 'box': could not list /work"):
        filesystem_dir.fingerprint(c)


@pytest.mark.parametrize("step", ["reset", "fingerprint"])
def test_a_stop_during_a_warm_tree_reset_is_an_interruption_not_a_recipe_failure(
    tmp_path: Path, step: str
) -> None:
    """The reset's ``docker exec`` is a launch like any other exec: a stop kills it and it raises
    Interrupted (before, the untagged exec ran on and its death read as "could not restore")."""
    from forgelib.errors import Interrupted
    from forgelib.signals import StopState

    state = StopState()
    fake = FakeRunner()
    fake.expect("docker", "exec", rc=-9, stderr="killed", side_effect=lambda call: state.request("SIGINT"))
    c = _direct(ctx(fake, tmp_path, SeedKind.FILESYSTEM_DIR, "box", {"target": "/work"}))
    c = _with_runner(c, state.guard(fake))
    with pytest.raises(Interrupted):
        if step == "reset":
            filesystem_dir.reset(c, "/pristine")
        else:
            filesystem_dir.fingerprint(c)
    with pytest.raises(Interrupted):  # and once stopping, none is launched
        filesystem_dir.reset(c, "/pristine")
    assert len(fake.calls) == 1


def _with_runner(c: ApplyContext, runner: Any) -> ApplyContext:
    import dataclasses

    return dataclasses.replace(c, compose=dataclasses.replace(c.compose, runner=runner))


def test_filesystem_dir_default_target_is_workspace(tmp_path: Path) -> None:
    c = ctx(FakeRunner(), tmp_path, SeedKind.FILESYSTEM_DIR)
    assert filesystem_dir.target_dir(c) == "/workspace"


def test_filesystem_dir_failed_wipe_is_loud(tmp_path: Path) -> None:
    fake = FakeRunner()
    fake.expect(*BASE, "exec", "-T", "box", "mkdir")
    fake.expect(
        *BASE, "exec", "-T", "box", "find", rc=1, stderr="find: cannot delete '/workspace/m': Device busy"
    )
    with pytest.raises(
        RecipeError, match=r"(?s)^wipe step on service 'box': could not empty /workspace: .*Device busy"
    ):
        filesystem_dir.apply(ctx(fake, _tree(tmp_path / "s"), SeedKind.FILESYSTEM_DIR, "box"))
    assert not any("cp" in call.argv for call in fake.calls)


def test_filesystem_dir_verify_reports_differences(tmp_path: Path) -> None:
    seed = _tree(tmp_path / "seed")
    fake = FakeRunner()
    fake.expect(*BASE, "exec", "-T", "box", "mkdir")
    fake.expect(*BASE, "exec", "-T", "box", "find", "/workspace", "-mindepth", "1", "-delete")
    fake.expect(*BASE, "cp")
    fake.expect(
        *BASE, "exec", "-T", "box", "find", stdout="/workspace/sub\n" + "ab" * 32 + "  /workspace/sub/f.txt\n"
    )
    with pytest.raises(RecipeError) as err:
        filesystem_dir.apply(ctx(fake, seed, SeedKind.FILESYSTEM_DIR, "box"))
    assert str(err.value) == (
        "verify step on service 'box': /workspace does not match seed 's1': "
        "missing: .env; content differs: sub/f.txt"
    )


@pytest.mark.parametrize("target", ["/", "relative", "/a/../..", "//"])
def test_filesystem_dir_refuses_dangerous_targets(tmp_path: Path, target: str) -> None:
    with pytest.raises(RecipeError, match="must be an absolute, normalised path other than '/'"):
        filesystem_dir.check(ctx(FakeRunner(), tmp_path, SeedKind.FILESYSTEM_DIR, options={"target": target}))


def test_filesystem_dir_guard_runs_before_any_container_call(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(
        RecipeError, match=rf"^guard step on service 'svc': seed 's1' is not a directory: {f}$"
    ):
        filesystem_dir.check(ctx(FakeRunner(), f, SeedKind.FILESYSTEM_DIR))


def test_parse_listing_and_host_listing_agree(tmp_path: Path) -> None:
    seed = _tree(tmp_path / "seed")
    (seed / "link").symlink_to("sub")
    from forgelib.spec.digest import file_sha256

    out = "\n".join(
        [
            "/w/sub",
            "/w/link",
            f"{file_sha256(seed / '.env')}  /w/.env",
            f"{file_sha256(seed / 'sub' / 'f.txt')} */w/sub/f.txt",
            "\\" + "cd" * 32 + "  /w/odd\\nname",
        ]
    )
    parsed = filesystem_dir.parse_listing(out, "/w")
    assert parsed.pop("odd\nname") == "cd" * 32
    assert parsed == filesystem_dir.host_listing(seed)


# ----------------------------------------------------------------------------------------- redis_dump

RDB10 = b"REDIS0010\xfa\x09redis-ver\x067.0.15\xff" + b"\0" * 8


def _rdb(tmp_path: Path, data: bytes = RDB10) -> Path:
    p = tmp_path / "dump.rdb"
    p.write_bytes(data)
    return p


def _config(**values: str) -> str:
    merged = {"dir": "/data", "dbfilename": "dump.rdb", "appendonly": "no", "requirepass": "", **values}
    return "\n".join(f"{k}\n{v}" for k, v in merged.items()) + "\n"


CLI = ("exec", "-T", "cache", "redis-cli")


def _script_preflight(fake: FakeRunner, server: str = "7.0.15", **config: str) -> None:
    fake.expect(
        *BASE, *CLI, "--raw", "INFO", "server", exact=True, stdout=f"# Server\r\nredis_version:{server}\r\n"
    )
    fake.expect(*BASE, *CLI, "--raw", "CONFIG", "GET", "*", exact=True, stdout=_config(**config))


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    monkeypatch.setattr(redis_dump, "sleep", sleep)
    monkeypatch.setattr(redis_dump, "clock", lambda: now[0])
    return now


def test_redis_dump_argv_stop_cp_start_ping(tmp_path: Path, no_sleep: list[float]) -> None:
    rdb = _rdb(tmp_path)
    fake = FakeRunner()
    _script_preflight(fake, dir="/var/lib/redis", dbfilename="seed.rdb")
    fake.expect(*BASE, "stop", "cache", exact=True)
    fake.expect(*BASE, "cp", str(rdb), "cache:/var/lib/redis/seed.rdb", exact=True)
    fake.expect(*BASE, "start", "cache", exact=True)
    fake.expect(*BASE, *CLI, "PING", exact=True, times=1, rc=1, stderr="Could not connect to Redis")
    fake.expect(*BASE, "ps", "--all", "--format", "json", "cache", exact=True, stdout='{"State": "running"}')
    fake.expect(*BASE, *CLI, "PING", exact=True, stdout="PONG\n")
    redis_dump.check(SeedTarget("cache", Seed("s1", rdb, SeedKind.REDIS_DUMP, "")))
    redis_dump.apply(ctx(fake, rdb, SeedKind.REDIS_DUMP, "cache"))
    verbs = [call.argv[len(BASE)] for call in fake.calls]
    assert verbs == ["exec", "exec", "stop", "cp", "start", "exec", "ps", "exec"]
    assert "restart" not in verbs


def test_redis_dump_refuses_a_newer_rdb_before_touching_the_container(tmp_path: Path) -> None:
    rdb = _rdb(tmp_path, b"REDIS0011" + RDB10[9:])
    fake = FakeRunner()
    _script_preflight(fake)
    with pytest.raises(RecipeError) as err:
        redis_dump.apply(ctx(fake, rdb, SeedKind.REDIS_DUMP, "cache"))
    assert str(err.value) == (
        "preflight step on service 'cache': seed 's1' is RDB version 11, but the service runs Redis 7.0.15, "
        "which loads RDB versions up to 10: re-save the seed with that Redis version (or older), "
        "or use a newer Redis image"
    )
    assert len(fake.calls) == 1  # INFO only: no CONFIG, no stop


def test_redis_dump_refuses_appendonly(tmp_path: Path) -> None:
    fake = FakeRunner()
    _script_preflight(fake, appendonly="yes")
    with pytest.raises(RecipeError, match="appendonly yes"):
        redis_dump.apply(ctx(fake, _rdb(tmp_path), SeedKind.REDIS_DUMP, "cache"))
    assert not any("stop" in call.argv for call in fake.calls)


def test_redis_dump_crash_is_a_ping_step_error_with_the_log_tail(
    tmp_path: Path, no_sleep: list[float]
) -> None:
    fake = FakeRunner()
    _script_preflight(fake)
    fake.expect(*BASE, "stop")
    fake.expect(*BASE, "cp")
    fake.expect(*BASE, "start")
    fake.expect(*BASE, *CLI, "PING", rc=1, stderr='service "cache" is not running')
    fake.expect(*BASE, "ps", stdout=json.dumps({"State": "exited", "ExitCode": 1}))
    fake.expect(
        *BASE, "logs", "--no-color", "--tail", "30", "cache", exact=True, stdout="# Bad file format reading"
    )
    with pytest.raises(RecipeError) as err:
        redis_dump.apply(ctx(fake, _rdb(tmp_path), SeedKind.REDIS_DUMP, "cache"))
    assert str(err.value) == (
        "ping step on service 'cache': "
        "Redis exited after the seed was copied in (is 's1' a valid RDB file?)\n"
        "container log (tail):\n  # Bad file format reading"
    )


def test_redis_dump_ping_is_bounded(tmp_path: Path, no_sleep: list[float]) -> None:
    fake = FakeRunner()
    _script_preflight(fake)
    fake.expect(*BASE, "stop")
    fake.expect(*BASE, "cp")
    fake.expect(*BASE, "start")
    fake.expect(*BASE, *CLI, "PING", stdout="LOADING Redis is loading the dataset in memory")
    fake.expect(*BASE, "ps", stdout=json.dumps({"State": "running"}))
    fake.expect(*BASE, "logs", stdout="loading...")
    with pytest.raises(RecipeError, match=r"^ping step on service 'cache': no PONG within 40s after start"):
        redis_dump.apply(ctx(fake, _rdb(tmp_path), SeedKind.REDIS_DUMP, "cache"))
    assert 40 <= no_sleep[0] < 41


def test_redis_dump_stop_failure_names_the_step(tmp_path: Path) -> None:
    fake = FakeRunner()
    _script_preflight(fake)
    fake.expect(*BASE, "stop", raises=CommandError(["docker", "compose", "stop"], 1, "", "boom"))
    with pytest.raises(RecipeError, match=r"^stop step on service 'cache': command docker compose stop"):
        redis_dump.apply(ctx(fake, _rdb(tmp_path), SeedKind.REDIS_DUMP, "cache"))


@pytest.mark.parametrize(("data", "ok"), [(RDB10, True), (b"REDIS", False), (b"PK\x03\x04zipfile", False)])
def test_redis_dump_header_check(tmp_path: Path, data: bytes, ok: bool) -> None:
    target = SeedTarget("cache", Seed("s1", _rdb(tmp_path, data), SeedKind.REDIS_DUMP, ""))
    if ok:
        redis_dump.check(target)
    else:
        with pytest.raises(
            RecipeError, match=r"^preflight step on service 'cache': seed 's1' is not an RDB file"
        ):
            redis_dump.check(target)


@pytest.mark.parametrize(
    ("server", "limit"),
    [
        ("7.0.15", 10),
        ("7.2.4", 11),
        ("7.4.0", 12),
        ("8.0.2", 12),
        ("6.2.14", 9),
        ("3.2.0", 7),
        ("99.0", None),
    ],
)
def test_max_rdb_for(server: str, limit: int | None) -> None:
    assert redis_dump.max_rdb_for(server) == limit


def test_a_seed_tree_is_listed_once_per_verified_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Provisioning re-verifies the digest before every apply; hashing every file again per trial is waste.
    seed = _tree(tmp_path / "seed")
    calls: list[Path] = []
    real = filesystem_dir.host_listing
    monkeypatch.setattr(filesystem_dir, "host_listing", lambda root: calls.append(root) or real(root))
    memo = Memo()
    first = filesystem_dir.seed_listing(seed, "sha256:aa", memo)
    assert filesystem_dir.seed_listing(seed, "sha256:aa", memo) == first and calls == [seed]
    filesystem_dir.seed_listing(seed, "sha256:bb", memo)  # the seed changed (re-stamped): listed again
    assert calls == [seed, seed]
    filesystem_dir.seed_listing(seed, "sha256:aa", Memo())  # another run's backend lists for itself
    assert calls == [seed, seed, seed]


def test_direct_ports_follow_the_service_config() -> None:
    assert sql_dump.direct_port({}) == 5432
    assert sql_dump.direct_port({"environment": {"PGPORT": "6543"}}) == 6543
    assert redis_dump.direct_port({"command": ["redis-server", "--save", ""]}) == 6379
    assert redis_dump.direct_port({"command": ["redis-server", "--port", "7000"]}) == 7000
    assert redis_dump.command_option({"command": "redis-server --requirepass pw"}, "requirepass") == "pw"
    assert filesystem_dir.direct_port({}) is None and REGISTRY[SeedKind.BARE].direct_port({}) is None
