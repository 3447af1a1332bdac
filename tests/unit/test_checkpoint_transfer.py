"""A run's checkpoint copied to another engine (``forge run --cluster`` with a task's ``setup:``): the
archive leaves out the base images' layers, a copy that cannot be loaded is still removed as the run ends,
and ``forge reap`` judges a copy's service images by the process that loaded it (its manifest image)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from forgelib.docker import labels as lab
from forgelib.errors import ForgeError
from forgelib.spec.models import Timeouts
from forgelib.stacks import reaper as custody
from forgelib.stacks.runcheckpoints import RunCheckpoints
from forgelib.stacks.snapshots import checkpoints as ckstore
from forgelib.stacks.snapshots import transfer
from forgelib.stacks.snapshots.key import canonical
from forgelib.testing import ANY, FakeRunner

CK = "ck-aaaaaaaaaaaa"
ME = lab.current_owner().labels()
DEAD = {**ME, lab.OWNER_PID: "999999"}


def _saved(path: Path) -> None:
    """A ``docker save`` archive of one image whose first two layers are its base's, the third its own."""
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": ["sha256:b1", "sha256:b2", "sha256:own"]}})
    manifest = [
        {"Config": "c.json", "RepoTags": ["x:y"], "Layers": ["l1/layer.tar", "l2/layer.tar", "l3/layer.tar"]}
    ]
    files = {"manifest.json": json.dumps(manifest), "c.json": config, "repositories": "{}"}
    files |= {f"l{i}/layer.tar": f"layer {i}" for i in (1, 2, 3)} | {f"l{i}/json": "{}" for i in (1, 2, 3)}
    with tarfile.open(path, "w") as t:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            t.addfile(info, io.BytesIO(text.encode()))


def test_the_archive_leaves_out_the_layers_of_the_base_images(tmp_path: Path) -> None:
    _saved(tmp_path / "full.tar")
    transfer._thin(tmp_path / "full.tar", tmp_path / "thin.tar", {"sha256:b1", "sha256:b2"})
    with tarfile.open(tmp_path / "thin.tar") as t:
        names = set(t.getnames())
        own = t.extractfile("l3/layer.tar")
        assert own is not None and own.read() == b"layer 3"
    assert "l1/layer.tar" not in names and "l2/layer.tar" not in names
    assert {"manifest.json", "c.json", "l1/json", "l3/layer.tar"} <= names


def _ctx(runner: FakeRunner) -> Any:
    class Ctx:
        pass

    ctx = Ctx()
    ctx.runner, ctx.timeouts = runner, Timeouts()  # type: ignore[attr-defined]
    return ctx


def test_a_copy_the_engine_refuses_is_named_and_still_removed_when_the_run_ends(tmp_path: Path) -> None:
    r = FakeRunner()
    r.expect(
        "docker", "load", rc=1, stderr="open /var/lib/docker/tmp/l1/layer.tar: no such file or directory\n"
    )
    copy = transfer.CheckpointCopy(CK, {"images": {"db": "sha256:pg"}}, b"archive")
    taken = RunCheckpoints()
    with pytest.raises(ForgeError, match=r"could not be loaded on this engine.*same image IDs.*sha256:pg"):
        taken.adopt(_ctx(r), copy, "run-1", tmp_path)
    assert not list(tmp_path.iterdir())  # the archive went
    # the run's end removes whatever the load left of it
    r.expect("docker", "image", "ls", "--format", "{{.Tag}}", ckstore.REPOSITORY, stdout=f"{CK}-db\n")
    r.expect("docker", "image", "rm", ckstore.tag_of(CK, "db"))
    r.expect("docker", "image", "ls", "--quiet", "--no-trunc", ANY, ANY, ANY, ANY, stdout="")
    taken.finish(_ctx(r))
    assert ("docker", "image", "rm", ckstore.tag_of(CK, "db")) in r.argvs()


def _image(iid: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"Id": iid, "Config": {"Labels": {lab.MANAGED: "true", lab.RUN: "run-1", **labels}}}


@pytest.mark.parametrize("loader", ["gone", "alive"])
def test_reap_judges_a_copied_checkpoints_images_by_the_process_that_loaded_it(loader: str) -> None:
    """The service image keeps the capturing process's owner (alive, on the other node); the manifest
    image names the process that loaded the copy here: the copy goes once that one is gone."""
    text = canonical({"services": {"db": {"image": "sha256:db"}}})
    manifest = _image(
        "sha256:man",
        {
            **(DEAD if loader == "gone" else ME),
            **ckstore.run_scoped("run-1"),
            ckstore.CHECKPOINT: CK,
            ckstore.MANIFEST: text,
            ckstore.DIGEST: hashlib.sha256(text.encode()).hexdigest(),
        },
    )
    db = _image("sha256:db", {**ME, ckstore.CHECKPOINT: CK, ckstore.SERVICE: "db"})
    r = FakeRunner()
    cp = f"label={ckstore.CHECKPOINT}"
    r.expect("docker", "image", "ls", "--quiet", "--no-trunc", ANY, ANY, ANY, ANY, "--filter", cp, exact=True,
             stdout="sha256:man\nsha256:db\n")  # fmt: skip
    mf = f"label={ckstore.MANIFEST}"
    r.expect("docker", "image", "ls", "--quiet", "--no-trunc", ANY, ANY, "--filter", mf, exact=True,
             stdout="sha256:man\n")  # fmt: skip
    r.expect("docker", "image", "inspect", "sha256:db", "sha256:man", stdout=json.dumps([db, manifest]))
    r.expect("docker", "image", "inspect", "sha256:man", "sha256:db", stdout=json.dumps([manifest, db]))
    r.expect("docker", "image", "rm", stdout="")
    r.expect("docker", ANY, ANY, ANY, stdout="")
    facts = custody.HostFacts(
        ME[lab.OWNER_HOST],
        ME[lab.OWNER_BOOT_ID],
        lambda pid: None if pid == 999999 else ME[lab.OWNER_START_TIME],
    )
    custody.reap(r, run_id="run-1", facts=facts)
    removed = {a[3] for a in r.argvs() if a[:3] == ("docker", "image", "rm")}
    assert removed == ({"sha256:man", "sha256:db"} if loader == "gone" else set())
