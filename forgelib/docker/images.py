"""Offline stand-ins for the official postgres and redis images (and our python service image), and the
environment that makes every compose call use them.

Compose files name images through variables whose defaults are the official images
(``${FORGE_IMAGE_POSTGRES:-postgres:16}``). ``ensure_images`` builds ``images/<name>/Dockerfile`` on a Debian
base; ``image_env`` maps each variable to its stand-in when the stand-in exists and the user has not set the
variable, so a pack runs unchanged online (official images) and offline (stand-ins).

A build is skipped when the image's ``io.forgelib.content-hash`` label equals the hash of its recipe
directory plus the base image's id, so a no-op ``forge images`` costs a few ``docker image inspect`` calls.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from forgelib.docker import argv as dk
from forgelib.docker.compose import ImageConfig, inspect_images
from forgelib.errors import CommandError, ForgeError, ProgramNotFound
from forgelib.kinds import KINDS
from forgelib.kinds.kind import StandIn
from forgelib.resources import data_dir
from forgelib.runner import Runner
from forgelib.spec.digest import dir_sha256

HASH_LABEL = "io.forgelib.content-hash"
OFFICIAL_BASE = "debian:bookworm-slim"
BUILT_BASE = "forgelib/debian:bookworm"
INSPECT_TIMEOUT = 30.0
PULL_TIMEOUT = 300.0  # offline it fails at once ("no such host"); online, a slim image is ~30 MB
BASE_BUILD_TIMEOUT = 900.0  # debootstrap minbase downloads a base system: room for a slow mirror
BUILD_TIMEOUT = 900.0  # apt-get install postgresql-15 and friends: room for a slow mirror
RM_TIMEOUT = 60.0
# Test sessions, CI and people share one engine: concurrent `ensure_images` calls take turns, so the second
# one finds fresh labels and reuses instead of building the same images again.
LOCK_PATH = Path(tempfile.gettempdir()) / "forgelib-images.lock"
LOCK_TIMEOUT = BASE_BUILD_TIMEOUT + 3 * BUILD_TIMEOUT


# name (= directory under images/) -> stand-in: each kind's server, then our python service image; the
# table in docs/internals.md
STAND_INS: dict[str, StandIn] = {
    **{k.stand_in.directory: k.stand_in for k in KINDS if k.stand_in is not None},
    "python": StandIn("python", "forgelib/python:3.11", "FORGE_IMAGE_PYTHON"),
}


class ImageError(ForgeError):
    """A stand-in (or the base image) could not be built; the message carries the build's output tail."""


@dataclass(frozen=True)
class ImageReport:
    name: str  # "base" or a STAND_INS key
    tag: str
    action: str  # "built", "reused", "pulled" or "present"
    seconds: float
    why: str

    def line(self) -> str:
        return f"{self.name:<9} {self.tag:<26} {self.action:<7} {self.seconds:6.1f}s  {self.why}"


Say = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_images(
    runner: Runner,
    force: bool = False,
    *,
    jobs: int = 3,
    say: Say = _stderr,
    facts: ImageFacts | None = None,
) -> list[ImageReport]:
    """Build each stand-in whose recipe or base changed (all of them with ``force``); reuse the rest.

    Prints one line per image (built/reused, how long, why) and returns the same rows. ``facts`` learns
    that the stand-ins exist now, so its ``env`` need not ask Docker again.
    """
    started = time.monotonic()
    with _host_lock(say):
        rows = _ensure_images_locked(runner, force, jobs, say)
    if facts is not None:
        facts.know_present(s.tag for s in STAND_INS.values())
    say(f"images: done in {time.monotonic() - started:.1f}s")
    return rows


def _ensure_images_locked(runner: Runner, force: bool, jobs: int, say: Say) -> list[ImageReport]:
    base = ensure_base(runner, force=force)
    say(f"images: {base.row.line()}")
    recipes = data_dir("images")

    def one(name: str) -> ImageReport:
        row = _ensure_stand_in(runner, name, recipes / name, base, force)
        say(f"images: {row.line()}")
        return row

    names = list(STAND_INS)
    # Builds are mostly apt downloads and unpacking: running them side by side halves a cold `forge images`.
    # The cost: Ctrl-C waits for running builds to end (each bounded by BUILD_TIMEOUT; pass jobs=1 to avoid).
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, n) for n in names]
        rows = [base.row]
        errors: list[BaseException] = []
        for f in futures:
            try:
                rows.append(f.result())
            except ImageError as e:
                errors.append(e)
    if errors:
        raise ImageError("\n".join(str(e) for e in errors))
    # only now: while stand-ins built on the old base still existed, Docker would refuse to remove it
    _remove_replaced(runner, base.replaced, base.id)
    if any(r.action == "built" for r in rows):
        _remove_dangling(runner)
    return rows


@contextlib.contextmanager
def _host_lock(say: Say) -> Iterator[None]:
    try:
        f = open(LOCK_PATH, "a+b")  # noqa: SIM115 - closed by the with-statement below
    except OSError:  # another user's lock file: no way to take turns, but the builds are still correct
        yield
        return
    with f:
        if not _try_lock(f):
            say(f"images: another `forge images` (or test session) is building; waiting for {LOCK_PATH}")
            deadline = time.monotonic() + LOCK_TIMEOUT
            while not _try_lock(f):
                if time.monotonic() > deadline:
                    raise ImageError(
                        f"waited {LOCK_TIMEOUT:g}s for {LOCK_PATH}, held by another forge process building "
                        "images: find it with `fuser -v` on that file, stop it, then re-run"
                    )
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _try_lock(f: IO[bytes]) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@dataclass(frozen=True)
class Base:
    ref: str  # what the Dockerfiles' BASE build arg is set to
    id: str
    row: ImageReport
    replaced: str | None = None  # the id of our previous base, removed once nothing is built on it


def ensure_base(runner: Runner, *, force: bool = False) -> Base:
    """The image the stand-ins are built FROM.

    debian:bookworm-slim when it is present; else our debootstrapped base when its recipe is unchanged; else
    debian:bookworm-slim if it can be pulled; else debootstrap + ``docker import`` (scripts/build-base.sh).
    """
    start = time.monotonic()
    official = _inspect(runner, OFFICIAL_BASE)
    if official is not None:
        return Base(
            OFFICIAL_BASE, official.id, ImageReport("base", OFFICIAL_BASE, "present", 0.0, "found locally")
        )
    script = data_dir("scripts") / "build-base.sh"
    want = base_hash(script)
    ours = _inspect(runner, BUILT_BASE)
    if ours is not None and ours.labels.get(HASH_LABEL) == want and not force:
        row = ImageReport("base", BUILT_BASE, "reused", time.monotonic() - start, "recipe unchanged")
        return Base(BUILT_BASE, ours.id, row)
    if ours is None:
        pulled = runner.run(dk.pull(OFFICIAL_BASE, quiet=True), timeout=PULL_TIMEOUT, check=False)
        official = _inspect(runner, OFFICIAL_BASE) if pulled.rc == 0 else None
        if official is not None:
            row = ImageReport("base", OFFICIAL_BASE, "pulled", time.monotonic() - start, "from its registry")
            return Base(OFFICIAL_BASE, official.id, row)
        why = f"{OFFICIAL_BASE} is neither local nor pullable: debootstrap"
    else:
        why = "--force" if force else "recipe changed (scripts/build-base.sh)"
    try:
        runner.run(["bash", str(script), BUILT_BASE, f"{HASH_LABEL}={want}"], timeout=BASE_BUILD_TIMEOUT)
    except CommandError as e:
        raise ImageError(
            f"building the base image {BUILT_BASE} with {script} failed: {e}\n"
            f"fix: make {OFFICIAL_BASE} available (`docker pull` or `docker load`), or fix what the tail "
            "above names (debootstrap needs root and Debian's mirror), then re-run `forge images`"
        ) from None
    built = _inspect(runner, BUILT_BASE)
    if built is None:
        raise ImageError(f"{script} succeeded but {BUILT_BASE} does not exist; see `docker image ls`")
    row = ImageReport("base", BUILT_BASE, "built", time.monotonic() - start, why)
    replaced = ours.id if ours is not None and ours.id != built.id else None
    return Base(BUILT_BASE, built.id, row, replaced)


def _ensure_stand_in(runner: Runner, name: str, recipe: Path, base: Base, force: bool) -> ImageReport:
    start = time.monotonic()
    tag = STAND_INS[name].tag
    want = recipe_hash(recipe, base.id)
    old = _inspect(runner, tag)
    have = None if old is None else old.labels.get(HASH_LABEL)
    if have == want and not force:
        return ImageReport(name, tag, "reused", time.monotonic() - start, "recipe and base unchanged")
    if force:
        why = "--force"
    elif old is None:
        why = "not built yet"
    elif have is None:
        why = "no content-hash label (built by hand?)"
    else:
        why = "recipe or base changed"
    argv = dk.build(str(recipe), build_arg=f"BASE={base.ref}", label=f"{HASH_LABEL}={want}", tag=tag)
    try:
        runner.run(argv, timeout=BUILD_TIMEOUT)
    except CommandError as e:
        raise ImageError(f"building {tag} from {recipe} failed: {e}") from None
    new = _inspect(runner, tag)
    if old is not None and new is not None:
        _remove_replaced(runner, old.id, new.id)
    return ImageReport(name, tag, "built", time.monotonic() - start, why)


def recipe_hash(recipe: Path, base_id: str) -> str:
    """sha256 over the base image id and the recipe directory's tree digest (``digest.dir_sha256``: relative
    paths, owner-execute bits, contents, symlinks), the one tree hash forge has."""
    if not (recipe / "Dockerfile").is_file():
        raise ImageError(f"{recipe / 'Dockerfile'} is missing; reinstall forgelib or restore images/")
    return _digest([("base", base_id.encode()), ("recipe", dir_sha256(recipe).encode())])


def base_hash(script: Path) -> str:
    """The content hash of our debootstrapped base: its recipe is the script that builds it."""
    return _digest([("build-base.sh", script.read_bytes())])


def _digest(parts: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, data in parts:
        # length-prefixed, so ("ab", "c") and ("a", "bc") hash differently
        for chunk in (name.encode(), data):
            h.update(len(chunk).to_bytes(8, "big"))
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class _Image:
    id: str
    labels: dict[str, str]


def _inspect(runner: Runner, ref: str) -> _Image | None:
    """The image's id and labels in one call, or None when there is no such image."""
    result = runner.run(
        dk.inspect([ref], kind="image", format="{{.Id}} {{json .Config.Labels}}"),
        timeout=INSPECT_TIMEOUT,
        check=False,
    )
    image_id, _, labels = result.stdout.strip().partition(" ")
    if result.rc != 0 or not image_id:
        return None
    loaded = json.loads(labels or "null")
    return _Image(image_id, {str(k): str(v) for k, v in (loaded or {}).items()})


def _remove_dangling(runner: Runner) -> None:
    # Untagged images that carry our content-hash label can only be stand-ins or bases a rebuild replaced
    # (here or in an interrupted or racing run); nothing else on the engine has that label.
    listed = runner.run(
        dk.ls("image", quiet=True, filter=["dangling=true", f"label={HASH_LABEL}"]),
        timeout=INSPECT_TIMEOUT,
        check=False,
    )
    stale = sorted({line.strip() for line in listed.stdout.splitlines() if line.strip()})
    if listed.rc == 0 and stale:
        runner.run(dk.rm(stale, kind="image"), timeout=RM_TIMEOUT, check=False)


def _remove_replaced(runner: Runner, old: str | None, new: str) -> None:
    # A rebuild leaves the previous image untagged; remove it so rebuilds do not pile up. Without --force
    # Docker refuses while a container still uses it, which is what we want (someone's live stack).
    if old is not None and old != new:
        runner.run(dk.rm([old], kind="image"), timeout=RM_TIMEOUT, check=False)


# --- the environment every compose call merges ----------------------------------------------------------


class ImageFacts:
    """What the engine holds, asked once per owner (a run's backend, one ``forge provision``) rather than once
    per process: which stand-ins exist locally, and the VOLUME paths each image declares. Owned, not
    module-global, so two runs in one process (tests, the pytest plugin) never share a stale answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # trials start together on --workers N: ask Docker once, not per worker
        self._present: frozenset[str] | None = None
        self._configs: dict[str, ImageConfig] = {}

    def env(self, runner: Runner, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """``{VAR: tag}`` for each stand-in that exists locally and whose variable the user has not set.

        The user's variables are read on every call (``environ`` defaults to ``os.environ``), so an explicit
        ``FORGE_IMAGE_POSTGRES=postgres:16`` always wins. No engine answering: ``{}``, asked again next time.
        """
        with self._lock:
            if self._present is None:
                found = _local_stand_ins(runner)
                if found is None:
                    return {}  # no engine answered: compose will fail on its own with a clearer message
                self._present = found
            present = self._present
        env = os.environ if environ is None else environ
        return {s.var: s.tag for s in STAND_INS.values() if s.tag in present and not env.get(s.var)}

    def know_present(self, tags: Iterable[str]) -> None:
        """``ensure_images`` just built or found these: ``env`` need not ask."""
        with self._lock:
            self._present = frozenset(tags)

    def volumes(self, runner: Runner, images: Sequence[str], timeout: float) -> dict[str, tuple[str, ...]]:
        """image -> the VOLUME paths it declares, for the images present locally (one ``docker image
        inspect`` for those not seen before by this owner). An image not present yet (compose will pull or
        build it) is left out: nothing to label until the next trial, which sees it."""
        return {i: c.volumes for i, c in self.configs(runner, images, timeout).items()}

    def configs(self, runner: Runner, images: Sequence[str], timeout: float) -> dict[str, ImageConfig]:
        """image -> its VOLUME paths and default process (``volumes``' inspect, the same answers)."""
        with self._lock:
            todo = [i for i in images if i and i not in self._configs]
            if todo:
                self._configs.update(inspect_images(runner, todo, timeout))
            return {i: self._configs[i] for i in images if i in self._configs}


def _local_stand_ins(runner: Runner) -> frozenset[str] | None:
    argv = dk.ls(
        "image", format="{{.Repository}}:{{.Tag}}", filter=[f"reference={s.tag}" for s in STAND_INS.values()]
    )
    try:
        result = runner.run(argv, timeout=INSPECT_TIMEOUT, check=False)
    except (ProgramNotFound, CommandError):
        return None
    if result.rc != 0:
        return None
    return frozenset(line.strip() for line in result.stdout.splitlines() if line.strip())
