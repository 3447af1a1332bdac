"""``filesystem_dir``: make a directory in the service hold exactly the seed tree.

Steps: wipe the target (``find T -mindepth 1 -delete``: dotfiles included, argv only, and a failure to
delete anything is loud), ``docker compose cp SEED/. svc:T`` (the ``/.`` copies the contents, not the
directory itself), then verify: the container's listing and file hashes must equal the seed's.
"""

from __future__ import annotations

import posixpath
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from forgelib.errors import CommandError
from forgelib.seeds.base import ApplyContext, Memo, SeedTarget
from forgelib.spec.digest import file_sha256, walk_tree

OPTIONS = frozenset({"target"})
DEFAULT_TARGET = "/workspace"
_SHOWN = 10  # differences listed in an error (the rest are counted)

# path -> sha256 hex for regular files, None for directories and symlinks (present, not hashed)
Listing = dict[str, str | None]


def target_dir(target: SeedTarget) -> str:
    return str(target.options.get("target") or DEFAULT_TARGET)


def check(target: SeedTarget) -> None:
    seed = target.seed
    if not seed.path.is_dir():
        raise target.fail("guard", f"seed {seed.name!r} is not a directory: {seed.path}")
    t = target_dir(target)
    # A wipe of "/" (or of a path that normalises to it) would destroy the container's file system.
    if not t.startswith("/") or posixpath.normpath(t) != t.rstrip("/") or posixpath.normpath(t) == "/":
        raise target.fail("guard", f"target {t!r} must be an absolute, normalised path other than '/'")


def wipe_argv(target: str) -> list[str]:
    return ["find", target, "-mindepth", "1", "-delete"]


def listing_argv(target: str) -> list[str]:
    # Regular files print "sha256  path"; every other entry (directories, symlinks) prints its path.
    files = ["(", "-type", "f", "-exec", "sha256sum", "{}", "+", ")"]
    return ["find", target, "-mindepth", "1", *files, "-o", "-print"]


def apply(ctx: ApplyContext) -> None:
    target = target_dir(ctx).rstrip("/")
    t = ctx.timeouts.recipe
    svc = ctx.service
    try:
        ctx.compose.exec(svc, ["mkdir", "-p", target], timeout=t)
        ctx.compose.exec(svc, wipe_argv(target), timeout=t)
    except CommandError as e:
        raise ctx.fail("wipe", f"could not empty {target}: {e}") from e
    try:
        ctx.compose.cp(f"{ctx.seed.path}/.", f"{svc}:{target}", timeout=t)
    except CommandError as e:
        raise ctx.fail("copy", str(e)) from e
    try:
        out = ctx.compose.exec(svc, listing_argv(target), timeout=t).stdout
    except CommandError as e:
        raise ctx.fail("verify", f"could not list {target}: {e}") from e
    problems = compare(seed_listing(ctx.seed.path, ctx.seed.digest, ctx.memo), parse_listing(out, target))
    if problems:
        raise ctx.fail("verify", f"{target} does not match seed {ctx.seed.name!r}: {problems}")


def seed_listing(root: Path, digest: str, memo: Memo) -> Listing:
    """``host_listing`` once per seed version and ``memo`` owner (a run): hashing every file again on each
    trial would double the per-trial cost of a large seed."""
    return memo.get(("filesystem_dir.listing", root, digest), lambda: host_listing(root))


def host_listing(root: Path) -> Listing:
    """The seed tree as the container listing reports it (symlinks are not followed)."""
    out: Listing = {}
    for path in walk_tree(root):
        rel = path.relative_to(root).as_posix()
        mode = path.lstat().st_mode
        out[rel] = file_sha256(path) if stat.S_ISREG(mode) else None
    return out


def parse_listing(out: str, target: str) -> Listing:
    """Parse ``listing_argv``'s output into paths relative to ``target``."""
    prefix = target.rstrip("/") + "/"
    found: Listing = {}
    for line in out.splitlines():
        if not line:
            continue
        if line.startswith(prefix):  # a non-file entry, printed by -print
            found[line[len(prefix) :]] = None
            continue
        escaped = line.startswith("\\")  # sha256sum escapes names holding '\\' or a newline
        digest, _, name = line.removeprefix("\\").partition(" ")
        name = name[1:] if name[:1] in (" ", "*") else name  # "  name" (text) or " *name" (binary)
        if escaped:
            name = name.replace("\\n", "\n").replace("\\\\", "\\")
        found[name.removeprefix(prefix)] = digest
    return found


def compare(expected: Listing, actual: Listing) -> str:
    """'' when equal, else a short account of what differs."""
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    differ = sorted(p for p in set(expected) & set(actual) if expected[p] != actual[p])
    parts = []
    for label, paths in (("missing", missing), ("unexpected", extra), ("content differs", differ)):
        if paths:
            shown = ", ".join(paths[:_SHOWN])
            more = f" (+{len(paths) - _SHOWN} more)" if len(paths) > _SHOWN else ""
            parts.append(f"{label}: {shown}{more}")
    return "; ".join(parts)


def direct_port(service_config: Mapping[str, Any]) -> int | None:
    return None  # the tree is reached through compose exec/cp
