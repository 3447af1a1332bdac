"""The stacks behind harbor's ``forge`` environment, with no harbor in sight (unit-testable, and the only
place that decides what a harbor trial's stack is).

The task contract: a harbor task's ``environment/`` holds a compose file whose agent service is named
``main`` (harbor's main service) and a forge ``project.yaml`` beside it (``default_environment`` naming
that compose file, its seeds and each service's isolation); optionally a forge ``grading.yaml``.

One ``TaskStacks`` per (forge spec, mode) in a ``harbor run`` process, kept in a process-wide registry:
harbor runs a job's trials as asyncio tasks of one process and builds a new environment object per trial,
so the warm pool that lets attempt 2 reuse attempt 1's stack has to outlive the environment objects. The
registry is emptied at the process's exit (``close_all``, registered with ``atexit``): every stack torn
down, the temp dir removed. A killed process leaves stacks labelled with its pid: ``forge reap``.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from forgelib.errors import ForgeError
from forgelib.runner import Runner
from forgelib.spec.loader import PROJECT_FILE, load_grading, load_project_config
from forgelib.spec.models import Isolation, Task, Timeouts
from forgelib.stacks.budget import usable_cores
from forgelib.stacks.hosted import HostedStacks
from forgelib.stacks.provision import DEFAULT_TASK
from forgelib.stacks.reaper import HARBOR_DIR
from forgelib.stacks.stack import Stack

log = logging.getLogger("forgelib.harbor")

MAIN = "main"  # harbor's main service (harbor.constants.MAIN_SERVICE_NAME): the agent's container
GRADING_FILE = "grading.yaml"
RUN_PREFIX = "harbor"
StackMode = Literal["fresh", "warm"]
STACK_MODES: tuple[StackMode, ...] = ("fresh", "warm")


class HarborTaskError(ForgeError):
    """The harbor task cannot run on forge as it is; the message names the file and the fix."""


@dataclass(frozen=True)
class Mode:
    """How a job's trials get their stacks (harbor's ``--ek stacks=… --ek goldens=…``)."""

    stacks: StackMode = "fresh"
    goldens: bool = False
    workers: int = 0  # a warm pool's most stacks at once; 0: one per core this process may use


def spec_file(environment_dir: Path) -> Path:
    """The task's forge ``project.yaml``, or a ``HarborTaskError`` saying what to add."""
    spec = environment_dir / PROJECT_FILE
    if spec.is_file():
        return spec.resolve()
    composes = (
        sorted(p.name for p in environment_dir.glob("*compose*.y*ml")) if environment_dir.is_dir() else []
    )
    compose = composes[0] if composes else "docker-compose.yaml"
    raise HarborTaskError(
        f"{environment_dir}: no forge spec ({PROJECT_FILE}) beside the task's compose file. Fix: add "
        f"{spec} with `name: <task>` and `default_environment: {{compose_file: {compose}, services: "
        f"{{main: {{isolation: ephemeral}}}}}}` (plus the seeds and `isolation: reset` of the services to "
        "reset between trials), or run the task with harbor's own docker environment (--env docker)"
    )


def load_task(environment_dir: Path) -> Task:
    """The forge task of a harbor task's ``environment/``: its project (spec and seed digests verified:
    ``SpecError`` with file:line and the fix), its environment, and its ``grading.yaml`` if it has one."""
    project = load_project_config(spec_file(environment_dir))
    env = project.environment
    services = env.compose.get("services") or {}
    if MAIN not in services:
        raise HarborTaskError(
            f"{env.compose_file}: no service named {MAIN!r} (its services: {', '.join(sorted(services))}). "
            f"Fix: name the agent's service {MAIN!r}: harbor runs the agent, its setup and the verifier there"
        )
    main = env.services.get(MAIN)
    if main is not None and main.isolation is not Isolation.EPHEMERAL:
        raise HarborTaskError(
            f"{project.path}: service {MAIN!r} is {main.isolation.value}. Fix: make it "
            "`isolation: ephemeral` (the agent's container: a new one every trial, so no trial sees "
            "another's files or logs)"
        )
    grading_path = environment_dir / GRADING_FILE
    grading = load_grading(grading_path, services) if grading_path.is_file() else None
    return Task(DEFAULT_TASK, project.path, "", env, grading=grading)


class TaskStacks(HostedStacks):
    """The stacks of one forge spec in one mode, for every trial of a ``harbor run`` that uses it
    (``HostedStacks``: harbor owns the signals; its event loop's end closes them)."""

    def __init__(self, spec: Path, mode: Mode, *, runner: Runner | None = None) -> None:
        self.spec = spec
        super().__init__(
            load_project_config(spec),
            mode=mode.stacks,
            goldens=mode.goldens,
            workers=mode.workers or usable_cores(),
            timeouts=Timeouts(),
            run_prefix=RUN_PREFIX,
            temp_prefix=HARBOR_DIR,
            host="the harbor run",
            runner=runner,
        )
        self._furnish_lock = threading.Lock()
        self._furnished: dict[str, tuple[str, ...]] = {}  # service -> the dirs its successors come with
        # Healing removes dead owners' leftovers only, and the clients are needed by the first reset at the
        # earliest: both on a thread while the first trial's stack comes up (``close`` waits for it).
        self._starting = threading.Thread(target=self._start, name="forge-harbor-start", daemon=True)
        self._starting.start()

    def furnish(self, service: str, dirs: Sequence[str]) -> None:
        """Have the warm pool make ``dirs`` (absolute paths, mode 777, as harbor's ``ensure_dirs`` does) in
        each successor of ``service`` before it starts, off every trial's path. The first caller's dirs
        hold for the run; fresh stacks and dirs that are not plain absolute paths are left to the caller."""
        pool = self.backend.pool
        if pool is None or not dirs or any(not _plain(d) for d in dirs):
            return
        with self._furnish_lock:
            if service in self._furnished:
                return
            where = self.root() / f"furnish-{service}"
            for d in dirs:
                path = where / d.lstrip("/")
                path.mkdir(parents=True, exist_ok=True)
                for parent in path.relative_to(where).parents:  # as `mkdir -p` under umask 022 makes them
                    if parent != Path():
                        (where / parent).chmod(0o755)
            for d in dirs:
                (where / d.lstrip("/")).chmod(0o777)
            self._furnished[service] = tuple(dirs)
            pool.furnish[service] = where

    def furnished(self, trial: Stack, service: str, dirs: Sequence[str]) -> bool:
        """Whether ``trial``'s ``service`` container came with ``dirs`` made (``furnish``)."""
        with self._furnish_lock:
            made = self._furnished.get(service)
        return made == tuple(dirs) and service in trial.source.get("furnished", ())

    def _start(self) -> None:
        try:
            self.start()
        except Exception as e:  # noqa: BLE001  # a courtesy to earlier runs; the resets load what they use
            log.warning("forge: starting the harbor run's stacks: %s", e)

    def close(self) -> None:
        self._starting.join()
        super().close()


_registry: dict[tuple[Path, Mode], TaskStacks] = {}
_registry_lock = threading.Lock()


def stacks_for(spec: Path, mode: Mode) -> TaskStacks:
    """The process's ``TaskStacks`` of ``spec`` in ``mode``, made by the first trial that asks."""
    with _registry_lock:
        found = _registry.get((spec, mode))
        if found is None:
            found = _registry[(spec, mode)] = TaskStacks(spec, mode)
        return found


def close_all() -> None:
    """The ``harbor run`` is ending (done, or Ctrl-C): every stack of every spec torn down. Called as
    harbor's event loop ends (``forgelib.harbor.environment``), and once more at the interpreter's exit
    in case that was skipped."""
    with _registry_lock:
        left = list(_registry.values())
        _registry.clear()
    for stacks in left:
        try:
            stacks.close()
        except (ForgeError, RuntimeError) as e:  # RuntimeError: too late, the interpreter refuses threads
            log.warning("forge: %s; `forge reap` removes what is left", e)


def _at_exit(fn: Callable[[], None]) -> None:
    """Run ``fn`` as the interpreter shuts down, while thread pools still take work (a warm pool tears its
    stacks down on one): ``threading``'s exit hooks run before ``concurrent.futures`` refuses new work,
    ``atexit``'s after (CPython has had the hook since 3.9; elsewhere ``atexit`` is the best there is)."""
    hook = getattr(threading, "_register_atexit", None)
    if hook is None:
        atexit.register(fn)
    else:
        hook(fn)


_at_exit(close_all)


def _plain(path: str) -> bool:
    """An absolute path below the root with no ``..``: one that names a directory to copy in."""
    parts = PurePosixPath(path).parts
    return path.startswith("/") and len(parts) > 1 and all(p not in ("..", ".", "") for p in parts[1:])


def describe(trial: Stack, run_id: str) -> dict[str, Any]:
    """What a trial's record says about its stack: which, how it came (fresh, or warm: reused, reset,
    replaced), its goldens and timings."""
    how = dict(trial.source) or {"mode": "fresh"}
    return {
        "stack": trial.name,
        "run_id": run_id,
        "mode": how.get("mode", "fresh"),
        "reuse": how.get("reuse", 0),
        "reset_ahead": how.get("reset_ahead"),
        "replaced": how.get("replaced"),
        "services": sorted(trial.environment.services),
        "goldens": {svc: dict(g) for svc, g in trial.snapshots.items()},
        "timings": {k: round(v, 3) for k, v in trial.timings.items()},
    }


__all__ = [
    "GRADING_FILE",
    "MAIN",
    "STACK_MODES",
    "HarborTaskError",
    "Mode",
    "TaskStacks",
    "close_all",
    "describe",
    "load_task",
    "spec_file",
    "stacks_for",
]
