"""The checkpoints in ``forge snapshots ls | prune``: what is on the engine, and which of it prune removes.

A checkpoint is found by its tags (``checkpoints.list_checkpoints``) and by its images' labels (a capture
cut short may have left an image no tag names yet). It is one of: **complete** (its manifest image exists
and every image is the one recorded), **changed** (a manifest, but something differs from the capture:
no fork or restore will use it) or **incomplete** (no manifest: a capture cut short, or one still running).
Prune removes a checkpoint whole (``checkpoints.remove``: its manifest and every service image).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from forgelib.docker import argv as dk
from forgelib.docker import labels as lab
from forgelib.runner import Runner
from forgelib.stacks import reaper as custody
from forgelib.stacks.snapshots import checkpoints as ckstore
from forgelib.table import align

State = Literal["complete", "changed", "incomplete"]


@dataclass(frozen=True)
class Found:
    """One checkpoint id on the engine: every image labelled with it (``docker image inspect``), its
    manifest when a manifest image exists (unverified when ``state`` is ``changed``)."""

    id: str
    state: State
    manifest: Mapping[str, Any]
    images: tuple[Mapping[str, Any], ...]

    @property
    def project(self) -> str:
        return str(self.manifest.get("project", ""))

    @property
    def created(self) -> datetime | None:
        when = str(self.manifest.get("created", "")) or min(
            (str(i.get("Created", "")) for i in self.images), default=""
        )
        return _parse_time(when)


def _parse_time(text: str) -> datetime | None:
    head = text.rstrip("Z").partition(".")[0]  # Docker prints nanoseconds; the manifest whole seconds
    try:
        return datetime.fromisoformat(head).replace(tzinfo=UTC)
    except ValueError:
        return None


def find(runner: Runner, project: str | None = None, timeout: float = 60.0) -> list[Found]:
    """Every checkpoint on the engine, oldest first; with ``project``, only the ones captured for it (an
    incomplete one has no manifest naming its project: it is left to an unscoped prune and ``forge reap``)."""
    listed = ckstore.list_checkpoints(runner, timeout)
    verified = {c.id: c for c in listed if isinstance(c, ckstore.Checkpoint)}
    flt = ["--filter", f"label={ckstore.CHECKPOINT}"]
    ids = runner.run(dk.ls("image", quiet=True, no_trunc=True, filters=flt), timeout=timeout).stdout.split()
    infos: list[Mapping[str, Any]] = []
    if ids:
        res = runner.run(dk.inspect(sorted(set(ids)), kind="image"), timeout=timeout, check=False)
        infos = json.loads(res.stdout or "[]")
    by_id: dict[str, list[Mapping[str, Any]]] = {}
    for info in infos:
        cid = lab.of_inspect(dict(info)).get(ckstore.CHECKPOINT)
        if cid:
            by_id.setdefault(cid, []).append(info)
    for c in listed:  # a tag whose image lost its labels (a changed checkpoint) still names the id
        by_id.setdefault(c if isinstance(c, str) else c.id, [])
    out = []
    for cid, images in by_id.items():
        manifest_text = next(
            (t for i in images if (t := lab.of_inspect(dict(i)).get(ckstore.MANIFEST))), None
        )
        if cid in verified:
            state: State = "complete"
            manifest: Mapping[str, Any] = verified[cid].manifest
        else:
            state = "changed" if manifest_text is not None else "incomplete"
            manifest = _loads(manifest_text)
        found = Found(cid, state, manifest, tuple(images))
        if project is None or found.project == project:
            out.append(found)
    return sorted(out, key=lambda f: f.created or datetime.min.replace(tzinfo=UTC))


def _loads(text: str | None) -> Mapping[str, Any]:
    try:
        got = json.loads(text) if text else {}
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


# --------------------------------------------------------------------------------------------------- ls


def sizes(runner: Runner, found: Sequence[Found], timeout: float = 60.0) -> dict[str, int]:
    """image ID -> size in bytes, for every image of ``found`` and every base image their manifests name
    (those gone from the engine are simply absent)."""
    ids = {str(i.get("Id", "")) for f in found for i in f.images}
    ids |= {str(s.get("base", "")) for f in found for s in (f.manifest.get("services") or {}).values()}
    ids.discard("")
    if not ids:
        return {}
    res = runner.run(
        dk.inspect(sorted(ids), kind="image", format="{{.Id}} {{.Size}}"), timeout=timeout, check=False
    )
    rows = (line.split() for line in res.stdout.splitlines())
    return {r[0]: int(r[1]) for r in rows if len(r) == 2 and r[1].isdigit()}


def captured_bytes(f: Found, size: Mapping[str, int]) -> int:
    """What the checkpoint adds on the engine: each service image's size beyond the image it was built
    on (its captured directory), or its whole size where that base is unknown or gone."""
    services = f.manifest.get("services") or {}
    total = 0
    for info in f.images:
        labels = lab.of_inspect(dict(info))
        if ckstore.SERVICE not in labels:
            continue  # the manifest image: labels only, no layers
        own = size.get(str(info.get("Id", "")), 0)
        base = size.get(str((services.get(labels[ckstore.SERVICE]) or {}).get("base", "")))
        total += max(own - base, 0) if base is not None else own
    return total


def describe(f: Found, size: Mapping[str, int], now: datetime | None = None) -> dict[str, Any]:
    """One checkpoint as ``forge snapshots ls --json`` shows it."""
    now = now or datetime.now(UTC)
    created = f.created
    return {
        "type": "checkpoint",
        "id": f.id,
        "state": f.state,
        "source": str(f.manifest.get("source", "")),
        "project": f.project,
        "services": _services(f),
        "bytes": captured_bytes(f, size),
        "created": created.strftime("%Y-%m-%dT%H:%M:%SZ") if created else None,
        "age_days": round((now - created).total_seconds() / 86400, 2) if created else None,
    }


def render_ls(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    if not rows:
        return ["no checkpoints on this engine"]
    table = [("CHECKPOINT", "STATE", "SOURCE STACK", "PROJECT", "SERVICES", "SIZE", "AGE")]
    for r in rows:
        table.append(
            (
                r["id"], r["state"], r["source"] or "?", r["project"] or "?", ",".join(r["services"]) or "-",
                f"{r['bytes'] / 1e6:.1f} MB", _age(r["age_days"]),
            )
        )  # fmt: skip
    lines = align(table)
    lines.append(f"{len(rows)} checkpoint(s), {sum(r['bytes'] for r in rows) / 1e6:.1f} MB of captured data")
    return lines


def _age(days: float | None) -> str:
    if days is None:
        return "?"
    return f"{days * 24:.1f} h" if days < 2 else f"{days:.1f} d"


# ------------------------------------------------------------------------------------------------ prune


def select(
    f: Found,
    *,
    all: bool,
    older_than: float | None,
    unused: bool,
    checkpoint: str | None,
    present: set[str],
    now: datetime,
) -> str | None:
    """Why ``prune`` removes ``f`` with these options, or None (pure: unit-tested)."""
    if checkpoint is not None:
        return "--checkpoint" if f.id == checkpoint else None
    if f.state == "incomplete":
        return "incomplete (no manifest: a capture cut short)"
    if f.state == "changed":
        return "changed since capture (no fork or restore uses it)"
    if all:
        return "--all"
    created = f.created
    if older_than is not None and created is not None and now - created > timedelta(days=older_than):
        return f"taken {(now - created).total_seconds() / 86400:.1f} days ago"
    if unused:
        images: Mapping[str, str] = f.manifest.get("images") or {}
        gone = sorted(svc for svc, iid in images.items() if iid not in present)
        if gone:
            return f"no tag names the image service {gone[0]!r} ran at capture any more (a fork is refused)"
    return None


def in_flight(f: Found, facts: custody.HostFacts) -> str | None:
    """Why an incomplete checkpoint must stay, or None: no manifest is also what a capture still running
    looks like, so it goes only once the process that took it is provably gone (the reaper's rule)."""
    if f.state != "incomplete" or not f.images:
        return None
    images = tuple(
        custody.Resource("image", str(i.get("Id", "")), f"checkpoint {f.id}", lab.of_inspect(dict(i)))
        for i in f.images
    )
    d = custody.decide(custody.FoundProject(f.id, images), facts)
    return None if d.remove else f"incomplete, but may be a capture in flight: {d.reason}"


def prune(
    runner: Runner,
    *,
    all: bool,
    older_than: float | None,
    unused: bool,
    checkpoint: str | None = None,
    project: str | None = None,
    facts: custody.HostFacts | None = None,
    present: set[str] | None = None,
) -> list[dict[str, Any]]:
    """Remove the checkpoints these options select, each whole; one row per checkpoint selected."""
    found = find(runner, project=project)
    if checkpoint is not None and checkpoint not in {f.id for f in found}:
        raise ckstore.CheckpointError(
            f"no checkpoint {checkpoint} on this engine (`forge snapshots ls` lists the checkpoints)"
        )
    if present is None:
        wanted = {iid for f in found for iid in (f.manifest.get("images") or {}).values()}
        present = _tagged(runner, wanted) if unused else set()
    now = datetime.now(UTC)
    facts = facts or custody.local_facts()
    out = []
    for f in found:
        why = select(
            f, all=all, older_than=older_than, unused=unused, checkpoint=checkpoint, present=present, now=now
        )
        if why is None:
            continue
        row = {"type": "checkpoint", "key": f.id, "id": f.id, "service": ",".join(_services(f)), "why": why}
        held = in_flight(f, facts)
        if held is not None:
            out.append({**row, "action": "kept", "error": held})
            continue
        err = ckstore.remove(runner, f.id)
        if err is None:
            out.append({**row, "action": "removed"})
        else:
            in_use = "is using" in err or "in use" in err  # a fork's container runs it: untagged, it stays
            out.append({**row, "action": "kept" if in_use else "failed", "error": err})
    return out


def _services(f: Found) -> list[str]:
    return sorted(f.manifest.get("services") or {}) or sorted(
        s for i in f.images if (s := lab.of_inspect(dict(i)).get(ckstore.SERVICE))
    )


def _tagged(runner: Runner, ids: set[str]) -> set[str]:
    """The ids among ``ids`` some tag still names."""
    if not ids:
        return set()
    res = runner.run(dk.inspect(sorted(ids), kind="image", format="{{.Id}} {{len .RepoTags}}"), check=False)
    rows = (line.split() for line in res.stdout.splitlines())
    return {r[0] for r in rows if len(r) == 2 and r[1] != "0"}
