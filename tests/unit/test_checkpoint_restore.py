"""A checkpoint's restore in place (``Recipe.checkpoint_restore``): the checkpoint's directory read out of
its image once per process; postgres's data directory staged once per container and put back by the
supervisor loop's request, whose script really restores a directory (run here with ``sh`` on the host:
whole the first time, what changed after); a tree's listing from the checkpoint's tar; the published
ports taken from the container's inspect, so a restore in place asks the engine for none."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from forgelib.docker.compose import ComposeProject
from forgelib.docker.resolved import ServiceConfig
from forgelib.kinds import checkpointcopy, supervisor
from forgelib.kinds.base import ApplyContext, CheckpointCopy
from forgelib.kinds.datadir import RESTORE_SCRIPT, SYNC_SCRIPT
from forgelib.kinds.tree import seed as tree
from forgelib.spec.models import Seed, SeedKind, Timeouts
from forgelib.stacks import checkpoints
from forgelib.testing import FakeRunner

T = Timeouts(recipe=40, command=9)
KEY = "0123456789abcdef" * 4
SUPERVISED = {
    "Id": "c0ffee",
    "Config": {"Entrypoint": ["sh", "-c", supervisor.SUPERVISOR, supervisor.MARKER]},
}


@pytest.fixture(autouse=True)
def _forget() -> Any:
    checkpointcopy.forget()
    supervisor._staged.clear()
    yield
    checkpointcopy.forget()
    supervisor._staged.clear()


def _ctx(fake: FakeRunner, service: str = "db") -> ApplyContext:
    compose = ComposeProject("p1", (Path("/x/c.yaml"),), fake, T)
    seed = Seed("s1", Path("/nonexistent"), SeedKind.SQL_DUMP, "sha256:unused")
    return ApplyContext(
        service, seed, {}, compose=compose, service_config=ServiceConfig.of({}, service), timeouts=T
    )


def _copy(path: str = "/var/lib/postgresql/data", info: Any = None) -> CheckpointCopy:
    return CheckpointCopy(
        image="sha256:" + KEY, path=path, key=KEY, labels={"io.forgelib.run": "r"}, info=info or {}
    )


def _tar(top: str, files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        d = tarfile.TarInfo(top)
        d.type, d.mode = tarfile.DIRTYPE, 0o700
        tf.addfile(d)
        for name, data in files.items():
            f = tarfile.TarInfo(f"{top}/{name}")
            f.size = len(data)
            tf.addfile(f, io.BytesIO(data))
        link = tarfile.TarInfo(f"{top}/hard")
        link.type, link.linkname = tarfile.LNKTYPE, f"{top}/{next(iter(files))}"
        tf.addfile(link)
        sym = tarfile.TarInfo(f"{top}/sym")
        sym.type, sym.linkname = tarfile.SYMTYPE, "elsewhere"
        tf.addfile(sym)
    return buf.getvalue()


def test_a_checkpoint_is_read_out_of_its_image_once_per_process() -> None:
    data = _tar("notes", {"a.md": b"a\n"})  # ASCII only: the fake writes its stdout as text
    fake = FakeRunner()
    fake.expect("docker", "create")
    fake.expect("docker", "cp", stdout=data.decode("ascii"))
    fake.expect("docker", "rm")
    ctx = _ctx(fake)
    copy = _copy("/work/notes")
    assert checkpointcopy.read(ctx, copy) == data
    create, cp, rm = fake.argvs()
    name = create[create.index("--name") + 1]
    assert name.startswith("forge-ckread-") and create[create.index("--network") + 1] == "none"
    assert "io.forgelib.run=r" in create and "io.forgelib.helper=checkpoint-read" in create
    assert create[-2:] == ("sha256:" + KEY, "forge-checkpoint-read")
    assert cp == ("docker", "cp", f"{name}:/work/notes", "-")
    assert rm[:2] == ("docker", "rm") and name in rm
    assert checkpointcopy.read(ctx, copy) == data and len(fake.calls) == 3  # kept: not read again


def test_a_failed_read_still_removes_its_container() -> None:
    fake = FakeRunner()
    fake.expect("docker", "create")
    fake.expect("docker", "cp", rc=1, stderr="no such file")
    fake.expect("docker", "rm")
    with pytest.raises(Exception, match="could not read /work/notes out of checkpoint image"):
        checkpointcopy.read(_ctx(fake), _copy("/work/notes"))
    assert fake.argvs()[-1][:2] == ("docker", "rm")


def test_an_unsupervised_container_is_not_restored_in_place() -> None:
    fake = FakeRunner()
    assert (
        supervisor.restore_copy(
            _ctx(fake), {"Id": "x", "Config": {"Entrypoint": ["docker-entrypoint.sh"]}}, _copy()
        )
        is False
    )
    assert fake.calls == []


def test_postgres_is_staged_once_per_container_then_restored_by_the_loop() -> None:
    fake = FakeRunner()
    checkpointcopy.remember(KEY, _tar("data", {"PG_VERSION": b"15\n"}))
    fake.expect("docker", "exec", "--user", "0", "c0ffee", "test", rc=1)  # no staged copy yet
    fake.expect("docker", "exec")
    fake.expect("docker", "cp")
    ctx = _ctx(fake)
    assert supervisor.restore_copy(ctx, SUPERVISED, _copy()) is True
    probe, prep, cp, stage, request = (c.argv for c in fake.calls)
    assert probe[-3:] == ("test", "-e", f"/forge/s/c-{KEY[:32]}/.done")
    assert prep[-2:] == ("forge-stage", f"/forge/s/t-{KEY[:32]}")
    assert cp == ("docker", "cp", "--archive", "-", f"c0ffee:/forge/s/t-{KEY[:32]}")
    assert stage[-3:] == (f"/forge/s/t-{KEY[:32]}", f"/forge/s/c-{KEY[:32]}", "data")
    script = request[request.index("forge-reset") + 1]
    assert f'"$4/c-{KEY[:32]}"' in script and RESTORE_SCRIPT in script
    assert request[-4:] == ("/var/lib/postgresql/data", "PG_VERSION", SYNC_SCRIPT, "QUIT")
    # the same container again: staged already, one request and nothing else
    fake.calls.clear()
    assert supervisor.restore_copy(ctx, SUPERVISED, _copy()) is True
    assert [c.argv[-1] for c in fake.calls] == ["QUIT"]


def test_a_staged_copy_another_process_left_is_used_as_it_is() -> None:
    fake = FakeRunner()
    fake.expect("docker", "exec")
    assert supervisor.restore_copy(_ctx(fake), SUPERVISED, _copy()) is True
    assert [c.argv[-3] if c.argv[-3] == "test" else c.argv[-1] for c in fake.calls] == ["test", "QUIT"]


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", script, "forge-reset", *args], capture_output=True, text=True, timeout=60
    )


def _state(d: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for root, dirs, files in os.walk(d):
        for n in dirs:
            out[str(Path(root, n).relative_to(d))] = None
        for n in files:
            out[str(Path(root, n).relative_to(d))] = Path(root, n).read_bytes()
    return out


def test_the_loops_script_puts_the_staged_copy_back_whole_then_what_changed(tmp_path: Path) -> None:
    """The request's script as the loop runs it (``sh script DIR MARKER SYNC STATE``), on the host."""
    state, d = tmp_path / "s", tmp_path / "data"
    staged = state / f"c-{KEY[:32]}"
    (staged / "data" / "base").mkdir(parents=True)
    (staged / "data" / "PG_VERSION").write_text("15\n")
    (staged / "data" / "base" / "1").write_text("rows at capture")
    (staged / ".done").touch()
    (d / "base").mkdir(parents=True)
    (d / "PG_VERSION").write_text("15\n")
    (d / "base" / "1").write_text("rows changed since")
    (d / "base" / "2").write_text("a table made since")
    (d / "postmaster.pid").write_text("1")
    script = supervisor._STAGED_SCRIPT.format(key=KEY[:32], restore=RESTORE_SCRIPT, tick=supervisor._TICK)
    args = (str(d), "PG_VERSION", SYNC_SCRIPT, str(state))
    r = _run(script, *args)
    assert r.returncode == 0, r.stderr
    assert _state(d) == _state(staged / "data") and (staged / ".stamp").exists()
    # what the restarted server and the next trial change, and only that, is put back the second time
    (d / "base" / "1").write_text("changed again")
    (d / "base" / "3").write_text("new")
    r = _run(script, *args)
    assert r.returncode == 0, r.stderr
    assert _state(d) == _state(staged / "data")
    # a copy that is not complete is refused before anything is touched
    (staged / ".done").unlink()
    (d / "base" / "4").write_text("new")
    r = _run(script, *args)
    assert r.returncode == 3 and "no staged copy" in r.stderr
    assert (d / "base" / "4").exists()


def test_a_trees_listing_from_the_checkpoints_tar() -> None:
    listing = tree.tar_listing(_tar("notes", {"a.md": b"a\n", "sub/b.md": b"b\n"}), "notes")
    sha_a = "87428fc522803d31065e7bce3cf03fe475096631e5e07bbd7a0fde60c4cf25c7"
    assert listing["a.md"] == sha_a and listing["hard"] == sha_a  # a hard link is its file
    assert listing["sym"] is None and "sub/b.md" in listing and "" not in listing


def test_a_restore_in_place_takes_the_published_ports_from_the_inspect() -> None:
    ctx = _ctx(FakeRunner(), "redis")
    info = {
        "NetworkSettings": {
            "Ports": {
                "6379/tcp": [{"HostIp": "127.0.0.1", "HostPort": "49153"}],
                "9000/tcp": None,
                "53/udp": [{"HostIp": "0.0.0.0", "HostPort": "1053"}],
                "8080/tcp": [{"HostIp": "0.0.0.0", "HostPort": "49999"}],
            }
        }
    }
    checkpoints._published(ctx, info)
    assert ctx.addresses == {("redis", 6379): ("127.0.0.1", 49153), ("redis", 8080): ("127.0.0.1", 49999)}
    assert ctx.address(6379) == ("127.0.0.1", 49153)  # asked of nobody: the fake runner has no answers
