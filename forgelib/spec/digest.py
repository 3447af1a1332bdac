"""Seed digests: ``sha256:<hex>`` over exactly what a recipe will use, independent of mtimes and walk order.

**File** (every kind but ``filesystem_dir``): the SHA-256 of the file's bytes, read in fixed-size chunks.

**Directory** (``filesystem_dir``): walk the tree under the seed directory without following symlinks and
make one record per entry below the root (the root itself has none)::

    TYPE NUL RELPATH NUL FIELD NUL

- ``TYPE`` is one ASCII byte: ``d`` directory, ``f`` regular file, ``x`` regular file whose owner-execute
  bit (``S_IXUSR``, as git uses) is set, ``l`` symbolic link.
- ``RELPATH`` is the path relative to the seed directory, components joined by ``/``, as the file system's
  bytes (``os.fsencode``).
- ``FIELD`` is, for ``f``/``x``, the lowercase hex SHA-256 of the file's bytes; for ``l``, the link target
  exactly as stored (``os.readlink``, not resolved); for ``d``, empty. Every directory gets a record, so an
  empty directory counts and so does renaming one.

Sort the records by ``RELPATH`` bytes (unsigned bytewise), concatenate them, and the digest is
``sha256:`` + the hex SHA-256 of that byte string. Ownership, permissions other than the owner-execute bit,
and timestamps are not part of it. Sockets, FIFOs and device files are refused: no recipe copies them.

Reproduce in a shell (no newlines in names assumed)::

    cd SEED && find . -mindepth 1 | LC_ALL=C sort | while IFS= read -r p; do r=${p#./}
      if [ -L "$p" ]; then printf 'l\\0%s\\0%s\\0' "$r" "$(readlink "$p")"
      elif [ -d "$p" ]; then printf 'd\\0%s\\0\\0' "$r"
      else t=f; [ -x "$p" ] && t=x   # -x approximates S_IXUSR when you own the file
           printf '%s\\0%s\\0%s\\0' "$t" "$r" "$(sha256sum < "$p" | cut -c1-64)"; fi
    done | sha256sum

(``LC_ALL=C sort`` orders whole paths bytewise, the same as sorting the records by ``RELPATH``.)
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from forgelib.errors import ForgeError
from forgelib.kinds import DIRECTORY_SEEDS

PREFIX = "sha256:"


class DigestError(ForgeError):
    """A seed cannot be digested (unreadable, or holds an entry no recipe can copy)."""


def file_sha256(path: Path | str | bytes) -> str:
    """Hex SHA-256 of a file's bytes, streamed (constant memory) by ``hashlib.file_digest``."""
    with open(path, "rb", buffering=0) as f:  # unbuffered: file_digest reads straight into its own buffer
        return hashlib.file_digest(f, "sha256").hexdigest()


def walk_tree(root: Path) -> Iterator[Path]:
    """Every entry below ``root`` (directories included, symlinks not followed), parents before children."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in (*dirnames, *filenames):
            yield Path(dirpath) / name


def _records(root: bytes) -> list[tuple[bytes, bytes]]:
    """(relpath, record) per entry below ``root``; iterative, so deep trees cannot hit the recursion limit."""
    out: list[tuple[bytes, bytes]] = []
    pending: list[tuple[bytes, bytes]] = [(root, b"")]
    while pending:
        absdir, reldir = pending.pop()
        with os.scandir(absdir) as it:
            for entry in it:
                rel = reldir + entry.name if not reldir else reldir + b"/" + entry.name
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    target = os.readlink(entry.path)  # noqa: PTH115 - bytes in, bytes out
                    rec = b"l\0" + rel + b"\0" + target + b"\0"
                elif stat.S_ISDIR(mode):
                    rec = b"d\0" + rel + b"\0\0"
                    pending.append((entry.path, rel))
                elif stat.S_ISREG(mode):
                    kind = b"x" if mode & stat.S_IXUSR else b"f"
                    rec = kind + b"\0" + rel + b"\0" + file_sha256(entry.path).encode() + b"\0"
                else:
                    raise DigestError(
                        f"{os.fsdecode(entry.path)} is neither a file, a directory nor a symlink "
                        "(a socket, FIFO or device); remove it from the seed directory"
                    )
                out.append((rel, rec))
    return out


def dir_sha256(path: Path | str) -> str:
    """Hex canonical digest of a directory tree (the algorithm is in this module's docstring)."""
    h = hashlib.sha256()
    for _, rec in sorted(_records(os.fsencode(path))):
        h.update(rec)
    return h.hexdigest()


def seed_digest(path: Path, kind: str) -> str:
    """``sha256:<hex>`` of a seed: the directory digest for a directory seed kind, the file's bytes otherwise.

    Raises ``DigestError`` when the seed cannot be read or holds a special file.
    """
    try:
        if kind in DIRECTORY_SEEDS:
            return PREFIX + dir_sha256(path)
        return PREFIX + file_sha256(path)
    except OSError as e:
        raise DigestError(f"cannot digest seed {path}: {e.strerror or e}") from None
