"""Where goldens live: labelled Docker images on the engine, one tag per key.

A golden is the service's image plus one layer holding its data directory as it stood right after the
first successful seeding (``FROM <image id>``, ``ADD data.tar``), **without the image's ``VOLUME`` at that
directory**. Restoring is choosing that image for the trial's service: the data directory is then part of
the container's own file system (overlayfs: nothing is copied at create; a file is copied up only when the
service first writes it), there **before the service starts**, so neither the init scripts nor the seed
run again, and no helper container is needed per trial. With the ``VOLUME`` kept, Docker would copy the
whole directory into a fresh volume at every create, a cost that grows with the data. A Dockerfile
cannot drop a ``VOLUME``, so the built image's config is loaded again without it (``docker load`` of a
config-only archive: its layers are on the engine already, nothing else is read); on an engine that
refuses that, the built image is the golden as it is (restored through the volume copy: slower, as correct).

Why an image and not a volume: only a finished golden is ever tagged with its key — the built image is
named by its ID until its unvolumed config is loaded under the key's tag — so a golden is either whole or
absent. A capture cut short (Ctrl-C, SIGKILL, a full disk) leaves at most a build directory on the host
(removed on Ctrl-C, or by ``forge reap`` once its owner is provably gone), unlabelled build cache, and at
worst an untagged built image; the labels come in the build's last step, so no half-built image looks like
a golden. A golden discarded (or whose tag a newer capture of its key took) is untagged: lookups never see
it, and the reaper removes it once its owner is gone and no container uses it. Docker refuses to remove an
image a container still uses, and from choosing a golden until its containers exist a trial claims it (the
key's lock, shared: ``key_claim``), which ``prune`` respects, so ``prune`` never pulls a golden from under a
trial of this host.

Every golden carries ``io.forgelib.managed``, the capturing run and owner labels, and its key and key parts
(``io.forgelib.golden.*``) — what ``forge snapshots ls`` shows. Two workers or processes needing the same
golden take it once: the first holds the key's lock (``flock`` on a file in the state directory) while it
seeds and captures; the others wait on it, then restore. Processes the lock does not reach (another state
directory, another host using this engine) may each capture the same key: each capture stands alone (its
own build ID, its own config), the key's tag ends on one of them, the others are left untagged and go
with ``prune``/``reap``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import secrets
import shutil
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from forgelib.docker import argv as dk
from forgelib.docker import labels as lab
from forgelib.errors import CommandError, ForgeError, Interrupted
from forgelib.runner import Runner
from forgelib.stacks.snapshots.key import FORMAT_VERSION, GoldenKey

log = logging.getLogger("forgelib.stacks.snapshots")

REPOSITORY = "forgelib-golden"
GOLDEN = "io.forgelib.golden"  # the snapshot format version; marks an image as a golden
PREFIX = GOLDEN + "."
KEY = PREFIX + "key"
SERVICE = PREFIX + "service"
PROJECT = PREFIX + "project"
SEED = PREFIX + "seed"
PATH = PREFIX + "path"  # the container path the golden holds
STATE = (
    PREFIX + "fingerprint"
)  # the seed kind's golden_fingerprint right after seeding (JSON), checked after each restore
CREATED = PREFIX + "created"
DATA_BYTES = PREFIX + "bytes"  # the captured data directory's size (the image's size includes its base)
ENTRIES = PREFIX + "entries"  # files and directories in it, the directory itself included (verify)
BUILD_DIR = "build-"  # <state>/goldens/build-<pid>-<start time>-<random>: a capture in progress
BUILD_RUN = ".forge-run"  # in a build directory: the run whose stack it captures (a checkpoint's)
LOCK_POLL = 0.2


def state_dir() -> Path:
    """``$XDG_STATE_HOME/forgelib/goldens`` (default ``~/.local/state``): locks, last-use marks, builds."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "forgelib" / "goldens"


def tag_of(key: str) -> str:
    return f"{REPOSITORY}:{key}"


@dataclass(frozen=True)
class Golden:
    id: str  # image id
    tags: tuple[str, ...]
    labels: Mapping[str, str]
    created: datetime
    size: int

    @property
    def key(self) -> str:
        return self.labels.get(KEY, "")

    @property
    def format(self) -> str:
        return self.labels.get(GOLDEN, "")

    @property
    def complete(self) -> bool:
        """Tagged under its own key: ``docker build`` tags only a fully written image."""
        return tag_of(self.key) in self.tags

    def part(self, name: str) -> str:
        return self.labels.get(PREFIX + name, "")

    @classmethod
    def from_inspect(cls, info: Mapping[str, Any]) -> Golden:
        cfg = info.get("Config") or {}
        raw = cfg.get("Labels") or {}
        created = str(info.get("Created", ""))
        try:  # Docker prints nanoseconds; fromisoformat takes at most microseconds
            head, _, frac = created.rstrip("Z").partition(".")
            when = datetime.fromisoformat(f"{head}.{(frac or '0')[:6]}").replace(tzinfo=UTC)
        except ValueError:
            when = datetime.fromtimestamp(0, UTC)
        return cls(
            id=str(info.get("Id", "")),
            tags=tuple(info.get("RepoTags") or ()),
            labels={str(k): str(v) for k, v in raw.items()},
            created=when,
            size=int(info.get("Size") or 0),
        )


def inspect(runner: Runner, refs: Sequence[str], timeout: float = 60.0) -> list[Golden]:
    """The goldens among ``refs`` (missing ones are skipped)."""
    if not refs:
        return []
    res = runner.run(dk.inspect(refs, kind="image"), timeout=timeout, check=False)
    try:
        data = json.loads(res.stdout or "[]")
    except json.JSONDecodeError:
        raise CommandError(res.argv, res.rc, res.stdout, res.stderr, reason="printed no JSON") from None
    return [Golden.from_inspect(d) for d in data if isinstance(d, dict) and is_golden(d)]


def is_golden(info: Mapping[str, Any]) -> bool:
    return GOLDEN in lab.of_inspect(info)


def find(runner: Runner, key: GoldenKey, timeout: float = 60.0) -> Golden | None:
    """The complete golden of ``key``, or None. An image tagged with the key whose labels disagree (edited
    by hand, another format) is not trusted: it is reported and treated as absent."""
    return matching(inspect(runner, [tag_of(key.digest)], timeout), key)


def matching(found: Sequence[Golden], key: GoldenKey) -> Golden | None:
    """The complete golden of ``key`` among ``found`` (what an inspect answered), or None (see ``find``)."""
    digest = key.digest
    tagged = [g for g in found if tag_of(digest) in g.tags]
    if not tagged:
        return None
    g = tagged[0]
    if g.key != digest or g.format != str(FORMAT_VERSION) or not g.complete:
        log.warning("ignoring %s: its labels do not match the key it is tagged with", tag_of(digest))
        return None
    return g


def list_goldens(runner: Runner, timeout: float = 60.0, *, project: str | None = None) -> list[Golden]:
    """Every golden on the engine (captured for ``project``), oldest first; an untagged one was discarded
    (or lost its tag to a newer capture of the same key, or is a capture still in flight)."""
    scope = lab.filters({PROJECT: project}) if project is not None else []
    res = runner.run(
        dk.ls("image", quiet=True, no_trunc=True, filters=["--filter", f"label={GOLDEN}", *scope]),
        timeout=timeout,
    )
    ids = sorted({line.strip() for line in res.stdout.splitlines() if line.strip()})
    return sorted(inspect(runner, ids, timeout), key=lambda g: g.created)


# ----------------------------------------------------------------------------------------------- capture


def build(
    runner: Runner,
    *,
    key: GoldenKey,
    path: str,
    data_tar: Path,
    labels: Mapping[str, str],
    timeout: float,
) -> Golden:
    """Build the golden of ``key``: ``FROM`` the key's image, ``ADD`` the data tar (from ``docker cp
    CONTAINER:path -``, whose top entry is ``basename(path)``) at ``path``'s parent, then the same image
    without a ``VOLUME`` at ``path`` (``unvolumed``), which alone takes the key's tag.

    The built image is named by the ID this build printed, never by a tag: a name shared by every capture
    of a key (a ``<key>-building`` tag) is retagged by a concurrent capture of the same key that the key
    lock does not serialise (another state directory, another host on this engine), and this capture
    would then load *that* image's config — its labels, its fingerprint — as its own, byte for byte, so
    both captures would end as one image (a config's ID is its digest). Until the load, the built image is
    untagged: ``find`` never sees it, and ``forge reap``/``prune`` remove it (it is labelled) if a Ctrl-C
    or a crash leaves it."""
    parent = str(Path(path).parent)
    # LABEL last: the only image carrying the golden labels is the finished one (an intermediate layer
    # left by a build cut short is unlabelled build cache, never mistaken for a golden).
    pairs = " ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in labels.items())
    lines = [f"FROM {key.image_id}", f"ADD {data_tar.name} {parent.rstrip('/')}/", f"LABEL {pairs}"]
    (data_tar.parent / "Dockerfile").write_text("\n".join(lines) + "\n")
    tag = tag_of(key.digest)
    res = runner.run(
        dk.build(str(data_tar.parent), quiet=True, force_rm=True),
        timeout=timeout,
        env={"DOCKER_BUILDKIT": "0"},  # the classic builder: present on every engine, no buildx needed
        tag="build",  # a stop kills it (signals.LAUNCH_VERBS): no golden is finished after a Ctrl-C
    )
    built = (res.stdout.strip().splitlines() or [""])[-1].strip()
    if not built.startswith("sha256:"):
        raise CommandError(res.argv, res.rc, res.stdout, res.stderr, reason="printed no image ID")
    keep = False
    try:
        try:
            unvolumed(runner, built, tag, path, data_tar.parent, timeout)
        except Interrupted:
            raise
        except ForgeError as e:
            log.warning("golden %s keeps its VOLUME (restored through the volume copy): %s", tag, e)
            runner.run(dk.tag(built, tag), timeout=timeout, tag="build")
            keep = True
    finally:
        if not keep:  # the built image and its build steps' images; their layers stay under the golden
            runner.run(dk.rm([built], kind="image"), timeout=timeout, check=False)
    golden = find(runner, key)
    if golden is None:
        raise ForgeError(f"built {tag}, but it does not inspect as a complete golden")
    return golden


def unvolumed(runner: Runner, image: str, tag: str, path: str, workdir: Path, timeout: float) -> None:
    """Load ``image`` again as ``tag`` with its config minus every ``VOLUME`` at ``path`` or above it: a
    ``docker load`` archive holding only the manifest and the config (the engine has every layer, so it
    reads none). Raises ``ForgeError`` when the engine refuses (e.g. one whose image store wants the
    layers' blobs) or the result is not the same layers without that volume."""
    res = runner.run(dk.inspect([image], kind="image"), timeout=timeout)
    info = json.loads(res.stdout)[0]
    config = dict(info.get("Config") or {})
    volumes = {
        v: spec
        for v, spec in (config.get("Volumes") or {}).items()
        if not (path == v.rstrip("/") or path.startswith(v.rstrip("/") + "/"))
    }
    config["Volumes"] = volumes or None
    diff_ids = list((info.get("RootFS") or {}).get("Layers") or [])
    raw = {
        "architecture": info.get("Architecture"),
        "os": info.get("Os"),
        "config": config,
        "created": info.get("Created"),
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    if info.get("Variant"):
        raw["variant"] = info["Variant"]
    data = json.dumps(raw, sort_keys=True).encode()
    name = hashlib.sha256(data).hexdigest() + ".json"
    manifest = [
        {"Config": name, "RepoTags": [tag], "Layers": [f"{i}/layer.tar" for i in range(len(diff_ids))]}
    ]
    archive = workdir / "unvolumed.tar"
    with tarfile.open(archive, "w") as t:
        for member, blob in ((name, data), ("manifest.json", json.dumps(manifest).encode())):
            entry = tarfile.TarInfo(member)
            entry.size = len(blob)
            t.addfile(entry, io.BytesIO(blob))
    runner.run(dk.load(quiet=True, input=str(archive)), timeout=timeout, tag="build")
    # What was loaded is checked by its ID, the digest of these bytes, not through the tag: a concurrent
    # capture of the same key may have moved the tag on to its own golden meanwhile (as valid as this one).
    loaded = "sha256:" + name.removesuffix(".json")
    res = runner.run(dk.inspect([loaded], kind="image"), timeout=timeout, check=False)
    got = (json.loads(res.stdout or "[]") or [{}])[0] if res.rc == 0 else {}
    left = set((got.get("Config") or {}).get("Volumes") or {}) - set(volumes)
    if not got or ((got.get("RootFS") or {}).get("Layers") or []) != diff_ids or left:
        raise ForgeError(f"docker load did not make {loaded} from the built layers without VOLUME {path}")


def golden_labels(
    key: GoldenKey,
    *,
    service: str,
    project: str,
    seed: str,
    path: str,
    state: str,
    run_id: str,
    data_bytes: int,
    entries: int,
) -> dict[str, str]:
    out = {lab.MANAGED: "true", lab.RUN: run_id, **lab.current_owner().labels()}
    out[GOLDEN] = str(FORMAT_VERSION)
    out[KEY] = key.digest
    out.update({PREFIX + k: v for k, v in key.parts().items() if k != "format"})
    out.update({SERVICE: service, PROJECT: project, SEED: seed, PATH: path, STATE: state})
    out[DATA_BYTES] = str(data_bytes)
    out[ENTRIES] = str(entries)
    out[CREATED] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


@contextlib.contextmanager
def build_dir(run_id: str | None = None) -> Iterator[Path]:
    """A host directory for one capture, named for its owner so ``forge reap`` can tell a dead one's;
    removed however the capture ends. ``run_id``: the run whose stack is captured (a checkpoint's), written
    in the directory so that ``forge reap --run`` finds it too."""
    me = lab.current_owner()
    d = state_dir() / f"{BUILD_DIR}{me.pid}-{me.start_time}-{secrets.token_hex(3)}"
    d.mkdir(parents=True)
    try:
        if run_id:
            (d / BUILD_RUN).write_text(run_id)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def stale_build_dirs(alive: Callable[[str, str], bool], run_id: str | None = None) -> list[Path]:
    """Build directories whose owner (pid, start time in the name) is no longer ``alive``; with
    ``run_id``, only those of a capture of that run's stack."""
    base = state_dir()
    out = []
    for d in sorted(base.glob(BUILD_DIR + "*")) if base.is_dir() else []:
        pid, _, rest = d.name.removeprefix(BUILD_DIR).partition("-")
        start = rest.rpartition("-")[0]
        if run_id is not None and build_run(d) != run_id:
            continue
        if pid.isdigit() and not alive(pid, start):
            out.append(d)
    return out


def build_run(d: Path) -> str | None:
    """The run a build directory's capture is of (a checkpoint's), or None (a golden's)."""
    try:
        return (d / BUILD_RUN).read_text()
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------- removal


def remove(
    runner: Runner, golden: Golden, *, force_untag: bool = False, timeout: float = 120.0
) -> str | None:
    """Remove a golden; the reason when it stays. Docker refuses while a container uses the image; with
    ``force_untag`` (a golden found bad) its tag goes anyway, so no new trial can restore it, and the
    untagged image is removed once the last container using it is gone (``forge reap``/``prune``)."""
    refs = [t for t in golden.tags if t.startswith(REPOSITORY + ":")]
    argv = dk.rm(refs or [golden.id], kind="image", force=force_untag)
    res = runner.run(argv, timeout=timeout, check=False)
    if res.rc == 0 or "No such image" in res.stderr:
        return None
    said = (res.stderr.strip().splitlines() or [f"rc={res.rc}"])[-1]
    return "in use by a container" if "being used" in said or "conflict" in said else said


# ------------------------------------------------------------------------------------------ key locks

_thread_locks: dict[str, threading.Lock] = {}
_thread_guard = threading.Lock()


@contextlib.contextmanager
def key_lock(key: str, *, timeout: float, stopping: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """Hold the lock of ``key`` across threads and processes of this host (``flock``), so one of them seeds
    and captures while the others wait, then restore. Raises ``ForgeError`` after ``timeout`` seconds, or
    ``stopping()`` turning true (Ctrl-C), without the lock."""
    with _thread_guard:
        tlock = _thread_locks.setdefault(key, threading.Lock())
    deadline = time.monotonic() + timeout
    while not tlock.acquire(timeout=LOCK_POLL):
        _check_wait(key, deadline, stopping)
    try:
        path = state_dir() / f"{key}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            _flock(f, key, deadline, stopping)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    finally:
        tlock.release()


@contextlib.contextmanager
def key_claim(key: str, *, timeout: float, stopping: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """A trial's claim on ``key``'s golden, from choosing it until its containers exist (then Docker itself
    refuses to remove the image): the key's lock shared (``flock`` ``LOCK_SH``), so any number of trials
    claim it at once and none while a capture holds the lock; ``prune`` leaves a claimed golden alone
    (``unclaimed``). Raises like ``key_lock``."""
    deadline = time.monotonic() + timeout
    path = state_dir() / f"{key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        _flock(f, key, deadline, stopping, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def unclaimed(key: str) -> Iterator[bool]:
    """For ``prune``: the key's lock, at once, when no process of this host holds or claims it (True), else
    False: a trial has chosen the golden and its containers do not exist yet, or a capture runs. Held
    while the golden is removed and its state forgotten. Processes the lock does not reach are not seen."""
    path = state_dir() / f"{key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _flock(
    f: IO[str], key: str, deadline: float, stopping: Callable[[], bool], mode: int = fcntl.LOCK_EX
) -> None:
    while True:
        try:
            fcntl.flock(f, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            _check_wait(key, deadline, stopping)
            time.sleep(LOCK_POLL)  # another process holds it; flock has no timed wait


def _check_wait(key: str, deadline: float, stopping: Callable[[], bool]) -> None:
    if stopping():  # an interruption, not a golden that cannot be had
        raise Interrupted(f"stopped while waiting for the lock of golden {key[:12]}")
    if time.monotonic() > deadline:
        raise ForgeError(f"another forge process held the lock of golden {key[:12]} for too long")


# ---------------------------------------------------------------------------------------------- last use


def mark_used(key: str) -> None:
    """Record that a trial on this host restored ``key`` now (the file's mtime; best-effort)."""
    path = state_dir() / f"{key}.used"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError as e:
        log.warning("could not record the use of golden %s: %s", key[:12], e)


def last_used(key: str) -> datetime | None:
    try:
        return datetime.fromtimestamp((state_dir() / f"{key}.used").stat().st_mtime, UTC)
    except OSError:
        return None


def forget(key: str) -> None:
    for suffix in (".used", ".lock"):
        with contextlib.suppress(OSError):
            (state_dir() / f"{key}{suffix}").unlink()
