"""Golden snapshots, the pure parts: the key (every part that determines the bytes changes it), what
prune selects, where a golden cannot be restored, and the lock two trials of one key share."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from forgelib.cli import snapshots as cli
from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import Interrupted
from forgelib.stacks.snapshots import key, store
from forgelib.stacks.snapshots.key import FORMAT_VERSION
from forgelib.stacks.snapshots.trial import unrestorable

BASE: dict[str, Any] = {
    "kind": "sql_dump",
    "recipe_version": 1,
    "image_id": "sha256:aaa",
    "seed_digest": "sha256:bbb",
    "options": {},
}


def _svc(init: Path) -> dict[str, Any]:
    return {
        "image": "postgres:16",
        "environment": {"POSTGRES_USER": "app"},
        "volumes": [{"type": "bind", "source": str(init), "target": "/docker-entrypoint-initdb.d/init.sql"}],
        "healthcheck": {"interval": "1s"},
    }


def _key(svc: dict[str, Any], **base: Any) -> key.GoldenKey:
    return key.make_key(**{**BASE, **base}, service_config=ServiceConfig.of(svc))


def test_every_part_that_determines_the_bytes_changes_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    init = tmp_path / "init.sql"
    init.write_text("create table t (a int);\n")
    svc = _svc(init)
    k0 = _key(svc).digest
    assert _key(_svc(init)).digest == k0  # deterministic
    changed = [
        _key(svc, image_id="sha256:other"),
        _key(svc, seed_digest="sha256:other"),
        _key(svc, recipe_version=2),
        _key(svc, options={"database": "x"}),
        _key({**svc, "environment": {"POSTGRES_USER": "other"}}),
        _key({**svc, "command": ["postgres", "-c", "fsync=off"]}),
    ]
    init.write_text("create table t (a int, b int);\n")  # an init file's content, not its path
    changed.append(_key(svc))
    init.write_text("create table t (a int);\n")
    monkeypatch.setattr(key, "FORMAT_VERSION", key.FORMAT_VERSION + 1)
    changed.append(_key(svc))
    digests = [k.digest for k in changed]
    assert k0 not in digests and len(set(digests)) == len(digests)


def test_what_does_not_touch_state_leaves_the_key_alone(tmp_path: Path) -> None:
    init = tmp_path / "init.sql"
    init.write_text("x")
    svc = _svc(init)
    k0 = _key(svc).digest
    quiet = {**svc, "healthcheck": {"interval": "5s"}, "ports": ["5432"], "labels": {"a": "b"}}
    assert _key(quiet).digest == k0


@pytest.mark.parametrize(
    ("volumes", "why"),
    [
        ([], None),
        ([{"type": "volume", "source": "v", "target": "/var/lib/postgresql/data"}], None),
        ([{"type": "volume", "source": "v", "target": "/var/lib/postgresql"}], None),
        ([{"type": "bind", "source": "/h", "target": "/var/lib/postgresql/data"}], "bind mount"),
        ([{"type": "bind", "source": "/h", "target": "/var/lib"}], "bind mount"),
        ([{"type": "volume", "target": "/var/lib/postgresql/data", "volume": {"nocopy": True}}], "nocopy"),
        ([{"type": "tmpfs", "target": "/var/lib/postgresql/data"}], "tmpfs"),
        ([{"type": "bind", "source": "/h", "target": "/var/lib/postgresql/data2"}], None),
    ],
)
def test_a_golden_restores_only_where_docker_fills_the_path_from_the_image(
    volumes: list[dict[str, Any]], why: str | None
) -> None:
    got = unrestorable(ServiceConfig.of({"volumes": volumes}), "/var/lib/postgresql/data")
    assert (got is None) if why is None else (got is not None and why in got)


def _golden(
    created: datetime, *, tagged: bool = True, fmt: str = str(FORMAT_VERSION), image: str = "sha256:aaa"
) -> store.Golden:
    k = "ab" * 32
    labels = {store.GOLDEN: fmt, store.KEY: k, store.PREFIX + "image_id": image}
    return store.Golden("sha256:g", (store.tag_of(k),) if tagged else (), labels, created, 1)


def test_prune_selects_by_option_and_always_takes_discarded_ones() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    old, new = _golden(now - timedelta(days=10)), _golden(now - timedelta(hours=1))
    kw: dict[str, Any] = {
        "all": False,
        "older_than": None,
        "unused": False,
        "present": {"sha256:aaa"},
        "now": now,
    }
    assert cli.select(new, **{**kw, "all": True}) == "--all"
    assert cli.select(old, **{**kw, "older_than": 7}) is not None
    assert cli.select(new, **{**kw, "older_than": 7}) is None
    assert cli.select(new, **{**kw, "unused": True}) is None  # its image is here, its format current
    assert "no tag names its image" in str(cli.select(new, **{**kw, "unused": True, "present": set()}))
    assert "format" in str(cli.select(_golden(now, fmt="0"), **{**kw, "unused": True}))
    assert cli.select(_golden(now, tagged=False), **kw) == "discarded (untagged)"


def test_a_golden_whose_labels_disagree_with_its_tag_is_not_complete() -> None:
    now = datetime.now(UTC)
    g = _golden(now)
    assert g.complete
    moved = store.Golden(g.id, (store.tag_of("cd" * 32),), g.labels, now, 1)
    assert not moved.complete


def test_the_key_lock_lets_one_holder_in_and_gives_up_when_stopping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def holder() -> None:
        with store.key_lock("k1", timeout=30):
            order.append("first in")
            inside.set()
            release.wait(30)
            order.append("first out")

    t = threading.Thread(target=holder)
    t.start()
    assert inside.wait(30)
    with (
        pytest.raises(Interrupted, match="stopped while waiting"),  # Ctrl-C, not a golden failure
        store.key_lock("k1", timeout=30, stopping=lambda: True),
    ):
        pass
    release.set()
    with store.key_lock("k1", timeout=30):
        order.append("second in")
    t.join()
    assert order == ["first in", "first out", "second in"]


def test_a_claimed_key_is_shared_by_trials_and_refused_to_prune_and_capture() -> None:
    """Trials claim a golden together; while any claim holds, ``prune`` cannot have the key (at once,
    never waiting) and a capture waits (here: gives up on a stop); once the claims go, prune has it."""
    with store.key_claim("k2", timeout=30), store.key_claim("k2", timeout=30):
        with store.unclaimed("k2") as free:
            assert free is False
        with (
            pytest.raises(Interrupted, match="stopped while waiting"),
            store.key_lock("k2", timeout=30, stopping=lambda: True),
        ):
            pass
    with store.unclaimed("k2") as free:
        assert free is True
        with pytest.raises(Interrupted), store.key_claim("k2", timeout=30, stopping=lambda: True):
            pass  # prune holds it: a trial waits for it to finish (here: a stop)


# ---------------------------------------------------------------------- sql_dump: the dump format preflight


def _archive(version: tuple[int, int, int], by: str = "17.6", source: str = "17.6") -> bytes:
    """The head of a pg_dump -Fc archive as pg_dump writes it (intSize 4)."""

    def i(n: int) -> bytes:
        return bytes([n < 0]) + abs(n).to_bytes(4, "little")

    def s(text: str) -> bytes:
        return i(len(text)) + text.encode()

    compression = b"\x00" if version[:2] >= (1, 15) else i(-1)
    return (
        b"PGDMP"
        + bytes(version)
        + bytes([4, 8, 1])
        + compression
        + b"".join(i(n) for n in range(7))
        + s("app")
        + s(source)
        + s(by)
    )


def test_the_dump_header_says_what_made_it(tmp_path: Path) -> None:
    from forgelib.kinds.postgres.seed import DumpHeader, read_header

    plain = tmp_path / "plain.sql"
    plain.write_text("create table t (a int);\n")
    assert read_header(plain) == DumpHeader() and not read_header(plain).needs_preflight
    dumped = tmp_path / "dumped.sql"
    dumped.write_text(
        "--\n-- PostgreSQL database dump\n--\n\n\\restrict AbC123\n\n"
        "-- Dumped from database version 17.5\n-- Dumped by pg_dump version 17.6\n\nSET x = 0;\n"
    )
    assert read_header(dumped) == DumpHeader(False, None, "17.6", "17.5", True)
    archive = tmp_path / "a.dump"
    archive.write_bytes(_archive((1, 16, 0)) + b"rest of the archive")
    assert read_header(archive) == DumpHeader(True, (1, 16, 0), "17.6", "17.6", False)
    old = tmp_path / "old.dump"
    old.write_bytes(_archive((1, 14, 0), by="15.4", source="15.4"))
    assert read_header(old) == DumpHeader(True, (1, 14, 0), "15.4", "15.4", False)


@pytest.mark.parametrize(
    ("header", "server", "client", "problem"),
    [
        ({}, "15.20", "15.20", None),  # plain SQL without a header: nothing to check
        ({"dumped_by": "15.4"}, "16.2", "16.2", None),  # an older pg_dump into a newer server is fine
        ({"dumped_by": "17.6"}, "15.20", "15.20", "pg_dump 17.6, but the service runs PostgreSQL 15.20"),
        ({"restrict": True, "dumped_by": "15.14"}, "15.13", "15.13", "psql 15.13 in the service"),
        ({"restrict": True, "dumped_by": "15.14"}, "15.14", "15.14", None),
        ({"restrict": True, "dumped_by": "16.10"}, "18.0", "18.0", None),
        (
            {"custom": True, "archive_version": (1, 16, 0), "dumped_by": "17.6"},
            "17.6",
            "15.20",
            "reads formats up to 1.14",
        ),
        ({"custom": True, "archive_version": (1, 14, 0), "dumped_by": "15.4"}, "15.20", "15.20", None),
    ],
)
def test_an_incompatible_dump_is_refused_naming_both_versions_and_the_fix(
    header: dict[str, Any], server: str, client: str, problem: str | None
) -> None:
    from forgelib.kinds.postgres.seed import DumpHeader, compatibility

    why = compatibility(DumpHeader(**header), server, client)
    if problem is None:
        assert why is None
    else:
        assert why is not None and problem in why and ("re-dump" in why and "newer image" in why)


def test_a_restore_is_trusted_only_when_its_fingerprint_equals_the_captured_one() -> None:
    import json
    from types import SimpleNamespace

    from forgelib.spec.models import Timeouts
    from forgelib.stacks.snapshots.trial import GoldenFailed, Plan, TrialGoldens
    from forgelib.testing import FakeRunner

    k = _key({})
    captured = {"roles": "r1", "seeded_rows": "s1"}
    labels = {store.GOLDEN: str(FORMAT_VERSION), store.KEY: k.digest, store.STATE: json.dumps(captured)}
    golden = store.Golden("sha256:g", (store.tag_of(k.digest),), labels, datetime.now(UTC), 1)
    goldens = TrialGoldens(FakeRunner(), Timeouts(), "run", "proj")
    ctx: Any = SimpleNamespace(service="db")
    empty: Any = SimpleNamespace(golden_fingerprint=lambda ctx: {"roles": "r1", "seeded_rows": "EMPTY"})
    with pytest.raises(GoldenFailed, match="fingerprint parts differ: seeded_rows"):
        goldens.verify(Plan("db", k, golden), empty, ctx)
    same: Any = SimpleNamespace(golden_fingerprint=lambda ctx: dict(captured))
    goldens.verify(Plan("db", k, golden), same, ctx)
    assert goldens.records["db"] == {"outcome": "restored", "golden": k.digest[:12]}
    unlabelled = store.Golden("sha256:g", golden.tags, {**labels, store.STATE: ""}, golden.created, 1)
    with pytest.raises(GoldenFailed, match="no fingerprint"):
        goldens.verify(Plan("db", k, unlabelled), same, ctx)


@pytest.mark.parametrize("load_refused", [False, True])
def test_a_capture_names_its_built_image_by_id_and_only_the_unvolumed_one_or_the_fallback_is_tagged(
    tmp_path: Path, load_refused: bool
) -> None:
    """The built image is never tagged by a name another capture of the key could move: it is inspected and
    removed by the ID its build printed; the key's tag goes on the loaded image, or (an engine refusing the
    config-only load) on the built one, which then stays."""
    import json

    from forgelib.errors import CommandError
    from forgelib.testing import ANY, FakeRunner

    k = _key({})
    tag = store.tag_of(k.digest)
    built = "sha256:" + "b" * 64
    labels = {store.GOLDEN: str(FORMAT_VERSION), store.KEY: k.digest}
    info = {"Id": built, "Config": {"Labels": labels, "Volumes": {"/data": {}}}, "RootFS": {"Layers": ["l1"]}}
    r = FakeRunner()
    r.expect("docker", "build", stdout=f"{built}\n")
    r.expect("docker", "image", "inspect", built, stdout=json.dumps([info]))
    if load_refused:
        r.expect("docker", "load", raises=CommandError(("docker", "load"), 1, "", "unsupported"))
    else:
        r.expect("docker", "load")
    loaded = {**info, "Config": {"Labels": labels, "Volumes": None}}
    r.expect("docker", "image", "inspect", tag, stdout=json.dumps([{**loaded, "RepoTags": [tag]}]))
    # the loaded image, inspected by the digest of its config: the same layers, no VOLUME at /data
    r.expect("docker", "image", "inspect", ANY, stdout=json.dumps([loaded]))
    r.expect("docker", "tag")
    r.expect("docker", "image", "rm")
    (tmp_path / "data.tar").write_bytes(b"")
    g = store.build(r, key=k, path="/data", data_tar=tmp_path / "data.tar", labels=labels, timeout=5)
    assert g.complete
    argvs = [c.argv for c in r.calls]
    assert not any("--tag" in a or any(str(x).endswith("-building") for x in a) for a in argvs)
    assert (("docker", "tag", built, tag) in argvs) is load_refused  # the fallback keeps the built image
    assert (("docker", "image", "rm", built) in argvs) is not load_refused


# ------------------------------------------------------------------ Ctrl-C is an interruption, never a fault


@pytest.mark.parametrize("killed", ["build", "load"])
def test_ctrl_c_during_a_capture_propagates_records_no_failure_and_restarts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, killed: str
) -> None:
    """The stop kills the capture's `docker build` (or its config-only `docker load`): the capture raises
    Interrupted (not "capturing the golden failed"), leaves no build directory, releases the key's lock,
    does not start the stopped service again, and removes the image a finished build left."""
    import io
    import json
    import tarfile
    from types import SimpleNamespace

    from forgelib.spec.models import Seed, SeedKind, Timeouts
    from forgelib.stacks.live import StopState
    from forgelib.stacks.snapshots.trial import Plan, TrialGoldens
    from forgelib.testing import ANY, FakeRunner

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    state = StopState()
    fake = FakeRunner()
    built = "sha256:" + "b" * 64
    info = {"Id": built, "Config": {"Labels": {}, "Volumes": {"/data": {}}}, "RootFS": {"Layers": ["l1"]}}
    stop = {"side_effect": lambda call: state.request("SIGINT"), "rc": -9}
    if killed == "build":
        fake.expect("docker", "build", **stop)  # type: ignore[arg-type]
    else:
        fake.expect("docker", "build", stdout=f"{built}\n")
        fake.expect("docker", "image", "inspect", built, stdout=json.dumps([info]))
        fake.expect("docker", "load", **stop)  # type: ignore[arg-type]
        fake.expect("docker", "image", "rm", built)
    fake.expect("docker", "tag", ANY)  # the old fallback: must not be reached
    runner = state.guard(fake)

    def cp(argv: Any, *, stdout_path: Path, **kw: Any) -> None:
        with tarfile.open(stdout_path, "w") as t:
            t.addfile(tarfile.TarInfo("data"), io.BytesIO(b""))

    restarted: list[str] = []
    compose = SimpleNamespace(stop=lambda svcs, timeout: None, run=cp)
    ctx: Any = SimpleNamespace(service="db", compose=compose, service_config=ServiceConfig.of({}))
    recipe: Any = SimpleNamespace(
        golden_fingerprint=lambda ctx: {"rows": "x"}, golden_path=lambda ctx: "/data"
    )
    seed = Seed(name="s", path=tmp_path / "s.sql", kind=SeedKind.SQL_DUMP, digest="sha256:" + "c" * 64)
    released: list[bool] = []
    plan = Plan("db", _key({}), capture=True)
    plan.lock.callback(lambda: released.append(True))
    goldens = TrialGoldens(runner, Timeouts(), "run", "proj", stopping=lambda: state.requested)
    with pytest.raises(Interrupted):
        goldens.capture(plan, recipe, ctx, seed, lambda: restarted.append("db"))
    assert goldens.records.get("db", {}).get("outcome") != "none", goldens.records  # no failure recorded
    assert restarted == [] and released == [True]
    assert not list((tmp_path / "forgelib" / "goldens").glob("build-*"))
    assert ("docker", "tag") not in [c.argv[:2] for c in fake.calls]
    if killed == "load":
        assert ("docker", "image", "rm", built) in fake.argvs()


def test_ctrl_c_while_a_restore_is_verified_is_no_fault_of_the_golden() -> None:
    """Reading the restored state, interrupted: Interrupted propagates; no GoldenFailed (which discards)."""
    import json
    from types import SimpleNamespace

    from forgelib.spec.models import Timeouts
    from forgelib.stacks.snapshots.trial import Plan, TrialGoldens
    from forgelib.testing import FakeRunner

    k = _key({})
    labels = {store.GOLDEN: str(FORMAT_VERSION), store.KEY: k.digest, store.STATE: json.dumps({"a": "1"})}
    golden = store.Golden("sha256:g", (store.tag_of(k.digest),), labels, datetime.now(UTC), 1)

    def stopped(ctx: Any) -> dict[str, str]:
        raise Interrupted("stop requested (SIGINT): `exec` was stopped")

    goldens = TrialGoldens(FakeRunner(), Timeouts(), "run", "proj")
    with pytest.raises(Interrupted):
        recipe: Any = SimpleNamespace(golden_fingerprint=stopped)
        goldens.verify(Plan("db", k, golden), recipe, SimpleNamespace())  # type: ignore[arg-type]
    assert "db" not in goldens.records


def test_prune_leaves_an_untagged_golden_whose_capturing_process_is_alive() -> None:
    """Untagged is also a capture in flight (its built image before the key's tag goes on the loaded one):
    prune removes it only once its owner is provably gone, as the reaper does; a dead owner's goes."""
    import json

    from forgelib.docker import labels as lab
    from forgelib.stacks import reaper as custody
    from forgelib.testing import ANY, FakeRunner

    me = lab.current_owner().labels()
    dead = {**me, lab.OWNER_PID: "999999"}

    def start_time(pid: int) -> str | None:
        return None if pid == 999999 else me[lab.OWNER_START_TIME]

    facts = custody.HostFacts(me[lab.OWNER_HOST], me[lab.OWNER_BOOT_ID], start_time)

    def info(iid: str, owner: dict[str, str]) -> dict[str, Any]:
        labels = {store.GOLDEN: str(FORMAT_VERSION), store.KEY: "ab" * 32, lab.MANAGED: "true", **owner}
        return {"Id": iid, "RepoTags": [], "Config": {"Labels": labels}, "Created": "2026-12-01T10:00:00Z"}

    r = FakeRunner()
    r.expect("docker", "image", "ls", stdout="sha256:live\nsha256:dead\n")
    r.expect("docker", "image", "inspect", "--format", stdout="")  # _present_images
    both = [info("sha256:live", me), info("sha256:dead", dead)]
    r.expect("docker", "image", "inspect", ANY, ANY, stdout=json.dumps(both))
    r.expect("docker", "image", "rm")
    rows = {row["image"]: row for row in cli.prune(r, all=False, older_than=None, unused=True, facts=facts)}
    assert rows["sha256:dead"]["action"] == "removed", rows
    assert rows["sha256:live"]["action"] == "kept" and "capture in flight" in rows["sha256:live"]["error"]
    assert [c.argv for c in r.calls if c.argv[:3] == ("docker", "image", "rm")] == [
        ("docker", "image", "rm", "sha256:dead")
    ]


def test_ls_prune_and_verify_can_be_scoped_to_one_project() -> None:
    """--project NAME: the engine is shared (other users, concurrent test sessions); a scoped prune lists,
    and so can touch, only the goldens captured for that project."""
    from forgelib.testing import FakeRunner

    r = FakeRunner()
    r.expect("docker", "image", "ls", stdout="")
    assert cli.prune(r, all=True, older_than=None, unused=False, project="mine") == []
    assert cli.verify(r, project="mine") == []
    scoped = ("--filter", f"label={store.GOLDEN}", "--filter", f"label={store.PROJECT}=mine")
    assert [c.argv[-4:] for c in r.calls] == [scoped, scoped]


# ------------------------------------------------------ a failed look at the restored services is no verdict


def _restored_db() -> tuple[Any, Any]:
    import json

    from forgelib.stacks.snapshots.trial import Plan

    k = _key({})
    labels = {store.GOLDEN: str(FORMAT_VERSION), store.KEY: k.digest, store.STATE: json.dumps({"a": "1"})}
    golden = store.Golden("sha256:g", (store.tag_of(k.digest),), labels, datetime.now(UTC), 1)
    return k, {"db": Plan("db", k, golden)}


def _db_info(status: str, health: str | None = None) -> dict[str, Any]:
    from forgelib.docker.labels import COMPOSE_SERVICE

    state: dict[str, Any] = {"Status": status}
    if health is not None:
        state["Health"] = {"Status": health}
    return {"Id": "id-db", "Name": "/p1-db-1", "Config": {"Labels": {COMPOSE_SERVICE: "db"}}, "State": state}


@pytest.mark.parametrize("where", ["ps", "inspect"])
@pytest.mark.parametrize("hiccups", [1, 2])
def test_an_engine_hiccup_while_looking_at_restored_services_discards_no_golden(
    hiccups: int, where: str
) -> None:
    """After a failed ``up``, the restored services are looked at through ``docker ps``/``inspect`` (not
    ``compose ps``). A look that fails is retried once; failing again, the trial's provisioning fails
    saying the goldens could not be checked, and no golden is blamed (before: every restored service
    counted as not running, so a good golden was discarded on an engine hiccup)."""
    import json

    from forgelib.docker.compose import ComposeProject
    from forgelib.errors import CommandError, ProvisionError
    from forgelib.spec.models import Timeouts
    from forgelib.stacks.snapshots.trial import GoldenFailed, TrialGoldens
    from forgelib.testing import FakeRunner

    _, plans = _restored_db()
    fake = FakeRunner()
    daemon = "Cannot connect to the Docker daemon"
    if where == "ps":
        down = CommandError(("docker", "ps"), 1, "", daemon)
        fake.expect("docker", "ps", raises=down, times=hiccups)
    else:  # `docker inspect` runs unchecked (rc 1 when a container went): no JSON at all is a failure
        fake.expect("docker", "ps", "--all", "--quiet", stdout="id-db\n", times=hiccups)
        fake.expect("docker", "inspect", "id-db", rc=1, stderr=daemon, times=hiccups)
    fake.expect("docker", "ps", "--all", "--quiet", stdout="id-db\n")
    fake.expect("docker", "inspect", "id-db", stdout=json.dumps([_db_info("running", "healthy")]))
    fake.expect("docker", "compose", stdout="")  # compose ps / logs: the old path, must not decide
    compose = ComposeProject("p1", (Path("/x/c.yaml"),), fake)
    goldens = TrialGoldens(FakeRunner(), Timeouts(), "run", "proj")
    cause = ProvisionError("compose_up", "service 'app' exited (1)")
    if hiccups == 1:
        goldens.check_started(compose, plans, ["db", "app"], cause)  # the second look: db is fine
    else:
        with pytest.raises(ProvisionError) as info:
            goldens.check_started(compose, plans, ["db", "app"], cause)
        assert not isinstance(info.value, GoldenFailed)
        assert info.value.stage == "compose_up"
        assert "service 'app' exited (1)" in info.value.reason
        assert "could not be checked" in info.value.reason and "goldens are kept" in info.value.reason
        assert daemon in info.value.reason
    assert [c.argv[1] for c in fake.calls].count("ps") == 2
    assert not any(c.argv[:2] == ("docker", "compose") for c in fake.calls)


def test_a_restored_service_still_starting_after_a_failed_up_keeps_its_golden() -> None:
    """Docker's health ``starting`` only says its first probe has not run yet (forge spaces the probes out,
    ``compose.quiet_healthcheck``): no verdict on the golden, which stays."""
    import json

    from forgelib.docker.compose import ComposeProject
    from forgelib.errors import ProvisionError
    from forgelib.spec.models import Timeouts
    from forgelib.stacks.snapshots.trial import TrialGoldens
    from forgelib.testing import FakeRunner

    _, plans = _restored_db()
    fake = FakeRunner()
    fake.expect("docker", "ps", "--all", "--quiet", stdout="id-db\n")
    fake.expect("docker", "inspect", "id-db", rc=1, stdout=json.dumps([_db_info("running", "starting")]))
    goldens = TrialGoldens(FakeRunner(), Timeouts(), "run", "proj")
    compose = ComposeProject("p1", (Path("/x/c.yaml"),), fake)
    goldens.check_started(compose, plans, [], ProvisionError("compose_up", "boom"))
    assert goldens.records == {}
    assert not any(c.argv[1] == "logs" for c in fake.calls)


@pytest.mark.parametrize("info", [_db_info("exited"), _db_info("running", "unhealthy"), None])
def test_a_restored_service_not_running_after_a_failed_up_blames_its_golden(info: Any) -> None:
    """Exited, unhealthy, or without a container (inspect answers ``[]``): its golden."""
    import json

    from forgelib.docker.compose import ComposeProject
    from forgelib.errors import ProvisionError
    from forgelib.spec.models import Timeouts
    from forgelib.stacks.snapshots.trial import GoldenFailed, TrialGoldens
    from forgelib.testing import FakeRunner

    _, plans = _restored_db()
    fake = FakeRunner()
    fake.expect("docker", "ps", "--all", "--quiet", stdout="id-db\n")
    fake.expect("docker", "inspect", "id-db", rc=1, stdout=json.dumps([info] if info else []))
    fake.expect("docker", "logs", "--tail", "10", "id-db", exact=True, stdout="FATAL: corrupt\n")
    compose = ComposeProject("p1", (Path("/x/c.yaml"),), fake)
    goldens = TrialGoldens(FakeRunner(), Timeouts(), "run", "proj")
    with pytest.raises(GoldenFailed, match="did not start from the golden") as err:
        goldens.check_started(compose, plans, [], ProvisionError("compose_up", "boom"))
    # the log tail is its container's, read the one way forge reads a service's log (docker logs)
    assert str(err.value).endswith("log tail:\nFATAL: corrupt" if info else "log tail:\n")
    assert not any(c.argv[1] == "compose" for c in fake.calls)


# ------------------------------------------------------------------ plan: the image and its golden, one look


class _Engine:
    """A fake engine's ``docker image inspect``: the image ``postgres:16`` with ``image_id``, and the goldens
    in ``goldens`` (by key digest); records which refs each call asked for."""

    def __init__(self, image_id: str) -> None:
        from forgelib.testing import FakeRunner

        self.image_id = image_id
        self.goldens: set[str] = set()
        self.asked: list[list[str]] = []
        self.runner = FakeRunner()

        def reply(call: Any) -> None:
            import json

            refs = list(call.argv[3:])
            self.asked.append(refs)
            found: list[dict[str, Any]] = []
            for ref in refs:
                if ref == "postgres:16":
                    found.append({"Id": self.image_id, "RepoTags": ["postgres:16"]})
                elif ref.removeprefix(store.REPOSITORY + ":") in self.goldens:
                    digest = ref.removeprefix(store.REPOSITORY + ":")
                    labels = {store.GOLDEN: str(FORMAT_VERSION), store.KEY: digest}
                    found.append(
                        {"Id": f"sha256:g{digest[:6]}", "RepoTags": [ref], "Config": {"Labels": labels}}
                    )
            answer.stdout = json.dumps(found)
            answer.rc = 0 if len(found) == len(refs) else 1  # docker: "No such image" for the others

        answer = self.runner.expect("docker", "image", "inspect", side_effect=reply)


def _plan(engine: _Engine, seen: dict[str, str], locks: Any) -> Any:
    from types import SimpleNamespace

    from forgelib.spec.models import Timeouts
    from forgelib.stacks.snapshots.trial import TrialGoldens

    recipe = SimpleNamespace(SUPPORTS_GOLDEN=True, RECIPE_VERSION=1)
    b: Any = SimpleNamespace(
        service="db", seed=SimpleNamespace(kind="sql_dump", digest="sha256:bbb"), recipe=recipe, options={}
    )
    # Short lock timeouts: a trial waiting on its own claim would fail here, not hang.
    goldens = TrialGoldens(engine.runner, Timeouts(compose_up=1, recipe=1), "run", "proj", seen=seen)
    return goldens.plan([b], {"db": ServiceConfig.of({"image": "postgres:16"})}, locks)["db"]


def _key_of(image_id: str) -> key.GoldenKey:
    return key.make_key(
        kind="sql_dump", recipe_version=1, image_id=image_id, seed_digest="sha256:bbb", options={},
        service_config=ServiceConfig.of({"image": "postgres:16"}),
    )  # fmt: skip


def test_a_golden_is_found_in_one_look_once_the_image_id_was_seen_and_stays_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import contextlib

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    engine = _Engine("sha256:id1")
    k = _key_of("sha256:id1")
    engine.goldens.add(k.digest)
    seen: dict[str, str] = {}
    with contextlib.ExitStack() as locks:
        first = _plan(engine, seen, locks)
    assert engine.asked == [["postgres:16"], [store.tag_of(k.digest)]]  # the image, then its key's tag
    assert first.golden is not None and first.key == k and seen == {"postgres:16": "sha256:id1"}
    engine.asked.clear()
    with contextlib.ExitStack() as locks:
        second = _plan(engine, seen, locks)
        assert engine.asked == [["postgres:16", store.tag_of(k.digest)]]  # both in one look
        assert second.golden is not None and second.golden.key == k.digest and not second.capture
        with store.unclaimed(k.digest) as free:
            assert free is False  # claimed for the trial until its containers exist (``locks``)
    with store.unclaimed(k.digest) as free:
        assert free is True


def test_a_golden_of_an_id_the_image_no_longer_has_is_never_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tag moved to another image since the last look: the guessed key's golden is there, yet the same
    answer shows another ID, so the trial looks up the new key (none: it captures)."""
    import contextlib

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    engine = _Engine("sha256:id2")
    old, new = _key_of("sha256:id1"), _key_of("sha256:id2")
    engine.goldens.add(old.digest)
    seen = {"postgres:16": "sha256:id1"}
    with contextlib.ExitStack() as locks:
        p = _plan(engine, seen, locks)
        assert p.golden is None and p.capture and p.key == new
        looks = [["postgres:16", store.tag_of(old.digest)], [store.tag_of(new.digest)]]
        assert engine.asked == [*looks, [store.tag_of(new.digest)]]  # the new key, claimed, then locked
        with store.unclaimed(old.digest) as free:
            assert free is True  # the guess's claim is gone with the look
    assert seen == {"postgres:16": "sha256:id2"}


def test_a_guess_with_no_golden_takes_the_keys_lock_to_capture_without_waiting_on_its_own_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import contextlib

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    engine = _Engine("sha256:id1")
    k = _key_of("sha256:id1")
    with contextlib.ExitStack() as locks:
        p = _plan(engine, {"postgres:16": "sha256:id1"}, locks)
        assert p.golden is None and p.capture and p.key == k
        assert engine.asked == [["postgres:16", store.tag_of(k.digest)], [store.tag_of(k.digest)]]
        with store.unclaimed(k.digest) as free:
            assert free is False  # this trial holds the key's lock while it captures
