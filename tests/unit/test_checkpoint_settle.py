"""A checkpoint's settle step (``checkpoints._settle``): the kind's command runs in a helper container of
the service's image, as the copy's owner, without network, labelled for the reaper, and the helper is
removed whether the command succeeds or fails; a kind without one runs nothing."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from forgelib.docker import labels as lab
from forgelib.kinds.postgres import seed as pg
from forgelib.spec.models import Timeouts
from forgelib.stacks import checkpoints
from forgelib.stacks.snapshots.checkpoints import CheckpointError
from forgelib.testing import FakeRunner

INFO = {"Config": {"Labels": {lab.MANAGED: "true", lab.RUN: "run-1", "other": "x"}}}


def _tar(path: Path) -> Path:
    with tarfile.open(path, "w") as tf:
        top = tarfile.TarInfo("data")
        top.type, top.uid, top.gid, top.mode = tarfile.DIRTYPE, 999, 998, 0o700
        tf.addfile(top)
        f = tarfile.TarInfo("data/PG_VERSION")
        f.size, f.uid, f.gid = 3, 999, 998
        tf.addfile(f, io.BytesIO(b"15\n"))
    return path


def _service(settle: Any) -> Any:
    return SimpleNamespace(name="db", recipe=SimpleNamespace(checkpoint_settle=settle), ctx=None)


def _settle(runner: FakeRunner, settle: Any, tar: Path) -> None:
    s = cast(Any, _service(settle))
    checkpoints._settle(runner, s, INFO, "sha256:pg", "/var/lib/postgresql/data", tar, Timeouts())


def test_postgres_copy_is_settled_by_its_image_as_its_owner_and_the_helper_removed(tmp_path: Path) -> None:
    tar = _tar(tmp_path / "data.tar")
    runner = FakeRunner()
    runner.expect("docker", "start")
    runner.expect("docker")
    _settle(runner, pg.checkpoint_settle, tar)
    create, cp_in, start, cp_out, rm = (c.argv for c in runner.calls)
    name = create[create.index("--name") + 1]
    assert create[-5:] == ("sha256:pg", "--single", "-D", "/tmp/data", "template1")
    assert {"--network", "none", "--user", "999", "--entrypoint", "postgres"} <= set(create)
    assert f"{lab.HELPER}=checkpoint-settle" in create and f"{lab.RUN}=run-1" in create
    assert "other=x" not in create
    assert f"{lab.OWNER_PID}={lab.current_owner().labels()[lab.OWNER_PID]}" in create
    assert cp_in == ("docker", "cp", "--archive", "-", f"{name}:/tmp") and runner.calls[1].stdin == tar
    assert start == ("docker", "start", "--attach", name)
    assert cp_out == ("docker", "cp", f"{name}:/tmp/data", "-") and runner.calls[3].stdout_path == tar
    assert rm[:2] == ("docker", "rm") and name in rm and "--volumes" in rm


def test_a_failed_settle_fails_the_checkpoint_and_still_removes_the_helper(tmp_path: Path) -> None:
    tar = _tar(tmp_path / "data.tar")
    runner = FakeRunner()
    runner.expect("docker", "start", rc=1, stderr="FATAL:  could not open file\n")
    runner.expect("docker")
    with pytest.raises(CheckpointError, match="could not open file"):
        _settle(runner, pg.checkpoint_settle, tar)
    assert runner.calls[-1].argv[:2] == ("docker", "rm")
    assert not any(c.argv[:2] == ("docker", "cp") and c.stdout_path for c in runner.calls)


def test_a_kind_without_a_settle_command_runs_nothing(tmp_path: Path) -> None:
    runner = FakeRunner()
    _settle(runner, lambda ctx, copy_dir: None, _tar(tmp_path / "data.tar"))
    assert runner.calls == []
