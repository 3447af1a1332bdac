"""``filesystem_dir``: make a directory in the service hold exactly the seed tree.

Steps: wipe the target (``find T -mindepth 1 -delete``: dotfiles included, argv only, and a failure to
delete anything is loud), ``docker compose cp SEED/. svc:T`` (the ``/.`` copies the contents, not the
directory itself), then verify: the container's listing and file hashes must equal the seed's.
"""

from __future__ import annotations

import hashlib
import posixpath
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import CommandError
from forgelib.kinds import checkpointcopy
from forgelib.kinds.base import (
    ApplyContext,
    CheckpointCopy,
    Fingerprint,
    Memo,
    SeedTarget,
    fingerprint_part,
    no_golden,
    no_mount,
    no_settle,
    no_warm_process,
    reset_after,
)
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
    _copy_and_verify(ctx, target)


def _copy_and_verify(ctx: ApplyContext, target: str) -> None:
    t = ctx.timeouts.recipe
    svc = ctx.service
    try:
        ctx.compose.cp(f"{ctx.seed.path}/.", f"{svc}:{target}", timeout=t)
    except CommandError as e:
        raise ctx.fail("copy", str(e)) from e
    try:
        out = ctx.compose.exec(svc, listing_argv(target), timeout=t).stdout
    except CommandError as e:
        raise ctx.fail("verify", f"could not list {target}: {e}") from e
    _verify(ctx, target, out)


def _verify(ctx: ApplyContext, target: str, out: str) -> None:
    """``out`` (``listing_argv``'s) must list exactly the seed's entries, each file with the seed's hash."""
    problems = compare(seed_listing(ctx.seed.path, ctx.seed.digest, ctx.memo), parse_listing(out, target))
    if problems:
        raise ctx.fail("verify", f"{target} does not match seed {ctx.seed.name!r}: {problems}")


def seed_tar(root: Path, dest: Path) -> Path:
    """The seed tree as ``docker cp SEED/. svc:T`` puts it in a container: every entry below ``root`` (not
    ``root`` itself) with its mode, mtime and link target, owned by root (``docker cp`` without ``-a``)."""

    def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in walk_tree(root):
            tar.add(path, arcname=path.relative_to(root).as_posix(), recursive=False, filter=as_root)
    return dest


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


def direct_port(service_config: ServiceConfig) -> int | None:
    return None  # the tree is reached through compose exec/cp


# ---------------------------------------------------------------------------------------------- warm
#
# prepare keeps nothing in the service: the pristine tree is the seed itself, on the host, and prepare
# only notes the target directory's own mode and owner (on the host too). reset is ``apply`` again from
# there (one exec puts the target's mode and owner back and empties it, dotfiles, new directories and all;
# the seed is copied in; every file's sha256 verified against the seed's): what a fresh trial gets, by the
# same code. An earlier version kept a ``cp -a`` copy in the service's own /tmp, which a trial in that
# container could list and change (only its listing, not its contents, was checked before reuse). The
# container is never recreated.

# A reset is one exec when the image has ``tar``: the wipe, the seed streamed in as a tar made on the host
# (``seed_tar``, what ``docker cp`` would send), and the verifying listing.

# mode, owner, group, size, type, link target and path of every entry, the target itself included
# (NUL-free: a name holding a newline would only shift lines, which still changes the digest).
_LISTING_FORMAT = "%m %U %G %s %y %l\\t%P\\n"


_RESET_SH = 'mkdir -p "$1" && chown "$3" "$1" && chmod "$2" "$1" && find "$1" -mindepth 1 -delete'
# The same, then the seed from a tar on stdin and the listing ``_verify`` reads: the whole reset in one exec
# (``docker compose cp`` alone costs a compose CLI start). Without ``tar`` in the image it exits 86 before
# touching anything, and the reset takes the three calls.
_NO_TAR = 86
_RESET_TAR_SH = (
    f'command -v tar >/dev/null || exit {_NO_TAR}; {_RESET_SH} && tar -x -f - -C "$1" && shift 3 && exec "$@"'
)
# A checkpoint's tree, captured for its resets: every entry below the target, numeric owners kept.
_CAPTURE_SH = f'command -v tar >/dev/null || exit {_NO_TAR}; exec tar -c -f - --numeric-owner -C "$1" .'


def prepare(ctx: ApplyContext) -> tuple[str, str]:
    """The target directory's own mode and owner (``chmod``/``chown`` arguments), as the seeding left it."""
    target = target_dir(ctx).rstrip("/")
    try:
        out = ctx.compose.exec(ctx.service, ["stat", "-c", "%a %u:%g", target], timeout=ctx.timeouts.recipe)
    except CommandError as e:
        raise ctx.fail("prepare", f"could not read the mode of {target}: {e}") from e
    mode, _, owner = out.stdout.strip().partition(" ")
    if not mode.isdigit() or ":" not in owner:
        raise ctx.fail("prepare", f"unexpected stat output for {target}: {out.stdout.strip()!r}")
    return mode, owner


@dataclass(frozen=True)
class Captured:
    """A tree started from a checkpoint (``checkpoint_prepare``): the target's mode and owner, its entries
    as a tar made in the service (owners, modes, link targets kept) and its listing, both held on the host.
    A reset puts exactly these back, not the seed."""

    mode: str
    owner: str
    tar: bytes
    listing: Listing


def checkpoint_prepare(ctx: ApplyContext) -> Captured:
    """The target as the service holds it now (a checkpoint's state), for ``reset`` to put back: one
    ``tar -c`` in the service, read to the host (nothing of it stays in the service), and its listing."""
    mode, owner = prepare(ctx)
    target = target_dir(ctx).rstrip("/")
    t = ctx.timeouts.recipe
    with tempfile.TemporaryDirectory(prefix="forge-tree-") as tmp:
        out = Path(tmp) / "live.tar"
        argv = ["sh", "-c", _CAPTURE_SH, "forge-capture", target]
        r = ctx.compose.exec(ctx.service, argv, timeout=t, check=False, stdout_path=out)
        if r.rc == _NO_TAR:
            raise ctx.fail(
                "prepare",
                f"the service's image has no tar, so {target} cannot be reset in place to a checkpoint; "
                "run this task with `stacks: fresh`",
            )
        if r.rc != 0:
            raise ctx.fail("prepare", f"could not capture {target}: {r.stderr.strip() or r.rc}")
        data = out.read_bytes()
    try:
        listing = parse_listing(ctx.compose.exec(ctx.service, listing_argv(target), timeout=t).stdout, target)
    except CommandError as e:
        raise ctx.fail("prepare", f"could not list {target}: {e}") from e
    return Captured(mode, owner, data, listing)


def reset(ctx: ApplyContext, prepared: object) -> None:
    if isinstance(prepared, Captured):
        _reset_captured(ctx, prepared)
        return
    assert isinstance(prepared, tuple)
    mode, owner = prepared
    target = target_dir(ctx).rstrip("/")
    with tempfile.TemporaryDirectory(prefix="forge-tree-") as tmp:
        tar = seed_tar(ctx.seed.path, Path(tmp) / "seed.tar")
        argv = ["sh", "-c", _RESET_TAR_SH, "forge-reset", target, mode, owner, *listing_argv(target)]
        r = ctx.compose.exec(ctx.service, argv, stdin=tar, timeout=ctx.timeouts.recipe, check=False)
    if r.rc == 0:
        _verify(ctx, target, r.stdout)
        return
    if r.rc != _NO_TAR:
        raise ctx.fail("wipe", f"could not put the seed back in {target}: {r.stderr.strip() or r.rc}")
    argv = ["sh", "-c", _RESET_SH, "forge-reset", target, mode, owner]
    try:
        ctx.compose.exec(ctx.service, argv, timeout=ctx.timeouts.recipe)
    except CommandError as e:
        raise ctx.fail("wipe", f"could not empty {target}: {e}") from e
    _copy_and_verify(ctx, target)


def _reset_captured(ctx: ApplyContext, c: Captured) -> None:
    """Empty the target, extract the captured tar into it, and verify every entry and file hash against
    the captured listing: one exec, as the seed's reset."""
    target = target_dir(ctx).rstrip("/")
    argv = ["sh", "-c", _RESET_TAR_SH, "forge-reset", target, c.mode, c.owner, *listing_argv(target)]
    with checkpointcopy.as_file(c.tar) as tar:
        r = ctx.compose.exec(ctx.service, argv, stdin=tar, timeout=ctx.timeouts.recipe, check=False)
    if r.rc != 0:
        said = r.stderr.strip() or r.rc
        raise ctx.fail("wipe", f"could not put the checkpoint's tree back in {target}: {said}")
    problems = compare(c.listing, parse_listing(r.stdout, target))
    if problems:
        raise ctx.fail("verify", f"{target} does not match the checkpoint's: {problems}")


def fingerprint(ctx: ApplyContext) -> Fingerprint:
    """The target's listing digest (every entry's path, type, mode, owner, size, link target; the target
    directory itself included): what ``apply``'s verify does not check (it hashes the files' contents and
    names). One ``docker exec``."""
    target = target_dir(ctx).rstrip("/")
    argv = ["find", target, "-printf", _LISTING_FORMAT]
    r = ctx.compose.exec(ctx.service, argv, timeout=ctx.timeouts.recipe, check=False)
    if r.rc != 0:
        raise ctx.fail("fingerprint", f"could not list {target}: {r.stderr.strip() or r.rc}")
    return {"tree": fingerprint_part(sorted(r.stdout.splitlines()))}


RECIPE_VERSION = 1
SUPPORTS_GOLDEN = False

golden_path = no_golden  # applying this kind is already the copy a golden restore would be
golden_fingerprint = fingerprint
seed_mount = no_mount  # it works in the running container: no extra mount


def checkpoint_path(ctx: ApplyContext) -> str | None:
    """The target directory: the tree is its files, nothing of it lives in memory."""
    return target_dir(ctx).rstrip("/")


checkpoint_settle = no_settle  # files only: nothing to replay
reset_staged = reset_after(reset)  # its changes are gone only once the whole reset is done


warm_process = no_warm_process  # its reset works in the running server


# A checkpoint's restore in place is the warm reset's one exec with the checkpoint's tree: its tar
# (``docker cp``'s, read out of the checkpoint's image once per process: ``checkpointcopy``) is unpacked
# over the emptied target from its parent, so the target's own mode and owner come back with it, and the
# listing that follows must hold exactly the tar's entries with its files' hashes.
_RESTORE_TAR_SH = (
    f"command -v tar >/dev/null || exit {_NO_TAR}; "
    'mkdir -p "$1" && find "$1" -mindepth 1 -delete && tar -x -f - -C "$2" && shift 2 && exec "$@"'
)


def checkpoint_restore(ctx: ApplyContext, copy: CheckpointCopy) -> bool:
    """The target emptied and the checkpoint's tree unpacked in it, in the running container, its
    listing checked against the tree's (see the section's comment); False when the image has no ``tar``
    (the caller recreates the container from the checkpoint's image)."""
    target = copy.path.rstrip("/")
    data = checkpointcopy.read(ctx, copy)
    top = posixpath.basename(target)
    # hashed once per checkpoint and process, as the tar itself is read once
    expected = checkpointcopy.kept(("tree", copy.key, top), lambda: tar_listing(data, top))
    argv = ["sh", "-c", _RESTORE_TAR_SH, "forge-restore", target, posixpath.dirname(target) or "/"]
    with checkpointcopy.as_file(data) as tar:
        r = ctx.compose.exec(
            ctx.service, [*argv, *listing_argv(target)], stdin=tar, timeout=ctx.timeouts.recipe, check=False
        )
    if r.rc == _NO_TAR:
        return False
    if r.rc != 0:
        raise ctx.fail(
            "restore", f"could not put the checkpoint's tree back in {target}: {r.stderr.strip() or r.rc}"
        )
    problems = compare(expected, parse_listing(r.stdout, target))
    if problems:
        raise ctx.fail("restore", f"{target} does not match the checkpoint's tree: {problems}")
    return True


def tar_listing(data: bytes, top: str) -> Listing:
    """``docker cp``'s tar of a directory named ``top`` as ``listing_argv`` reports it: every entry below
    ``top``, a regular file with its sha256."""
    out: Listing = {}

    def add(info: tarfile.TarInfo, tf: tarfile.TarFile) -> None:
        name = info.name.rstrip("/")
        if name == top or not name.startswith(top + "/"):
            return
        rel = name[len(top) + 1 :]
        if info.isreg() or info.islnk():
            f = tf.extractfile(info)
            out[rel] = hashlib.sha256(f.read() if f is not None else b"").hexdigest()
        else:
            out[rel] = None

    checkpointcopy.entries(data, add)
    return out
