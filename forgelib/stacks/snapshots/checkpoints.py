"""Where checkpoints live: labelled images on the engine, one per captured service, and a manifest image.

A checkpoint ``ck-<hex>`` is, per captured service, an image built like a golden (``FROM`` the service's
image ID, ``ADD`` the captured directory, the image's ``VOLUME`` at that directory dropped:
``store.unvolumed``) tagged ``forgelib-checkpoint:<id>-<service>``, and one **manifest image** tagged
``forgelib-checkpoint:<id>``: no layers, its labels holding the manifest (source stack, project, seeds and
their digests, every service's image ID, each captured image's ID, path and fingerprint, when, how long)
and the manifest's sha256. The manifest image is written last: a checkpoint is complete (listed, forked,
restored) only once it exists, so a capture cut short never looks like a checkpoint, and ``forge reap``
removes its service images once their owner (labels) is gone.

Before any use (``load``) the manifest is checked against its digest and each service's tag against the
image ID the manifest recorded: an image ID is the digest of the image's config, which names its layers'
content digests, so a checkpoint whose content or images changed since capture is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from forgelib.docker import argv as dk
from forgelib.docker import labels as lab
from forgelib.errors import CommandError, ForgeError
from forgelib.runner import Runner
from forgelib.stacks.snapshots import store
from forgelib.stacks.snapshots.key import canonical

REPOSITORY = "forgelib-checkpoint"
CHECKPOINT = "io.forgelib.checkpoint"  # the checkpoint's id: on its manifest and on every service image
PREFIX = CHECKPOINT + "."
MANIFEST = PREFIX + "manifest"  # canonical JSON (the manifest image only)
DIGEST = PREFIX + "digest"  # sha256 hex of MANIFEST's text
SERVICE = PREFIX + "service"  # a service image's service
# On a manifest image: the checkpoint belongs to a run (a task's setup), not to the user. The run removes it
# as it ends; once its owner is gone, ``forge reap`` (also ``--run``) does, as with an incomplete one.
SCOPE = PREFIX + "scope"
RUN_SCOPE = "run"
FORMAT = 2  # bump when what a checkpoint holds or how it is restored changes
_ID = re.compile(r"^ck-[0-9a-f]{12}$")
_ID_PREFIX = re.compile(r"^ck-[0-9a-f]{12}")


class CheckpointError(ForgeError):
    """A checkpoint that is unknown, incomplete or changed since capture: refused."""


def new_id() -> str:
    return f"ck-{secrets.token_hex(6)}"


def tag_of(checkpoint_id: str, service: str | None = None) -> str:
    return f"{REPOSITORY}:{checkpoint_id}" + (f"-{service}" if service else "")


@dataclass(frozen=True)
class Checkpoint:
    """A complete, verified checkpoint: its id, its manifest and the manifest image's ID."""

    id: str
    manifest: Mapping[str, Any]
    image: str

    @property
    def services(self) -> Mapping[str, Mapping[str, Any]]:
        """service -> {image, base, path, kind, seed, seed_digest, fingerprint, recipe_version}: each
        captured service."""
        out: Mapping[str, Mapping[str, Any]] = self.manifest.get("services") or {}
        return out

    @property
    def images(self) -> Mapping[str, str]:
        """service -> the image ID every service of the source stack ran at capture."""
        out: Mapping[str, str] = self.manifest.get("images") or {}
        return out

    @property
    def created(self) -> str:
        return str(self.manifest.get("created", ""))

    def record(self) -> dict[str, Any]:
        """As ``forge checkpoint --json`` and ``forge snapshots ls --json`` show it."""
        return {"id": self.id, "image": self.image, **dict(self.manifest)}


def build_service_image(
    runner: Runner,
    *,
    checkpoint_id: str,
    service: str,
    base_image: str,
    path: str,
    data_tar: Path,
    labels: Mapping[str, str],
    timeout: float,
) -> str:
    """The image of one captured service (``FROM base_image``, ``ADD`` the tar of ``path`` from ``docker
    cp``, no ``VOLUME`` at ``path``), tagged ``tag_of(id, service)``; its ID."""
    parent = str(Path(path).parent)
    pairs = " ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in labels.items())
    lines = [f"FROM {base_image}", f"ADD {data_tar.name} {parent.rstrip('/')}/", f"LABEL {pairs}"]
    (data_tar.parent / "Dockerfile").write_text("\n".join(lines) + "\n")
    res = runner.run(
        dk.build(str(data_tar.parent), quiet=True, force_rm=True),
        timeout=timeout,
        env={"DOCKER_BUILDKIT": "0"},
        tag="build",
    )
    built = (res.stdout.strip().splitlines() or [""])[-1].strip()
    if not built.startswith("sha256:"):
        raise CommandError(res.argv, res.rc, res.stdout, res.stderr, reason="printed no image ID")
    tag = tag_of(checkpoint_id, service)
    try:
        store.unvolumed(runner, built, tag, path, data_tar.parent, timeout)
        loaded = True
    except ForgeError:  # an engine refusing the config-only load: the built image, VOLUME and all
        runner.run(dk.tag(built, tag), timeout=timeout, tag="build")
        loaded = False
    if loaded:
        runner.run(dk.rm([built], kind="image"), timeout=timeout, check=False)
    return image_id(runner, tag, timeout)


def write_manifest(
    runner: Runner,
    checkpoint_id: str,
    manifest: Mapping[str, Any],
    build: Path,
    timeout: float,
    extra: Mapping[str, str] | None = None,
) -> Checkpoint:
    """The manifest image, last: from here on the checkpoint is complete. ``extra``: more labels (a run's
    checkpoint: ``run_scoped``)."""
    text = canonical(dict(manifest))
    labels = {
        lab.MANAGED: "true",
        **lab.current_owner().labels(),
        **(extra or {}),
        CHECKPOINT: checkpoint_id,
        MANIFEST: text,
        DIGEST: hashlib.sha256(text.encode()).hexdigest(),
    }
    pairs = " ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in labels.items())
    build.mkdir(parents=True, exist_ok=True)
    (build / "Dockerfile").write_text(f"FROM scratch\nLABEL {pairs}\n")
    runner.run(
        dk.build(str(build), quiet=True, tag=tag_of(checkpoint_id)),
        timeout=timeout,
        env={"DOCKER_BUILDKIT": "0"},
        tag="build",
    )
    return load(runner, checkpoint_id, timeout)


def service_labels(checkpoint_id: str, service: str, run_id: str | None = None) -> dict[str, str]:
    """A service image's labels: forge's, its owner's, and the source stack's run (so that ``forge reap
    --run`` finds what a capture cut short left of that run's stack)."""
    run = {lab.RUN: run_id} if run_id else {}
    return {
        lab.MANAGED: "true",
        **lab.current_owner().labels(),
        **run,
        CHECKPOINT: checkpoint_id,
        SERVICE: service,
    }


def run_scoped(run_id: str) -> dict[str, str]:
    """A run's own checkpoint's manifest labels: its run, and ``SCOPE`` (see there)."""
    return {lab.RUN: run_id, SCOPE: RUN_SCOPE}


def image_id(runner: Runner, ref: str, timeout: float) -> str:
    res = runner.run(dk.inspect([ref], kind="image", format="{{.Id}}"), timeout=timeout, check=False)
    return res.stdout.strip() if res.rc == 0 else ""


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------------- lookup


def load(runner: Runner, checkpoint_id: str, timeout: float = 60.0) -> Checkpoint:
    """The complete checkpoint ``checkpoint_id``, verified: its manifest matches its digest, and every
    captured service's image is the one the manifest recorded. ``CheckpointError`` otherwise."""
    if not _ID.match(checkpoint_id):
        raise CheckpointError(f"{checkpoint_id!r} is not a checkpoint id (ck- and 12 hex digits)")
    res = runner.run(dk.inspect([tag_of(checkpoint_id)], kind="image"), timeout=timeout, check=False)
    found = json.loads(res.stdout or "[]") if res.rc == 0 else []
    if not found:
        raise CheckpointError(
            f"no checkpoint {checkpoint_id} on this engine (`forge snapshots ls` lists the checkpoints)"
        )
    info = found[0]
    labels = lab.of_inspect(info)
    text = labels.get(MANIFEST, "")
    if labels.get(CHECKPOINT) != checkpoint_id or hashlib.sha256(text.encode()).hexdigest() != labels.get(
        DIGEST
    ):
        raise CheckpointError(f"checkpoint {checkpoint_id}: its manifest does not match its digest (changed)")
    manifest = json.loads(text)
    ck = Checkpoint(checkpoint_id, manifest, str(info.get("Id", "")))
    for service, rec in sorted(ck.services.items()):
        got = image_id(runner, tag_of(checkpoint_id, service), timeout)
        if got != rec.get("image"):
            why = "is missing" if not got else f"is {got[:19]}, not the captured {str(rec.get('image'))[:19]}"
            raise CheckpointError(
                f"checkpoint {checkpoint_id}: the image of service {service!r} {why} (changed since capture);"
                f" remove it with `forge snapshots prune --checkpoint {checkpoint_id}`"
            )
    return ck


def list_checkpoints(runner: Runner, timeout: float = 60.0) -> list[Checkpoint | str]:
    """Every checkpoint on the engine, oldest first: a ``Checkpoint`` when complete and verified, else
    its id (incomplete, or changed since capture)."""
    ids = _ids(runner, timeout)
    out: list[Checkpoint | str] = []
    for cid in sorted(ids):
        try:
            out.append(load(runner, cid, timeout))
        except CheckpointError:
            out.append(cid)
    return sorted(out, key=lambda c: c.created if isinstance(c, Checkpoint) else "")


def _ids(runner: Runner, timeout: float) -> set[str]:
    """Every checkpoint id a tag of ``REPOSITORY`` names (a manifest's, or a service image's)."""
    res = runner.run(dk.ls("image", format="{{.Tag}}", filters=[REPOSITORY]), timeout=timeout)
    return {m.group(0) for line in res.stdout.splitlines() if (m := _ID_PREFIX.match(line.strip()))}


def remove(runner: Runner, checkpoint_id: str, timeout: float = 120.0) -> str | None:
    """Remove ``checkpoint_id``: its manifest tag first (it is then no longer complete), every tag of its
    service images, and its images no tag names any more. An image is only untagged, never forced: one a
    fork's container runs stays until that container goes (``forge reap``, ``prune`` again), and a tag
    moved onto another image (a changed checkpoint) takes nothing of that image's. The reason when some
    stay."""
    res = runner.run(dk.ls("image", format="{{.Tag}}", filters=[REPOSITORY]), timeout=timeout)
    tags = sorted({t.strip() for t in res.stdout.splitlines() if t.strip().startswith(checkpoint_id)})
    refs = [f"{REPOSITORY}:{t}" for t in sorted(tags, key=lambda t: t != checkpoint_id)]
    said = []
    for ref in refs:
        r = runner.run(dk.rm([ref], kind="image"), timeout=timeout, check=False)
        if r.rc != 0 and "No such image" not in r.stderr:
            said.append((r.stderr.strip().splitlines() or [f"rc={r.rc}"])[-1])
    left = runner.run(
        dk.ls(
            "image",
            quiet=True,
            no_trunc=True,
            filters=["--filter", f"label={CHECKPOINT}={checkpoint_id}", "--filter", "dangling=true"],
        ),
        timeout=timeout,
    )
    for iid in sorted({i.strip() for i in left.stdout.splitlines() if i.strip()}):
        r = runner.run(dk.rm([iid], kind="image"), timeout=timeout, check=False)
        if r.rc != 0 and "No such image" not in r.stderr:
            said.append((r.stderr.strip().splitlines() or [f"rc={r.rc}"])[-1])
    return "; ".join(said) or None
