"""Each recipe's exact argv and error texts, on the fake runner."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from forgelib.docker.compose import ComposeProject, ImageProcess
from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import CommandError, RecipeError
from forgelib.kinds.base import ApplyContext, Memo, SeedTarget
from forgelib.kinds.postgres import seed as sql_dump
from forgelib.kinds.redis import seed as redis_dump
from forgelib.kinds.registry import REGISTRY
from forgelib.kinds.tree import seed as filesystem_dir
from forgelib.spec.digest import walk_tree
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
        service_config=ServiceConfig.of({"environment": dict(environment or {})}, service),
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


def test_filesystem_dir_warm_reset_is_apply_from_the_host_seed_and_keeps_nothing_in_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm reset is ``apply`` again, from the seed on the host (the target's mode and owner back
    and wipe, copy, sha256 verify): no pristine copy in the service for a trial to find or change. The
    fingerprint is one ``find -printf`` exec; where the container is not running, compose answers and
    names the service."""
    seed = _tree(tmp_path / "seed")
    monkeypatch.setattr(filesystem_dir, "file_sha256", lambda p: {".env": SHA_ENV, "f.txt": SHA_F}[p.name])
    fake = FakeRunner()
    c = _direct(ctx(fake, seed, SeedKind.FILESYSTEM_DIR, "box", {"target": "/work"}))
    box = ("docker", "exec", "p1-box-1")
    fake.expect(*box, "stat", "-c", "%a %u:%g", "/work", exact=True, times=1, stdout="1777 0:0\n")
    assert filesystem_dir.prepare(c) == ("1777", "0:0")
    # One exec: the wipe, the seed as a tar on stdin, the verifying listing.
    one = ("sh", "-c", filesystem_dir._RESET_TAR_SH, "forge-reset", "/work", "1777", "0:0")
    listing = tuple(filesystem_dir.listing_argv("/work"))
    fed: list[set[str]] = []

    def names(call: Any) -> None:
        with tarfile.open(call.stdin) as tar:  # read while the reset's temp dir exists
            fed.append({m.name for m in tar.getmembers() if m.uid == 0 and m.uname == "root"})

    exec_i = ("docker", "exec", "-i", "p1-box-1")
    fake.expect(*exec_i, *one, *listing, exact=True, times=1, stdout=_listing("/work"), side_effect=names)
    filesystem_dir.reset(c, ("1777", "0:0"))
    assert fed == [{p.relative_to(seed).as_posix() for p in walk_tree(seed)}]
    assert not Path(fake.calls[-1].stdin or "").exists()  # the tar went with its temp dir
    # Without tar in the image (it exits 86 before touching anything): wipe, `compose cp`, listing.
    fake.expect(*exec_i, *one, exact=False, times=1, rc=86)
    reset = ("sh", "-c", filesystem_dir._RESET_SH, "forge-reset", "/work", "1777", "0:0")
    fake.expect(*box, *reset, exact=True, times=1)
    fake.expect(*BASE, "cp", f"{seed}/.", "box:/work", exact=True, times=1)
    fake.expect(*box, "find", "/work", "-mindepth", "1", "(", exact=False, times=1, stdout=_listing("/work"))
    filesystem_dir.reset(c, ("1777", "0:0"))
    fake.expect(*box, "find", "/work", "-printf", filesystem_dir._LISTING_FORMAT, exact=True, stdout="d\t\n")
    assert set(filesystem_dir.fingerprint(c)) == {"tree"}
    assert all(call.timeout == 40 for call in fake.calls) and len(fake.calls) == 7
    fake = FakeRunner()
    c = _direct(ctx(fake, seed, SeedKind.FILESYSTEM_DIR, "box", {"target": "/work"}))
    gone = "Error response from daemon: Container abc is not running"
    fake.expect("docker", "exec", rc=1, stderr=gone)
    fake.expect(*BASE, "exec", "-T", "box", rc=1, stderr='service "box" is not running')
    with pytest.raises(RecipeError, match=r"^wipe step on service 'box': .*service \"box\" is not running"):
        filesystem_dir.reset(c, ("755", "0:0"))
    with pytest.raises(RecipeError, match=r"^fingerprint step on service 'box': could not list /work"):
        filesystem_dir.fingerprint(c)


@pytest.mark.parametrize("step", ["reset", "fingerprint"])
def test_a_stop_during_a_warm_tree_reset_is_an_interruption_not_a_recipe_failure(
    tmp_path: Path, step: str
) -> None:
    """The reset's ``docker exec`` is a launch like any other exec: a stop kills it and it raises
    Interrupted (before, the untagged exec ran on and its death read as "could not restore")."""
    from forgelib.errors import Interrupted
    from forgelib.stacks.live import StopState

    state = StopState()
    fake = FakeRunner()
    fake.expect("docker", "exec", rc=-9, stderr="killed", side_effect=lambda call: state.request("SIGINT"))
    c = _direct(ctx(fake, tmp_path, SeedKind.FILESYSTEM_DIR, "box", {"target": "/work"}))
    c = _with_runner(c, state.guard(fake))
    with pytest.raises(Interrupted):
        if step == "reset":
            filesystem_dir.reset(c, ("755", "0:0"))
        else:
            filesystem_dir.fingerprint(c)
    with pytest.raises(Interrupted):  # and once stopping, none is launched
        filesystem_dir.reset(c, ("755", "0:0"))
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


def _cache_info(status: str, health: str | None = None, service: str = "cache") -> dict[str, Any]:
    from forgelib.docker.labels import COMPOSE_SERVICE

    state: dict[str, Any] = {"Status": status}
    if health is not None:
        state["Health"] = {"Status": health}
    return {"Id": f"id-{service}", "Config": {"Labels": {COMPOSE_SERVICE: service}}, "State": state}


def _script_states(fake: FakeRunner, *infos: dict[str, Any], times: int | None = None) -> None:
    """The state look: ``docker ps`` by the project's labels, then ``docker inspect`` of what it found."""
    ids = [str(i["Id"]) for i in infos]
    more = {} if times is None else {"times": times}
    fake.expect("docker", "ps", "--all", "--quiet", stdout="".join(f"{i}\n" for i in ids), **more)
    fake.expect("docker", "inspect", *ids, exact=True, stdout=json.dumps(list(infos)), **more)


def test_redis_dump_argv_stop_cp_start_ping(tmp_path: Path, no_sleep: list[float]) -> None:
    rdb = _rdb(tmp_path)
    fake = FakeRunner()
    _script_preflight(fake, dir="/var/lib/redis", dbfilename="seed.rdb")
    fake.expect(*BASE, "stop", "cache", exact=True)
    fake.expect(*BASE, "cp", str(rdb), "cache:/var/lib/redis/seed.rdb", exact=True)
    fake.expect(*BASE, "start", "cache", exact=True)
    fake.expect(*BASE, *CLI, "PING", exact=True, times=1, rc=1, stderr="Could not connect to Redis")
    _script_states(fake, _cache_info("running"))
    fake.expect(*BASE, *CLI, "PING", exact=True, stdout="PONG\n")
    redis_dump.check(SeedTarget("cache", Seed("s1", rdb, SeedKind.REDIS_DUMP, "")))
    redis_dump.apply(ctx(fake, rdb, SeedKind.REDIS_DUMP, "cache"))
    verbs = [call.argv[len(BASE)] if call.argv[1] == "compose" else call.argv[1] for call in fake.calls]
    assert verbs == ["exec", "exec", "stop", "cp", "start", "exec", "ps", "inspect", "exec"]
    assert fake.calls[6].argv[:2] == ("docker", "ps")  # docker ps by label, never compose ps
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
    _script_states(fake, _cache_info("exited"))
    fake.expect("docker", "logs", "--tail", "30", "id-cache", exact=True, stdout="# Bad file format reading")
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
    _script_states(fake, _cache_info("running"))
    fake.expect("docker", "logs", stdout="loading...")
    with pytest.raises(RecipeError, match=r"^ping step on service 'cache': no PONG within 40s after start"):
        redis_dump.apply(ctx(fake, _rdb(tmp_path), SeedKind.REDIS_DUMP, "cache"))
    assert 40 <= no_sleep[0] < 41


def _script_restart(fake: FakeRunner) -> None:
    _script_preflight(fake)
    fake.expect(*BASE, "stop")
    fake.expect(*BASE, "cp")
    fake.expect(*BASE, "start")


def _no_compose_ps(fake: FakeRunner) -> None:
    compose = [c.argv[len(BASE)] for c in fake.calls if c.argv[:2] == ("docker", "compose")]
    assert "ps" not in compose


@pytest.mark.parametrize("health", [None, "starting", "healthy"])
def test_redis_dump_polls_the_state_by_label_until_pong(
    tmp_path: Path, no_sleep: list[float], health: str | None
) -> None:
    """While Redis loads the RDB, each poll looks at the container through ``docker ps`` + ``inspect``
    (~0.05 s), never ``compose ps`` (~0.2 s); a running container (healthy or not yet) keeps the poll
    going until PONG."""
    fake = FakeRunner()
    _script_restart(fake)
    fake.expect(*BASE, *CLI, "PING", times=3, stdout="LOADING Redis is loading the dataset in memory")
    fake.expect(*BASE, *CLI, "PING", stdout="PONG\n")
    _script_states(fake, _cache_info("running", health), _cache_info("exited", service="other"))
    redis_dump.apply(ctx(fake, _rdb(tmp_path), SeedKind.REDIS_DUMP, "cache"))
    assert [c.argv[1] for c in fake.calls].count("inspect") == 3
    _no_compose_ps(fake)  # another service's exited container is not the cache's verdict


@pytest.mark.parametrize("status", ["exited", "dead", "restarting", None])
def test_redis_dump_dead_container_fails_the_ping_step_at_once(
    tmp_path: Path, no_sleep: list[float], status: str | None
) -> None:
    """Exited, dead, restarting, or gone (no container of the service): a clear ping step error with the
    log tail, on the first look, not at the deadline."""
    fake = FakeRunner()
    _script_restart(fake)
    fake.expect(*BASE, *CLI, "PING", rc=1, stderr='service "cache" is not running')
    _script_states(fake, *([_cache_info(status)] if status else []))
    fake.expect("docker", "logs", stdout="# Bad file format reading")
    with pytest.raises(RecipeError) as err:
        redis_dump.apply(ctx(fake, _rdb(tmp_path), SeedKind.REDIS_DUMP, "cache"))
    assert str(err.value).startswith(
        f"ping step on service 'cache': Redis {status or 'exited'} after the seed was copied in"
    )
    # the log of the service's container, read with docker logs; gone: nothing to read
    assert ("# Bad file format reading" if status else "container log (tail):\n  (empty)") in str(err.value)
    assert no_sleep[0] == 0
    _no_compose_ps(fake)


@pytest.mark.parametrize("where", ["ps", "inspect"])
def test_redis_dump_a_failed_state_look_is_unknown_and_the_poll_goes_on(
    tmp_path: Path, no_sleep: list[float], where: str
) -> None:
    """The engine not answering the state look is no verdict: the poll goes on (PONG still ends it), and
    an engine that never answers ends at the recipe deadline, not as a dead Redis."""
    daemon = "Cannot connect to the Docker daemon"

    def script_hiccup(fake: FakeRunner, times: int | None) -> None:
        more = {} if times is None else {"times": times}
        if where == "ps":
            fake.expect("docker", "ps", raises=CommandError(("docker", "ps"), 1, "", daemon), **more)
        else:  # docker inspect runs unchecked: no JSON at all is a failed look, not "no containers"
            fake.expect("docker", "ps", "--all", "--quiet", stdout="id-cache\n", **more)
            fake.expect("docker", "inspect", "id-cache", rc=1, stderr=daemon, **more)

    fake = FakeRunner()
    _script_restart(fake)
    fake.expect(*BASE, *CLI, "PING", times=2, rc=1, stderr="Could not connect to Redis")
    fake.expect(*BASE, *CLI, "PING", stdout="PONG\n")
    script_hiccup(fake, times=2)
    redis_dump.apply(ctx(fake, _rdb(tmp_path), SeedKind.REDIS_DUMP, "cache"))
    assert no_sleep[0] > 0

    fake = FakeRunner()
    _script_restart(fake)
    fake.expect(*BASE, *CLI, "PING", rc=1, stderr="Could not connect to Redis")
    script_hiccup(fake, times=None)
    fake.expect("docker", "logs", stdout="")
    with pytest.raises(RecipeError, match=r"^ping step on service 'cache': no PONG within 40s after start"):
        redis_dump.apply(ctx(fake, _rdb(tmp_path), SeedKind.REDIS_DUMP, "cache"))
    assert 40 <= no_sleep[0] < 41
    _no_compose_ps(fake)


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
    of = ServiceConfig.of
    assert sql_dump.direct_port(of({})) == 5432
    assert sql_dump.direct_port(of({"environment": {"PGPORT": "6543"}})) == 6543
    assert redis_dump.direct_port(of({"command": ["redis-server", "--save", ""]})) == 6379
    assert redis_dump.direct_port(of({"command": ["redis-server", "--port", "7000"]})) == 7000
    assert redis_dump.command_option(of({"command": "redis-server --requirepass pw"}), "requirepass") == "pw"
    assert filesystem_dir.direct_port(of({})) is None and REGISTRY[SeedKind.BARE].direct_port(of({})) is None


def test_connection_params_log_in_as_the_seed_did() -> None:
    published = {5432: ("127.0.0.1", 49001), 6543: ("127.0.0.1", 49002), 6379: ("127.0.0.1", 49003)}
    asked: list[int] = []

    def address(port: int) -> tuple[str, int]:
        asked.append(port)
        return published[port]

    env = {"POSTGRES_USER": "app", "POSTGRES_DB": "shop", "POSTGRES_PASSWORD": "s3cret", "PGPORT": "6543"}
    of = ServiceConfig.of
    pg = sql_dump.connection_params(of({"environment": env}), {}, address)
    assert (pg.host, pg.port, pg.user, pg.password, pg.dbname) == (
        "127.0.0.1",
        49002,
        "app",
        "s3cret",
        "shop",
    )
    # The binding's user/database win over the environment, as in the seed's psql; `database=` over both.
    pg = sql_dump.connection_params(
        of({"environment": env}), {"user": "u", "database": "d"}, address, database="x"
    )
    assert (pg.user, pg.password, pg.dbname) == ("u", "s3cret", "x")
    pg = sql_dump.connection_params(of({}), {}, address)  # the official image's defaults
    assert (pg.port, pg.user, pg.password, pg.dbname) == (49001, "postgres", None, "postgres")
    assert pg.url() == "postgresql://postgres@127.0.0.1:49001/postgres"

    rd = redis_dump.connection_params(of({"command": ["redis-server", "--requirepass", "pw"]}), address, 2)
    assert (rd.host, rd.port, rd.password, rd.db) == ("127.0.0.1", 49003, "pw", 2)
    assert rd.url() == "redis://:pw@127.0.0.1:49003/2" and rd.url(db=0).endswith("/0")
    assert asked == [6543, 6543, 5432, 6379]


# ------------------------------------------------------------------------------------------- datadir


def test_pristine_dir_keeps_its_copy_in_a_labelled_helper_outside_the_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exact reset's helper: the service's image and volumes plus its own, no network, the service's
    forge labels and compose's (so ``down --remove-orphans`` removes it), marked a helper (left out of the
    trial's ports and logs); each cycle stops the service, runs the helper attached (its exit status is
    the copy's), starts the service, forgets its cached host ports and waits until it is ready."""
    from forgelib.docker import labels as lab
    from forgelib.kinds import datadir

    fake = FakeRunner()
    c = ctx(fake, tmp_path, SeedKind.SQL_DUMP, "db")
    c.addresses[("db", 5432)] = ("127.0.0.1", 1)
    info = {"Id": "abc", "Image": "sha256:img", "Config": {"Labels": {lab.RUN: "r1", "other": "x"}}}
    fake.expect("docker", "ps", stdout="abc\n")
    fake.expect("docker", "inspect", stdout=json.dumps([info]))
    fake.expect("docker", "create", times=1)
    for verb in ("stop", "start"):
        fake.expect("docker", verb)
    ready: list[list[str]] = []
    monkeypatch.setattr(datadir.readiness, "wait_ready", lambda compose, svcs, **kw: ready.append(kw["refs"]))
    p = datadir.PristineDir.capture(c, "/var/lib/postgresql/data")
    (create,) = [call.argv for call in fake.calls if call.argv[:2] == ("docker", "create")]
    assert create[create.index("--volumes-from") + 1] == "p1-db-1" and "--network" in create
    labels = {
        a.split("=", 1)[0]: a.split("=", 1)[1] for a in create[1:] if "=" in a and "." in a.split("=")[0]
    }
    assert labels[lab.RUN] == "r1" and "other" not in labels and labels[lab.HELPER]
    assert labels[lab.COMPOSE_PROJECT] == "p1" and labels[lab.COMPOSE_CONFIG_HASH]
    assert labels[lab.COMPOSE_SERVICE] != "db"
    assert create[-7:-4] == ("sha256:img", "-c", datadir.RESTORE_SCRIPT)
    assert create[-4:] == ("forge-pristine", "/var/lib/postgresql/data", "PG_VERSION", datadir.SYNC_SCRIPT)
    cycle = [call.argv for call in fake.calls if call.argv[1] in ("stop", "start")]
    assert cycle == [
        ("docker", "stop", "p1-db-1"),
        ("docker", "start", "--attach", "p1-forge-pristine-db"),
        ("docker", "start", "p1-db-1"),
    ]
    assert c.addresses == {} and ready == [["p1-db-1"]]
    fake.expect("docker", "start", "--attach", rc=3, stderr="no PG_VERSION in /var/lib/postgresql/data")
    fake.expectations.insert(0, fake.expectations.pop())  # before the passing one scripted above
    with pytest.raises(RecipeError, match=r"(?s)^reset step on service 'db': copying .* no PG_VERSION"):
        p.restore()


def test_sql_dump_strategy_defaults_to_exact(tmp_path: Path) -> None:
    from forgelib.spec.models import ResetBinding, ResetStrategy

    assert sql_dump.strategy(ctx(FakeRunner(), tmp_path, SeedKind.SQL_DUMP)) is ResetStrategy.EXACT
    c = ctx(FakeRunner(), tmp_path, SeedKind.SQL_DUMP, options={"strategy": "template"})
    assert sql_dump.strategy(c) is ResetStrategy.TEMPLATE
    assert ResetBinding("s").strategy is ResetStrategy.EXACT
    assert ResetBinding("s", {"strategy": "template"}).strategy is ResetStrategy.TEMPLATE


# ---------------------------------------------------------------------------------------------- supervisor


@pytest.mark.parametrize(
    ("raw", "image", "argv"),
    [
        ({}, ImageProcess(("docker-entrypoint.sh",), ("postgres",)), ["docker-entrypoint.sh", "postgres"]),
        ({"command": ["postgres", "-c", "fsync=off"]}, ImageProcess(("ep",), ("postgres",)),
         ["ep", "postgres", "-c", "fsync=off"]),
        # compose's rule: the service's own entrypoint drops the image's CMD
        ({"entrypoint": ["my-ep"]}, ImageProcess(("ep",), ("postgres",)), ["my-ep"]),
        ({"entrypoint": ["my-ep"], "command": ["x"]}, ImageProcess(("ep",), ("postgres",)), ["my-ep", "x"]),
        ({"user": "root"}, ImageProcess(("ep",), ("postgres",), "0"), ["ep", "postgres"]),
    ],
)  # fmt: skip
def test_the_supervisor_runs_what_the_service_would_have_run(
    raw: dict[str, Any], image: ImageProcess, argv: list[str]
) -> None:
    from forgelib.kinds import supervisor

    out = supervisor.wrap(ServiceConfig.of({"image": "pg", **raw}, "db"), image)
    assert out is not None and out["command"] == argv
    entrypoint = ["sh", "-c", out["entrypoint"][2], supervisor.MARKER]
    assert out["entrypoint"] == entrypoint and supervisor.supervised({"Config": {"Entrypoint": entrypoint}})


@pytest.mark.parametrize(
    ("raw", "image"),
    [
        ({"user": "postgres"}, ImageProcess(("ep",), ("postgres",))),  # the loop could not hide its copy
        ({}, ImageProcess(("ep",), ("postgres",), "999:999")),
        ({}, None),  # the image is not present locally: its entrypoint is unknown
        ({"command": ["postgres", "-c", "x=$HOME"]}, ImageProcess(("ep",), ())),  # compose would interpolate
        ({}, ImageProcess((), ())),
    ],
)
def test_the_supervisor_declines_what_it_cannot_run_as_the_service_would(
    raw: dict[str, Any], image: ImageProcess | None
) -> None:
    from forgelib.kinds import supervisor

    assert supervisor.wrap(ServiceConfig.of({"image": "pg", **raw}, "db"), image) is None
    assert not supervisor.supervised({"Config": {"Entrypoint": ["docker-entrypoint.sh"]}})


def test_the_exact_data_directory_resets_ask_for_the_supervisor_and_the_others_do_not(tmp_path: Path) -> None:
    """What a kind asks for is the same in every mode (``FreshSteps.processes``): postgres's exact reset
    (and ``restart``, another name for it) and mysql's ask for the loop; template, redis, a tree and bare
    seeds leave the service's process alone."""
    from forgelib.kinds import registry

    svc, image = ServiceConfig.of({"image": "pg"}, "db"), ImageProcess(("ep",), ("postgres",))
    exact = ctx(FakeRunner(), tmp_path, SeedKind.SQL_DUMP)
    restart = ctx(FakeRunner(), tmp_path, SeedKind.SQL_DUMP, options={"strategy": "restart"})
    template = ctx(FakeRunner(), tmp_path, SeedKind.SQL_DUMP, options={"strategy": "template"})
    wrapped = supervisor_wrap(svc, image)
    assert sql_dump.warm_process(exact, svc, image) == wrapped
    assert sql_dump.warm_process(restart, svc, image) == wrapped
    assert sql_dump.warm_process(template, svc, image) is None
    maria = ServiceConfig.of({"image": "forgelib/mariadb:10.11"}, "my")
    mysql = registry.recipe_for(SeedKind.SQL_DUMP, maria)
    assert mysql is not None and mysql.warm_process(exact, svc, image) == wrapped
    for kind, recipe in REGISTRY.items():
        if kind is not SeedKind.SQL_DUMP:
            assert recipe.warm_process(exact, svc, image) is None


def supervisor_wrap(svc: ServiceConfig, image: ImageProcess) -> dict[str, Any] | None:
    from forgelib.kinds import supervisor

    out = supervisor.wrap(svc, image)
    assert out is not None
    return out


def test_a_supervised_reset_is_one_exec_as_root_and_keeps_the_host_ports(tmp_path: Path) -> None:
    from forgelib.kinds import datadir, supervisor

    fake = FakeRunner()
    c = ctx(fake, tmp_path, SeedKind.SQL_DUMP, "db")
    c.addresses[("db", 5432)] = ("127.0.0.1", 1)
    info = {"Id": "abc", "Config": {"Entrypoint": ["sh", "-c", "loop", supervisor.MARKER]}}
    fake.expect("docker", "ps", stdout="abc\n")
    fake.expect("docker", "inspect", stdout=json.dumps([info]))
    fake.expect("docker", "exec", times=2)
    s = supervisor.Supervised.capture(c, "/var/lib/postgresql/data")
    assert s is not None and not s.restarts_container
    s.restore()
    execs = [call.argv for call in fake.calls if call.argv[:2] == ("docker", "exec")]
    assert [a[:4] for a in execs] == [("docker", "exec", "--user", "0")] * 2
    # the copy taken after a clean stop (SIGINT), every reset after an immediate one (SIGQUIT)
    assert [a[-5:] for a in execs] == [
        (datadir.RESTORE_SCRIPT, "/var/lib/postgresql/data", "PG_VERSION", datadir.SYNC_SCRIPT, sig)
        for sig in ("INT", "QUIT")
    ]
    assert c.addresses == {("db", 5432): ("127.0.0.1", 1)}
    fake.expect("docker", "exec", rc=3, stderr="failed: no PG_VERSION")
    with pytest.raises(RecipeError, match=r"^reset step on service 'db': restoring .* no PG_VERSION"):
        s.restore()


def test_an_unsupervised_container_falls_back_to_the_helper(tmp_path: Path) -> None:
    from forgelib.kinds import supervisor

    fake = FakeRunner()
    c = ctx(fake, tmp_path, SeedKind.SQL_DUMP, "db")
    fake.expect("docker", "ps", stdout="abc\n")
    fake.expect("docker", "inspect", stdout=json.dumps([{"Id": "abc", "Config": {"Entrypoint": ["ep"]}}]))
    assert supervisor.Supervised.capture(c, "/var/lib/postgresql/data") is None
    assert not [call for call in fake.calls if call.argv[:2] == ("docker", "exec")]
