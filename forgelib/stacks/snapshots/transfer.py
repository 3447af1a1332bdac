"""A checkpoint moved from one engine to another (a cluster run's setup: ``forgelib.cluster``).

``pack`` writes the checkpoint's service images as one ``docker save`` archive *less the layers of their
base images*: every engine that runs the task's trials has those (the service's image, by the same image
ID: a fork refuses other images anyway), and ``docker load`` reads no layer the engine already has, so
what travels is the captured directories' layers only. The manifest travels beside the archive as its
text. ``unpack`` loads the images on the other engine and writes the manifest image there last, by the
loading process (its owner labels: ``forge reap`` on that engine judges the copy by the process that
loaded it), then verifies the whole as any checkpoint is before use (``checkpoints.load``: the manifest
against its digest, each service image against the image ID the manifest recorded, which ``docker
save``/``load`` preserve). An engine missing a base image refuses the load: the error names it.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgelib.docker import argv as dk
from forgelib.errors import ForgeError
from forgelib.runner import Runner
from forgelib.stacks.snapshots import checkpoints as ckstore
from forgelib.stacks.snapshots.checkpoints import Checkpoint


@dataclass(frozen=True)
class CheckpointCopy:
    """What crosses to another engine: the checkpoint's id, its manifest, the thin archive's bytes."""

    id: str
    manifest: Mapping[str, Any]
    archive: bytes

    @property
    def size(self) -> int:
        return len(self.archive)


def pack(runner: Runner, ck: Checkpoint, workdir: Path, timeout: float) -> CheckpointCopy:
    """``ck`` (verified) as a ``CheckpointCopy``: its service images saved without their bases' layers."""
    tags = [ckstore.tag_of(ck.id, s) for s in sorted(ck.services)]
    workdir.mkdir(parents=True, exist_ok=True)
    full, thin = workdir / f"{ck.id}.tar", workdir / f"{ck.id}.thin.tar"
    try:
        runner.run(dk.save(tags, output=str(full)), timeout=timeout, tag="build")
        base_layers = {_diff_ids(runner, str(rec.get("base", "")), timeout) for rec in ck.services.values()}
        _thin(full, thin, {d for layers in base_layers for d in layers})
        return CheckpointCopy(ck.id, dict(ck.manifest), thin.read_bytes())
    finally:
        full.unlink(missing_ok=True)
        thin.unlink(missing_ok=True)


def unpack(
    runner: Runner, copy: CheckpointCopy, workdir: Path, timeout: float, labels: Mapping[str, str]
) -> Checkpoint:
    """Load ``copy`` on this engine, its manifest image written by this process with ``labels`` (a run's:
    ``checkpoints.run_scoped``); the checkpoint, verified. ``CheckpointError`` when it does not verify."""
    workdir.mkdir(parents=True, exist_ok=True)
    archive = workdir / f"{copy.id}.thin.tar"
    try:
        archive.write_bytes(copy.archive)
        res = runner.run(dk.load(quiet=True, input=str(archive)), timeout=timeout, check=False, tag="build")
        if res.rc != 0:
            why = (res.stderr.strip().splitlines() or [f"rc={res.rc}"])[-1]
            raise ForgeError(
                f"checkpoint {copy.id} could not be loaded on this engine ({why}); every node must have "
                f"the task's images, by the same image IDs (the images the manifest names: "
                f"{', '.join(sorted(set((copy.manifest.get('images') or {}).values())))})"
            )
    finally:
        archive.unlink(missing_ok=True)
    return ckstore.write_manifest(
        runner, copy.id, copy.manifest, workdir / f"{copy.id}-manifest", timeout, extra=labels
    )


def _diff_ids(runner: Runner, image: str, timeout: float) -> tuple[str, ...]:
    """The layer diff IDs of ``image`` on this engine (none when it is not here: nothing is left out)."""
    if not image:
        return ()
    res = runner.run(dk.inspect([image], kind="image"), timeout=timeout, check=False)
    found = json.loads(res.stdout or "[]") if res.rc == 0 else []
    return tuple((found[0].get("RootFS") or {}).get("Layers") or ()) if found else ()


def _thin(src: Path, dest: Path, skip: set[str]) -> None:
    """Copy the ``docker save`` archive ``src`` to ``dest`` without the layer files whose diff ID (read
    from each image's config, in the manifest's layer order) is in ``skip``."""
    with tarfile.open(src) as t:
        manifest = json.loads(_read(t, "manifest.json"))
        drop: set[str] = set()
        keep: set[str] = set()
        for entry in manifest:
            diff_ids = json.loads(_read(t, entry["Config"]))["rootfs"]["diff_ids"]
            for path, diff in zip(entry["Layers"], diff_ids, strict=True):
                (drop if diff in skip else keep).add(path)
        drop -= keep  # a layer file another image needs stays
        with tarfile.open(dest, "w") as out:
            for m in t.getmembers():
                if m.name in drop:
                    continue
                out.addfile(m, t.extractfile(m) if m.isfile() else None)


def _read(t: tarfile.TarFile, name: str) -> bytes:
    f = t.extractfile(name)
    if f is None:
        raise ForgeError(f"docker save wrote an archive without {name}")
    return f.read()


__all__ = ["CheckpointCopy", "pack", "unpack"]
