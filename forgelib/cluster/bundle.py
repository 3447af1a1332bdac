"""A project shipped to a cluster node by content: one tar of the project directory, put in Ray's object
store once per run, unpacked on the node (once per digest per slot: ``slot``), and each seed's digest
re-verified there before a recipe applies it (the driver's verified digests travel beside the bytes).

No Ray here: the bundle is plain bytes, so this module is unit-tested on its own.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from forgelib.errors import ForgeError
from forgelib.spec.digest import DigestError, seed_digest
from forgelib.spec.models import Project

# Never shipped: results of earlier runs and caches (they can be large and no trial reads them).
_SKIP_DIRS = frozenset({".git", "__pycache__", ".venv", ".nox", ".mypy_cache", ".pytest_cache"})


@dataclass(frozen=True)
class Bundle:
    data: bytes  # a gzip'd tar of the project directory
    sha256: str  # of ``data``: a node refuses bytes that changed on the way
    project_file: str  # project.yaml, relative to the tar's root
    seeds: Mapping[str, str] = field(default_factory=dict)  # seed name -> the digest the driver verified


def pack(project: Project, exclude: Iterable[Path] = ()) -> Bundle:
    """The project's directory as one tar; everything a trial reads must live inside it."""
    root = project.root.resolve()
    _require_inside(project, root)
    skip = {p.resolve() for p in exclude}
    buf = io.BytesIO()
    # The same project packs to the same bytes (gzip's header time fixed; members sorted, owners blanked):
    # a slot keeps a project unpacked and verified per digest, so a later run of an unchanged project
    # starts its trials without unpacking, loading and verifying it again on every slot.
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        tar.add(root, arcname=".", recursive=True, filter=lambda ti: _keep(ti, root, skip))
    data = buf.getvalue()
    return Bundle(
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
        project_file=project.path.resolve().relative_to(root).as_posix(),
        seeds={name: seed.digest for name, seed in project.seeds.items()},
    )


def _keep(ti: tarfile.TarInfo, root: Path, skip: set[Path]) -> tarfile.TarInfo | None:
    path = (root / ti.name).resolve() if not ti.issym() else root / ti.name
    if Path(ti.name).name in _SKIP_DIRS or path in skip:
        return None
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def _require_inside(project: Project, root: Path) -> None:
    """A compose file or oracle script outside the project directory would not reach the node."""
    outside: list[str] = []
    for task in project.tasks:
        paths = [task.environment.compose_file, task.path]
        if task.oracle is not None and task.oracle.script is not None:
            paths.append(task.oracle.script)
        if task.grading is not None:
            paths.append(task.grading.path)
        for p in paths:
            if not p.resolve().is_relative_to(root):
                outside.append(f"{p} (task {task.name})")
    if outside:
        raise ForgeError(
            f"{project.path}: --cluster ships the project directory {root} to the nodes, but these files "
            f"are outside it: {', '.join(sorted(set(outside)))}; move them into the project directory"
        )


def unpack(bundle: Bundle, dest: Path) -> Path:
    """Extract ``bundle`` into the empty directory ``dest``; returns its project.yaml."""
    actual = hashlib.sha256(bundle.data).hexdigest()
    if actual != bundle.sha256:
        raise ForgeError(f"the project bundle arrived corrupted (sha256 {actual}, sent {bundle.sha256})")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")  # no absolute paths, no links out, no devices
    return dest / bundle.project_file


def verify_seeds(project: Project, expected: Mapping[str, str]) -> None:
    """Every seed on the node hashes to the digest the driver verified, before any recipe applies it."""
    problems: list[str] = []
    for name, want in sorted(expected.items()):
        seed = project.seeds.get(name)
        if seed is None:
            problems.append(f"seed {name!r} is missing from the shipped project")
            continue
        try:
            got = seed_digest(seed.path, seed.kind)
        except DigestError as e:
            problems.append(str(e))
            continue
        if got != want:
            problems.append(f"seed {name!r} hashes to {got} on this node, the driver verified {want}")
    if problems:
        raise ForgeError("shipped seeds failed verification on the node: " + "; ".join(problems))


__all__ = ["Bundle", "pack", "unpack", "verify_seeds"]
