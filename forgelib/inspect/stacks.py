"""The stacks behind inspect_ai's ``forge`` sandbox, with no inspect in sight (unit-testable, and the only
place that decides what a sample's stack is).

One ``TaskStacks`` per sandbox config of an ``inspect eval`` process (inspect calls ``task_init`` once per
config): the project loaded and verified, a run id naming the process's stacks on their labels, an owned
temp dir for the trials' override files and logs, and its stacks opened as ``forge run`` opens its own
(``stacks.open``: the live-stack registry, the memory budget and start bound, a backend fresh or with a
warm pool: the same provisioning, reset, fingerprint and golden code, not a copy). ``acquire`` gives a
sample its seeded stack; ``release`` hands it back to the warm pool or tears it down; ``close`` leaves
nothing of the task.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from forgelib.errors import ForgeError, ProvisionError
from forgelib.runner import Runner
from forgelib.spec.loader import load_project_config
from forgelib.spec.models import EnvironmentManifest, Project, Task, Timeouts
from forgelib.stacks.budget import mem_available, usable_cores
from forgelib.stacks.hosted import HostedStacks
from forgelib.stacks.provision import DEFAULT_TASK
from forgelib.stacks.reaper import INSPECT_DIR
from forgelib.stacks.stack import Stack

log = logging.getLogger("forgelib.inspect")

StackMode = Literal["fresh", "warm"]
TASK_METADATA = "forge_task"  # a sample's metadata key naming its forge task (overrides the config's)
RUN_PREFIX = "inspect"
# One stack per sample held at once; what a stack of the reference packs takes while it runs (3-5
# containers: postgres ~60 MiB, a python service ~40 MiB, docker's own share), with room to spare.
MEMORY_PER_STACK = 512 * 1024**2


class SandboxConfigError(ForgeError):
    """The sandbox config (or the project it names) cannot be used; the message names the fix."""


@dataclass(frozen=True)
class Settings:
    """What a ``forge`` sandbox config says, with the project path made absolute."""

    project: Path
    task: str | None = None
    stacks: StackMode = "fresh"
    goldens: bool = False
    default: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)


def default_concurrency() -> int:
    """How many samples' stacks at once fit this machine: two per CPU this process may use (a stack
    mostly waits: on its services' start, on the model), but no more than available memory holds at
    ``MEMORY_PER_STACK`` each; at least 1."""
    available = mem_available() or 2**62  # unknown: the CPUs decide
    return max(1, min(2 * usable_cores(), available // MEMORY_PER_STACK))


def default_service(env: EnvironmentManifest, wanted: str | None, where: str) -> str:
    """inspect's ``default`` sandbox among ``env``'s services: ``wanted`` (the config's ``default``), else
    the service marked ``x-default: true``, else one named ``default``; else a ``SandboxConfigError``
    naming the services and the fix."""
    services: Mapping[str, Any] = env.compose.get("services") or {}
    names = sorted(services)
    listed = ", ".join(names) or "(none)"
    if wanted is not None:
        if wanted not in services:
            raise SandboxConfigError(
                f"{where}: default service {wanted!r} is not a service of "
                f"{env.compose_file}; its services: {listed}. Fix: set default to one of them"
            )
        return wanted
    marked = [n for n in names if (services[n] or {}).get("x-default") is True]
    if len(marked) > 1:
        raise SandboxConfigError(
            f"{where}: services {', '.join(marked)} of {env.compose_file} are all marked x-default; "
            "mark one, or set default in the sandbox config"
        )
    if marked:
        return marked[0]
    if "default" in services:
        return "default"
    raise SandboxConfigError(
        f"{where}: no default service in {env.compose_file} (services: {listed}). Fix: set default in "
        "the sandbox config, e.g. sandbox=SandboxEnvironmentSpec('forge', ForgeConfig(project=..., "
        f"default={names[0] if names else 'SERVICE'!r})), mark one service `x-default: true`, or name one "
        "`default`"
    )


@dataclass(frozen=True)
class SampleStack:
    """One sample's stack, as the sandbox sees it: a view of the one ``Stack`` handle (``stack``: what
    grading, the MCP tools and ``connect`` take), holding nothing of the stack's own. What it adds is the
    sample's: the forge task it runs (grading reads it), which service is inspect's ``default`` sandbox,
    and the config's timeouts."""

    stack: Stack
    task: Task
    default: str
    timeouts: Timeouts

    @property
    def name(self) -> str:
        return self.stack.name

    @property
    def services(self) -> tuple[str, ...]:
        """The stack's services, inspect's default first (inspect takes the first as ``sandbox()``)."""
        return (self.default, *(s for s in self.stack.services if s != self.default))


class TaskStacks:
    """The stacks of one sandbox config in one process (``HostedStacks``: forge run's own way to open
    stacks, inspect owning the signals: an eval's Ctrl-C reaches us as the task's cleanup), and what a
    sandbox config adds: which forge task a sample runs and which service is inspect's default."""

    def __init__(
        self, settings: Settings, *, runner: Runner | None = None, workers: int | None = None
    ) -> None:
        self.settings = settings
        self.project = load_project(settings.project)
        base = self.resolve_task(None)  # the config's task (or the project's environment) must be usable
        self.base_default = default_service(base.environment, settings.default, self.where)
        self.hosted = HostedStacks(
            self.project,
            mode=settings.stacks,
            goldens=settings.goldens,
            workers=workers or default_concurrency(),
            timeouts=settings.timeouts,
            run_prefix=RUN_PREFIX,
            temp_prefix=INSPECT_DIR,
            host="the eval",
            runner=runner,
        )
        self.run_id = self.hosted.run_id
        self.runner = self.hosted.runner

    @property
    def where(self) -> str:
        return f"sandbox ('forge', {self.settings.project})"

    def start(self) -> None:
        """``task_init``: heal leftovers of dead owners, load the clients resets talk through, and with
        goldens capture them now (one stack of the config's environment, provisioned and torn down)."""
        self.hosted.start()
        if self.settings.goldens and self.settings.stacks == "fresh":  # a warm pool's first stack takes them
            stack = self.acquire(None)
            self.release(stack, interrupted=True)  # torn down: the golden stays, the stack does not

    def resolve_task(self, name: str | None) -> Task:
        """The forge task a sample runs: ``name`` (its metadata's ``forge_task``), else the config's task,
        else the project's default environment (as a task without grading)."""
        chosen = name or self.settings.task
        if chosen is None:
            return Task(DEFAULT_TASK, self.project.path, "", self.project.environment)
        try:
            return self.project.task(chosen)
        except ForgeError as e:
            raise SandboxConfigError(f"{self.where}: {e}") from None

    def acquire(self, task_name: str | None) -> SampleStack:
        """A seeded stack for one sample: fresh, or a warm one reset and fingerprint-verified. Raises
        ``ProvisionError`` (nothing left behind) or ``SandboxConfigError``."""
        task = self.resolve_task(task_name)
        default = (
            self.base_default
            if task_name is None or task_name == self.settings.task
            else default_service(task.environment, self.settings.default, f"{self.where}, task {task.name}")
        )
        return SampleStack(self.hosted.acquire(task), task, default, self.settings.timeouts)

    def release(self, stack: SampleStack, *, interrupted: bool) -> None:
        """The sample is over: a warm stack goes back to its pool (reset before its next sample); a fresh
        one, or any stack of an interrupted sample (not graceful: never reused), is torn down."""
        self.hosted.release(stack.stack, graceful=not interrupted)

    def close(self) -> None:
        """``task_cleanup``: every stack of the task torn down (warm pool, shared stacks, any sample's stack
        still registered), built images removed, the temp dir gone."""
        self.hosted.close()


def load_project(path: Path) -> Project:
    """The project at ``path``, its spec and seed digests verified (``SpecError``: file:line, the fix)."""
    return load_project_config(path)


__all__ = [
    "ProvisionError",
    "SampleStack",
    "SandboxConfigError",
    "Settings",
    "TaskStacks",
    "default_concurrency",
    "default_service",
]
