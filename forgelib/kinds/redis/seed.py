"""``redis_dump``: replace the service's RDB file with the seed while Redis is stopped, then start it.

Order matters. The RDB header is checked against the running server's version first (an older server
refuses newer RDB versions: better a clear message than a crash loop). Then **stop → cp → start**, never
``restart``: with the default save points Redis saves its memory on SIGTERM, over a dump copied in while
it ran, and the seed is silently lost. A server with ``appendonly yes`` loads the AOF and ignores the RDB,
so that is refused too. Finally PING is polled (bounded); a server that dies on the seed (a corrupt RDB)
is reported with its log tail.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forgelib.clients import deferred
from forgelib.docker import argv as dk
from forgelib.docker.compose import published_address
from forgelib.errors import CommandError, ForgeError, Interrupted
from forgelib.kinds import checkpointcopy
from forgelib.kinds.base import (
    ApplyContext,
    CheckpointCopy,
    Fingerprint,
    SeedTarget,
    fingerprint_part,
    no_mount,
    no_settle,
    no_warm_process,
    reset_after,
)
from forgelib.kinds.redis.client import COMMAND_TIMEOUT, RedisParams, connection_params
from forgelib.kinds.redis.client import command_option as command_option
from forgelib.kinds.redis.client import direct_port as direct_port  # the Recipe's

if TYPE_CHECKING:
    import redis as redis_lib
else:  # loaded at first use (forgelib.clients says why)
    redis_lib = deferred("redis")

OPTIONS: frozenset[str] = frozenset()
MAGIC = b"REDIS"
POLL_INTERVAL = 0.2
LOG_TAIL = 30

# The newest RDB version each Redis release line can load (from librdb's redis-to-RDB table).
# Every server loads all older versions ("RDB is forward compatible").
RDB_BY_SERVER: tuple[tuple[tuple[int, int], int], ...] = (
    ((8, 6), 13),
    ((7, 4), 12),  # also 8.0, 8.2, 8.4
    ((7, 2), 11),
    ((7, 0), 10),
    ((5, 0), 9),  # also 6.0, 6.2
    ((4, 0), 8),
    ((3, 2), 7),
    ((2, 6), 6),  # also 2.8
    ((2, 4), 5),
)
_DEAD_STATES = frozenset({"exited", "dead", "restarting"})

# Injectable for unit tests (no real sleeping there).
sleep: Callable[[float], None] = time.sleep
clock: Callable[[], float] = time.monotonic


def rdb_version(path: Path) -> int | None:
    """The RDB version in the file header (``REDIS0010`` -> 10), or None when it is not an RDB file."""
    with path.open("rb") as f:
        head = f.read(9)
    if len(head) < 9 or not head.startswith(MAGIC) or not head[5:].isdigit():
        return None
    return int(head[5:])


def max_rdb_for(server: str) -> int | None:
    """The newest RDB version a server of this version loads; None when the server is newer than we know."""
    m = re.match(r"(\d+)\.(\d+)", server)
    if not m:
        return None
    v = (int(m[1]), int(m[2]))
    if v[0] > RDB_BY_SERVER[0][0][0]:
        return None  # a major release we do not know: it can load everything we know of
    for since, rdb in RDB_BY_SERVER:
        if v >= since:
            return rdb
    return 0


def check(target: SeedTarget) -> None:
    seed = target.seed
    if not seed.path.is_file():
        raise target.fail("preflight", f"seed {seed.name!r} is not a file: {seed.path}")
    if rdb_version(seed.path) is None:
        raise target.fail(
            "preflight", f"seed {seed.name!r} is not an RDB file (no REDIS<4 digits> header): {seed.path}"
        )


def apply(ctx: ApplyContext) -> None:
    svc, t = ctx.service, ctx.timeouts.recipe
    _preflight_server(ctx)
    config = _config(ctx)
    if config.get("appendonly") == "yes":
        raise ctx.fail(
            "preflight",
            "the server runs with appendonly yes, so it loads its AOF and ignores dump.rdb; "
            "start this service with --appendonly no to seed it from an RDB",
        )
    directory, filename = config.get("dir"), config.get("dbfilename")
    if not directory or not filename:
        raise ctx.fail("preflight", "CONFIG GET did not report both dir and dbfilename")
    dest = f"{directory.rstrip('/')}/{filename}"
    # compose cp works on a stopped container; the copy lands after Redis's shutdown save.
    step = "stop"
    try:
        ctx.compose.stop([svc], timeout=t)
        step = "copy"
        ctx.compose.cp(ctx.seed.path, f"{svc}:{dest}", timeout=t)
        step = "start"
        ctx.compose.start([svc], timeout=t)
    except CommandError as e:
        raise ctx.fail(step, str(e)) from e
    _wait_for_ping(ctx)


def _redis_cli(ctx: ApplyContext, *args: str) -> str:
    return ctx.compose.exec(ctx.service, ["redis-cli", "--raw", *args], timeout=ctx.timeouts.command).stdout


def _preflight_server(ctx: ApplyContext) -> None:
    version = rdb_version(ctx.seed.path)
    try:
        info = _redis_cli(ctx, "INFO", "server")
    except CommandError as e:
        raise ctx.fail("preflight", f"could not ask the server its version: {e}") from e
    m = re.search(r"^redis_version:(\S+)", info, re.MULTILINE)
    server = m[1] if m else ""
    limit = max_rdb_for(server)
    if version is not None and limit is not None and version > limit:
        raise ctx.fail(
            "preflight",
            f"seed {ctx.seed.name!r} is RDB version {version}, but the service runs Redis {server}, "
            f"which loads RDB versions up to {limit}: re-save the seed with that Redis version "
            "(or older), or use a newer Redis image",
        )


def _config(ctx: ApplyContext) -> dict[str, str]:
    """The server's whole configuration in one call (``CONFIG GET`` takes a single pattern before
    Redis 7; ``--raw`` prints name and value on alternate lines, an empty value as an empty line)."""
    try:
        lines = _redis_cli(ctx, "CONFIG", "GET", "*").split("\n")
    except CommandError as e:
        raise ctx.fail("preflight", f"could not read the server's configuration: {e}") from e
    return dict(zip(lines[0::2], lines[1::2], strict=False))


def _wait_for_ping(ctx: ApplyContext) -> None:
    """Poll PING until PONG; stop early when the container has died (corrupt RDB), else give up at the
    recipe timeout."""
    svc = ctx.service
    deadline = clock() + ctx.timeouts.recipe
    last = ""
    while True:
        r = ctx.compose.exec(svc, ["redis-cli", "PING"], timeout=ctx.timeouts.command, check=False)
        if r.rc == 0 and r.stdout.strip() == "PONG":
            return
        answer = (r.stdout.strip() or r.stderr.strip()).splitlines()
        last = answer[-1] if answer else last
        state = _state(ctx)
        if state in _DEAD_STATES:
            raise ctx.fail(
                "ping",
                f"Redis {state} after the seed was copied in (is {ctx.seed.name!r} a valid RDB file?)"
                f"\ncontainer log (tail):\n{_log_tail(ctx)}",
            )
        if clock() >= deadline:
            raise ctx.fail(
                "ping",
                f"no PONG within {ctx.timeouts.recipe:g}s after start (last answer: {last or 'none'})"
                f"\ncontainer log (tail):\n{_log_tail(ctx)}",
            )
        sleep(POLL_INTERVAL)


def _state(ctx: ApplyContext) -> str:
    """The service's container state (``running``, ``exited``, ...) through ``docker ps`` + ``inspect`` by
    label (cheaper per poll than ``compose ps``); ``exited`` when it has no container, ``""``
    when the engine did not answer (unknown: the caller keeps polling until its deadline). Of several
    containers, a running one wins: dead only when none runs."""
    try:
        found = ctx.compose.service_states([ctx.service]).get(ctx.service) or []
    except Interrupted:
        raise
    except ForgeError:
        return ""
    statuses = [status for status, _health in found]
    if not statuses:
        return "exited"
    return "running" if "running" in statuses else statuses[0]


def _log_tail(ctx: ApplyContext) -> str:
    text = ctx.compose.log_tail(ctx.service, LOG_TAIL)
    return "\n".join(f"  {ln}" for ln in text.splitlines()) or "  (empty)"


# ---------------------------------------------------------------------------------------------- warm
#
# prepare: right after the seeded server started, read the whole keyspace once on a direct connection —
# ``DUMP`` and absolute expiry of every key of every database index — plus ``CONFIG GET *``, the ACL users
# (``ACL LIST``) and the function libraries. reset: put back the ACL users and their rules, lift a write
# pause (``CLIENT UNPAUSE``), make the server a primary again (``REPLICAOF NO ONE``), restore any
# configuration a trial changed, ``FLUSHALL``, ``SCRIPT FLUSH``, restore the functions, then pipelined
# ``RESTORE … ABSTTL`` per database; and empty the logs and counters a fresh server starts without (slow
# log, ACL log, latency, INFO stats), which would show the next trial what this one ran. The server is never
# restarted. Connection-bound state (client names, subscriptions, MONITOR) goes with the trial's connections
# and is not touched.
# Chosen over SWAPDB with a pre-filled spare index, which holds a second copy in memory and cannot cover a
# seed that uses several indexes; RESTORE of a pack-sized seed is quick. A keyspace over MAX_DUMP_BYTES is
# not held on the host: its reset falls back to the fresh stop → copy → start path.

MAX_DUMP_BYTES = 256 * 1024 * 1024
_SCAN_COUNT = 1000


Keyspace = dict[int, list[tuple[bytes, bytes, int]]]  # db -> (key, DUMP payload, abs expiry ms or 0)


@dataclass(frozen=True)
class Prepared:
    params: RedisParams
    config: dict[str, str]
    keyspace: Keyspace | None  # None: larger than MAX_DUMP_BYTES
    functions: bytes | None  # FUNCTION DUMP (None: a server without functions)
    acl: tuple[str, ...] | None = None  # ACL LIST (None: a server without ACLs)
    primary: bool = True  # ROLE said master


def _cmd(client: Any, *args: Any) -> Any:
    """One command (redis-py's ``execute_command`` is untyped)."""
    return client.execute_command(*args)


def _params(ctx: ApplyContext) -> RedisParams:
    return connection_params(ctx.service_config, ctx.address)


def _config_of(client: redis_lib.Redis) -> dict[str, str]:
    raw = _cmd(client, "CONFIG", "GET", "*")
    pairs = raw.items() if isinstance(raw, dict) else zip(raw[0::2], raw[1::2], strict=False)
    return {_text(k): _text(v) for k, v in pairs}


def _text(v: object) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _databases(client: redis_lib.Redis) -> list[int]:
    """The database indexes holding keys (``INFO keyspace``)."""
    info = client.info("keyspace")
    return sorted(int(name[2:]) for name in info if str(name).startswith("db"))


def _functions(client: redis_lib.Redis) -> bytes | None:
    try:
        out = _cmd(client, "FUNCTION", "DUMP")
    except redis_lib.ResponseError:  # before Redis 7: no functions
        return None
    return bytes(out) if out is not None else b""


def _each_key(
    params: RedisParams, db: int, ask: Callable[[Any, bytes], object]
) -> tuple[list[bytes], list[Any]]:
    """Every key of database ``db`` (sorted) and, pipelined, the answers to what ``ask`` queues per key."""
    c = params.client(db=db)
    try:
        keys = sorted(c.scan_iter(count=_SCAN_COUNT))
        pipe = c.pipeline(transaction=False)
        for k in keys:
            ask(pipe, k)
        return keys, pipe.execute()
    finally:
        c.close()


def _dump(client: redis_lib.Redis, params: RedisParams) -> dict[int, list[tuple[bytes, bytes, int]]] | None:
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    out: Keyspace = {}
    size = 0
    for db in _databases(client):
        keys, answers = _each_key(params, db, lambda pipe, k: (pipe.dump(k), pipe.pttl(k)))
        records = []
        for k, payload, ttl in zip(keys, answers[0::2], answers[1::2], strict=True):
            if payload is None:  # expired between SCAN and DUMP: a fresh load would not have it either
                continue
            size += len(k) + len(payload)
            if size > MAX_DUMP_BYTES:
                return None
            records.append((k, payload, now_ms + ttl if ttl > 0 else 0))
        out[db] = records
    return out


def prepare(ctx: ApplyContext) -> Prepared:
    params = _params(ctx)
    try:
        client = params.client()
        try:
            return Prepared(
                params,
                _config_of(client),
                _dump(client, params),
                _functions(client),
                _acl(client),
                _is_primary(client),
            )
        finally:
            client.close()
    except redis_lib.RedisError as e:
        raise ctx.fail("prepare", f"{type(e).__name__}: {e}") from e


def checkpoint_prepare(ctx: ApplyContext) -> Prepared:
    """``prepare``: it holds the live keyspace already. One too large to hold would be reset from the seed,
    not the checkpoint: refused, so the stack is never handed out at the wrong state."""
    p = prepare(ctx)
    if p.keyspace is None:
        raise ctx.fail(
            "prepare",
            f"its keyspace is larger than {MAX_DUMP_BYTES} bytes, too large to hold for an in-place reset "
            "to the checkpoint; run this task with `stacks: fresh`",
        )
    return p


def reset(ctx: ApplyContext, prepared: object) -> None:
    assert isinstance(prepared, Prepared)
    p = prepared
    try:
        client = p.params.client()
        try:
            if p.acl is not None:  # first: a trial may have taken a permission the steps below need
                _restore_acl(client, p.acl)
            _lift_pause(client)
            if p.primary and not _is_primary(client):
                _cmd(client, "REPLICAOF", "NO", "ONE")
            _restore_config(ctx, client, p.config)
            _forget_history(client)
            if p.keyspace is None:  # too large to hold: the fresh path (the server restarts on the seed)
                client.close()
                apply(ctx)
                return
            _cmd(client, "FLUSHALL")
            _cmd(client, "SCRIPT", "FLUSH")
            if p.functions is not None:
                _cmd(client, "FUNCTION", "FLUSH")
                _cmd(client, "FUNCTION", "RESTORE", p.functions)
        finally:
            client.close()
        _restore_keyspace(p.params, p.keyspace)
    except (redis_lib.AuthenticationError, redis_lib.exceptions.NoPermissionError) as e:
        raise ctx.fail(
            "reset",
            "the seeded credentials no longer open the server, or no longer allow the reset (a trial "
            f"changed the default user's password or rules, or requirepass): {type(e).__name__}: {e}",
        ) from e
    except redis_lib.TimeoutError as e:
        raise ctx.fail(
            "reset",
            f"the server did not answer within {COMMAND_TIMEOUT:g}s: a trial's CLIENT PAUSE … ALL holds "
            f"every client's commands (CLIENT UNPAUSE too) until it ends, or the server is overloaded: {e}",
        ) from e
    except redis_lib.RedisError as e:
        raise ctx.fail("reset", f"{type(e).__name__}: {e}") from e


def _lift_pause(client: redis_lib.Redis) -> None:
    """End a trial's ``CLIENT PAUSE … WRITE``, which would hold every write below until it ends (a fresh
    server is not paused). UNPAUSE is no write, so it runs under such a pause; a ``… ALL`` pause holds it
    too (only a replica's commands pass), so that reset times out, loud."""
    with contextlib.suppress(redis_lib.ResponseError):  # before Redis 6.2: no UNPAUSE (nor WRITE pauses)
        _cmd(client, "CLIENT", "UNPAUSE")


def _acl(client: redis_lib.Redis) -> tuple[str, ...] | None:
    """``ACL LIST``: one line per user, ``user NAME RULES...``, sorted (None before Redis 6)."""
    try:
        return tuple(sorted(_text(x) for x in _cmd(client, "ACL", "LIST")))
    except redis_lib.ResponseError:
        return None


_ACL_TOKEN = re.compile(r"\([^)]*\)|\S+")  # a selector, ``(~x* +get)``, is one argument with spaces
_ACL_CLEAR = ("resetpass", "resetkeys", "resetchannels", "clearselectors", "-@all")


def _acl_user(line: str) -> tuple[str, list[str]]:
    """An ``ACL LIST`` line -> (user name, its rules as ``ACL SETUSER`` arguments)."""
    tokens = _ACL_TOKEN.findall(line)
    return tokens[1], tokens[2:]


def _restore_acl(client: redis_lib.Redis, baseline: tuple[str, ...]) -> None:
    """Put back the users as ``ACL LIST`` listed them at seeding. A user the trial added goes
    (``ACL DELUSER`` also closes its connections); one it changed or removed is created again from its
    listed rules (a new user starts with no rules, so the listing comes back as it was). The default user
    cannot be deleted: its rules are cleared and set again in one ``ACL SETUSER``."""
    want = dict(_acl_user(line) for line in baseline)
    have = dict(_acl_user(line) for line in _acl(client) or ())
    extra = sorted(set(have) - set(want))
    if extra:
        _cmd(client, "ACL", "DELUSER", *extra)
    for name, rules in sorted(want.items()):
        if have.get(name) == rules:
            continue
        if name == "default":
            _cmd(client, "ACL", "SETUSER", name, *_ACL_CLEAR, *rules)
        else:
            if name in have:
                _cmd(client, "ACL", "DELUSER", name)
            _cmd(client, "ACL", "SETUSER", name, *rules)


def _is_primary(client: redis_lib.Redis) -> bool:
    role = _cmd(client, "ROLE")
    return _text(role[0]) == "master"


_HISTORY = (("SLOWLOG", "RESET"), ("ACL", "LOG", "RESET"), ("LATENCY", "RESET"), ("CONFIG", "RESETSTAT"))


def _forget_history(client: redis_lib.Redis) -> None:
    """Empty what a fresh server has not recorded yet and the next trial could read: the slow log (the
    commands with their arguments), the ACL log, latency events and the INFO counters."""
    for command in _HISTORY:
        with contextlib.suppress(redis_lib.ResponseError):  # an older server without one: nothing to empty
            _cmd(client, *command)


def _restore_config(ctx: ApplyContext, client: redis_lib.Redis, baseline: Mapping[str, str]) -> None:
    """``CONFIG SET`` back every parameter a trial changed (before the keys: a ``maxmemory`` a trial
    lowered would make the RESTOREs fail). One the server refuses to set is a reset error."""
    now = _config_of(client)
    for name, value in sorted(baseline.items()):
        if now.get(name) != value:
            try:
                _cmd(client, "CONFIG", "SET", name, value)
            except redis_lib.ResponseError as e:
                raise ctx.fail("reset", f"cannot restore CONFIG {name} to {value!r}: {e}") from e


def fingerprint(ctx: ApplyContext) -> Fingerprint:
    """What a trial can change on the server, each a named part: ``config`` (``CONFIG GET *``, its
    ``replicaof`` too), ``acl`` (``ACL LIST``), ``functions`` (``FUNCTION LIST WITHCODE``), ``modules``
    (``MODULE LIST``) and ``keyspace`` (every database index's key names and types; the values are
    rewritten by every reset). The reset restores all but ``modules`` (no reset unloads a module) and a
    default user whose ``sanitize-payload`` flag a trial set (no rule clears it)."""
    params = _params(ctx)
    try:
        client = params.client()
        try:
            out = {
                "config": fingerprint_part(sorted(_config_of(client).items())),
                "acl": fingerprint_part(list(_acl(client) or ())),
                "modules": fingerprint_part([repr(_cmd(client, "MODULE", "LIST"))]),
            }
            with contextlib.suppress(redis_lib.ResponseError):
                out["functions"] = fingerprint_part([repr(_cmd(client, "FUNCTION", "LIST", "WITHCODE"))])
            rows: list[tuple[int, bytes, bytes]] = []
            for db in _databases(client):
                keys, types = _each_key(params, db, lambda pipe, k: pipe.type(k))
                rows += [(db, k, t) for k, t in zip(keys, types, strict=True)]
            out["keyspace"] = fingerprint_part(rows)
            return out
        finally:
            client.close()
    except redis_lib.RedisError as e:
        raise ctx.fail("fingerprint", f"{type(e).__name__}: {e}") from e


# ------------------------------------------------------------------------------------------------ goldens

RECIPE_VERSION = 1
SUPPORTS_GOLDEN = True


def golden_path(ctx: ApplyContext) -> str | None:
    """The server's ``dir`` (where dump.rdb lives), as the running server reports it."""
    return _config(ctx).get("dir") or None


def golden_fingerprint(ctx: ApplyContext) -> Fingerprint:
    """``fingerprint``: its keyspace part (every key's name and type) already tells an empty or other
    keyspace from the golden's."""
    return fingerprint(ctx)


seed_mount = no_mount  # it works in the running container: no extra mount


def checkpoint_path(ctx: ApplyContext) -> str | None:
    """The server's ``dir``, after ``SAVE`` wrote the keyspace to its dump file (a server restarted from
    it loads that file: ``appendonly`` is refused at seeding)."""
    try:
        _redis_cli(ctx, "SAVE")
    except CommandError as e:
        raise ctx.fail("checkpoint", f"SAVE failed: {e}") from e
    return golden_path(ctx)


checkpoint_settle = no_settle  # the dump SAVE wrote is complete: nothing to replay
reset_staged = reset_after(reset)  # its changes are gone only once the whole reset is done


# A checkpoint's restore in place is the warm reset's, from the checkpoint's keyspace instead of the
# seed's: ``FLUSHALL``, ``SCRIPT FLUSH``, the functions, pipelined ``RESTORE … ABSTTL``; the logs and
# counters a restarted server would not have emptied. The keyspace is read once per checkpoint and process
# (``checkpointcopy.kept``) from a throwaway server loading the checkpoint's dump: a container of its
# image, published on loopback only, removed on every path. What the dump does not hold (the
# configuration, the ACL users) is not touched: a trial that changed them fails the fingerprint check,
# and the caller then restarts the server from the checkpoint's image, which puts them back.
_LOADER_PORT = 6379


@dataclass(frozen=True)
class _Saved:
    keyspace: Keyspace | None  # None: larger than MAX_DUMP_BYTES
    functions: bytes | None


def checkpoint_restore(ctx: ApplyContext, copy: CheckpointCopy) -> bool:
    """The server's keyspace and functions put back at the checkpoint's, in the running server (see the
    section's comment); False when the checkpoint's keyspace is too large to hold (the caller restarts
    the server from the checkpoint's image)."""
    p = _params(ctx)
    try:
        client = p.client()
        try:
            dbfile = _text(_config_of(client).get("dbfilename") or "dump.rdb")
            saved = checkpointcopy.kept(
                ("redis", copy.key, dbfile), lambda: _read_checkpoint(ctx, copy, dbfile)
            )
            if saved.keyspace is None:
                return False
            _forget_history(client)
            _cmd(client, "FLUSHALL")
            _cmd(client, "SCRIPT", "FLUSH")
            if saved.functions is not None:
                _cmd(client, "FUNCTION", "FLUSH")
                if saved.functions:
                    _cmd(client, "FUNCTION", "RESTORE", saved.functions)
        finally:
            client.close()
        _restore_keyspace(p, saved.keyspace)
    except redis_lib.RedisError as e:
        raise ctx.fail("restore", f"{type(e).__name__}: {e}") from e
    return True


def _restore_keyspace(params: RedisParams, keyspace: Keyspace) -> None:
    for db, records in keyspace.items():
        c = params.client(db=db)
        try:
            pipe = c.pipeline(transaction=False)
            for key, payload, expires in records:
                args = ["RESTORE", key, expires, payload, "REPLACE"]
                _cmd(pipe, *args, *(["ABSTTL"] if expires else []))
            pipe.execute()
        finally:
            c.close()


def _read_checkpoint(ctx: ApplyContext, copy: CheckpointCopy, dbfile: str) -> _Saved:
    """The keyspace and functions of the checkpoint's dump, as a server loading it holds them."""
    runner, t = ctx.compose.runner, ctx.timeouts
    server = [
        "--dir", copy.path, "--dbfilename", dbfile, "--save", "", "--appendonly", "no",
        "--port", str(_LOADER_PORT), "--protected-mode", "no",
    ]  # fmt: skip
    loader = checkpointcopy.helper(
        ctx, copy, entrypoint="redis-server", args=server, publish=f"127.0.0.1::{_LOADER_PORT}"
    )
    try:
        with loader as name:
            out = runner.run(dk.port(name, f"{_LOADER_PORT}/tcp"), timeout=t.command, tag="port").stdout
            address = published_address(out)
            if address is None:
                raise ctx.fail(
                    "restore", f"the checkpoint's loader {name} published no port ({out.strip()!r})"
                )
            params = RedisParams(*address)
            deadline = clock() + t.recipe
            while True:
                try:
                    client = params.client()
                    try:
                        _cmd(client, "PING")
                        return _Saved(_dump(client, params), _functions(client))
                    finally:
                        client.close()
                except (redis_lib.ConnectionError, redis_lib.BusyLoadingError) as e:
                    if clock() >= deadline:
                        raise ctx.fail("restore", f"the checkpoint's dump did not load in {name}: {e}") from e
                    sleep(0.02)
    except CommandError as e:
        raise ctx.fail("restore", f"could not load the checkpoint's dump ({copy.image}): {e}") from e


warm_process = no_warm_process  # its reset works in the running server
