"""A checkpoint's captured directory, read out of its image for a kind's in-place restore
(``Recipe.checkpoint_restore``).

The directory is in the checkpoint image's own layer. ``docker cp`` reads it out of a container created
from that image and never started (no network, no process: nothing runs of it), which is removed on every
path and carries the service's forge labels, so ``forge reap`` finds one a kill left. What it read is
``docker cp``'s tar: the directory itself first, then its entries, with their owners and modes.

The tar is kept in this process's memory, keyed by the image's ID: an image ID names its content, so a
later restore of the same checkpoint (the same stack again, or one of its forks) reads nothing from the
engine. Bounded (``MAX_ENTRY``, ``MAX_TOTAL``; the oldest goes first): a larger directory is read again
each time, or staged by its kind where it restores from (``kinds.supervisor``).
"""

from __future__ import annotations

import io
import secrets
import tarfile
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from forgelib.docker import argv as dk
from forgelib.docker import labels as lab
from forgelib.errors import CommandError
from forgelib.kinds.base import ApplyContext, CheckpointCopy

MAX_ENTRY = 256 * 1024 * 1024
MAX_TOTAL = 512 * 1024 * 1024
MAX_VALUES = 16  # ``kept``'s entries (a kind's own reading of a copy: redis's keyspace)

T = TypeVar("T")
_lock = threading.Lock()
_cache: OrderedDict[str, bytes] = OrderedDict()
_values: OrderedDict[Hashable, object] = OrderedDict()


def read(ctx: ApplyContext, copy: CheckpointCopy) -> bytes:
    """``docker cp``'s tar of ``copy.path`` in ``copy.image`` (kept; see the module's docstring)."""
    with _lock:
        found = _cache.get(copy.key)
        if found is not None:
            _cache.move_to_end(copy.key)
            return found
    with tempfile.TemporaryDirectory(prefix="forge-ckread-") as tmp:
        dest = Path(tmp) / "copy.tar"
        export(ctx, copy, dest)
        data = dest.read_bytes()
    remember(copy.key, data)
    return data


def remember(key: str, data: bytes) -> None:
    if len(data) > MAX_ENTRY:
        return
    with _lock:
        _cache[key] = data
        _cache.move_to_end(key)
        while sum(len(v) for v in _cache.values()) > MAX_TOTAL:
            _cache.popitem(last=False)


def kept(key: Hashable, make: Callable[[], T]) -> T:
    """``make()`` once per ``key`` (which must name the copy's content: its ``CheckpointCopy.key``) in
    this process, the ``MAX_VALUES`` latest kept. Not under the lock while it runs: two first restores
    may both make it."""
    with _lock:
        if key in _values:
            _values.move_to_end(key)
            found: T = _values[key]  # type: ignore[assignment]
            return found
    value = make()
    with _lock:
        _values[key] = value
        while len(_values) > MAX_VALUES:
            _values.popitem(last=False)
    return value


def forget() -> None:
    """Drop everything kept (tests)."""
    with _lock:
        _cache.clear()
        _values.clear()


def export(ctx: ApplyContext, copy: CheckpointCopy, dest: Path) -> None:
    """Write ``docker cp``'s tar of ``copy.path`` in ``copy.image`` to ``dest``."""
    try:
        with helper(ctx, copy) as name:
            cp = dk.cp(f"{name}:{copy.path}", "-")
            ctx.compose.runner.run(cp, timeout=ctx.timeouts.recipe, stdout_path=dest, tag="cp")
    except CommandError as e:
        raise ctx.fail(
            "restore", f"could not read {copy.path} out of checkpoint image {copy.image}: {e}"
        ) from e


@contextmanager
def helper(
    ctx: ApplyContext,
    copy: CheckpointCopy,
    *,
    entrypoint: str = "true",
    args: Sequence[str] = ("forge-checkpoint-read",),
    publish: str | None = None,
) -> Iterator[str]:
    """A helper container of ``copy.image`` that reads the checkpoint (its name): created and never
    started (no network), or with ``publish`` started detached (``entrypoint`` ``args``, that port
    published). It carries the service's forge labels (``forge reap`` finds one a kill left) and is
    removed on every path."""
    runner, t = ctx.compose.runner, ctx.timeouts
    labels = {**copy.labels, lab.HELPER: "checkpoint-read"}
    name = f"forge-ckread-{secrets.token_hex(6)}"
    label = [f"{k}={v}" for k, v in sorted(labels.items())]
    if publish is None:
        argv = dk.create(copy.image, args, name=name, network="none", entrypoint=entrypoint, label=label)
    else:
        argv = dk.run(
            copy.image, args, name=name, detach=True, entrypoint=entrypoint, publish=publish, label=label
        )
    try:
        runner.run(argv, timeout=t.command if publish is None else t.compose_up, tag="helper")
        yield name
    finally:
        runner.run(dk.rm([name], force=True, volumes=True), timeout=t.command, check=False, tag="rm")


@contextmanager
def as_file(data: bytes) -> Iterator[Path]:
    """``data`` in a temporary file (what the runner streams to a command's stdin), removed after."""
    with tempfile.TemporaryDirectory(prefix="forge-ckcopy-") as tmp:
        path = Path(tmp) / "copy.tar"
        path.write_bytes(data)
        yield path


def entries(data: bytes, each: Callable[[tarfile.TarInfo, tarfile.TarFile], None]) -> None:
    """Call ``each`` on every member of the tar in ``data``, in order (with the open tar, to read one)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        for info in tf:
            each(info, tf)
