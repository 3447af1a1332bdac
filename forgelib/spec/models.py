"""Typed, immutable models of a loaded project. Produced only by ``spec.loader.load_project_config``.

Paths here are absolute and already checked (inside the project, right type); digests verified.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from forgelib.errors import SpecIssue
from forgelib.kinds import RESET_STRATEGIES, SEED_KINDS
from forgelib.mcp.names import DEFAULT_TOOLS

# Kinds of seed: the names the kinds accept (``forgelib.kinds``), e.g. ``SeedKind.SQL_DUMP``.
SeedKind = StrEnum("SeedKind", {name.upper(): name for name in SEED_KINDS})  # type: ignore[misc]


class Isolation(StrEnum):
    RESET = "reset"  # fresh per trial, then the bound seed is applied
    EPHEMERAL = "ephemeral"  # fresh per trial, no seed (the default for unlabelled compose services)
    SHARED = "shared"  # one instance for the whole run


def frozen_map(d: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class Seed:
    name: str
    path: Path  # absolute, resolved, inside the project root
    kind: str  # a SeedKind
    digest: str  # "sha256:<hex>", verified against the bytes at load


# How a warm stack resets a seeded service (``reset: {strategy: ...}``): the names the kinds accept
# (``Kind.strategies``; what each does: its kind's seed module), e.g. ``ResetStrategy.TEMPLATE``.
ResetStrategy = StrEnum("ResetStrategy", {n.upper(): n for n in RESET_STRATEGIES})  # type: ignore[misc]


class Checkpointing(StrEnum):
    """What a checkpoint does with a service (``checkpoint:`` in its labels; ``stacks.checkpoints``)."""

    CAPTURE = "capture"  # captured by its kind; forks start from the capture
    FRESH = "fresh"  # not captured; forks start it as a new stack would (its seed, or its image)


@dataclass(frozen=True)
class ResetBinding:
    seed: str
    # Recipe options: sql_dump {user, database, strategy}; filesystem_dir {target}; redis_dump {}; bare {}.
    options: Mapping[str, Any] = field(default_factory=frozen_map)

    @property
    def strategy(self) -> ResetStrategy:
        return ResetStrategy(self.options.get("strategy") or "exact")


@dataclass(frozen=True)
class Service:
    name: str
    isolation: Isolation
    reset: ResetBinding | None = None
    checkpoint: Checkpointing | None = None  # None: the default (capture a reset service, else fresh)

    @property
    def captured(self) -> bool:
        """Whether a checkpoint captures it: a reset service unless it says ``checkpoint: fresh`` (its
        kind may still have nothing to capture: a bare seed's mount), never another one."""
        return self.isolation is Isolation.RESET and self.checkpoint is not Checkpointing.FRESH


@dataclass(frozen=True)
class EnvironmentManifest:
    # Absolute, in compose's order (later files override earlier ones). The first is the primary file: its
    # directory is compose's project directory (where `.env` is read and relative paths start).
    compose_files: tuple[Path, ...]
    # Every service the compose file defines; unlabelled ones are EPHEMERAL.
    services: Mapping[str, Service]
    # The compose file's parsed content (for recipes that read e.g. `environment` or `command`).
    compose: Mapping[str, Any] = field(default_factory=frozen_map)

    @property
    def requires_per_trial(self) -> bool:
        """Per-trial stacks unless every service is shared (then: one stack for the run, no recipes)."""
        return any(s.isolation is not Isolation.SHARED for s in self.services.values())

    @property
    def compose_file(self) -> Path:
        """The primary compose file (the first of ``compose_files``)."""
        return self.compose_files[0]

    def reset_services(self) -> tuple[Service, ...]:
        return tuple(s for s in self.services.values() if s.isolation is Isolation.RESET)

    def ephemeral(self, services: Iterable[str]) -> list[str]:
        """Of ``services`` (a resolved config's), the ones new every trial: neither reset nor shared (one
        the manifest does not list is ephemeral, as an unlabelled one)."""
        kept = (Isolation.RESET, Isolation.SHARED)
        return [n for n in services if (s := self.services.get(n)) is None or s.isolation not in kept]


@dataclass(frozen=True)
class Oracle:
    """The reference solution that stands in for an agent: run in ``service`` with a timeout.

    Either ``command`` (argv, exec'd in the service) or ``script`` (a host file streamed to
    ``interpreter`` on stdin, e.g. ``["sh", "-s"]`` or ``["python3", "-"]``).
    """

    service: str
    command: tuple[str, ...] | None = None
    script: Path | None = None
    interpreter: tuple[str, ...] = ("sh", "-s")
    timeout: float = 300.0
    env: Mapping[str, str] = field(default_factory=frozen_map)
    workdir: str | None = None


HOST = "host"  # an agent's ``where`` for a process on this machine (else: a compose service's name)


@dataclass(frozen=True)
class Agent:
    """A command agent: what solves every trial of a run instead of each task's oracle
    (``forgelib.run.agent`` runs it). ``where`` is ``host`` or the compose service it is exec'd in."""

    command: tuple[str, ...]
    where: str = HOST
    timeout: float = 600.0
    env: Mapping[str, str] = field(default_factory=frozen_map)
    workdir: str | None = None
    source: Path | None = None  # the file that declared it: a host agent's working directory is its folder
    name: str = ""

    @property
    def on_host(self) -> bool:
        return self.where == HOST

    @property
    def label(self) -> str:
        return self.name or Path(self.command[0]).name


# How a check compares what it observed with what it expects (the loader and grading share the one list).
MATCHERS = ("equals", "contains", "icontains", "regex", "not_contains")


@dataclass(frozen=True)
class Check:
    """One deterministic check. ``type`` is file | sql | redis | http (the stack's state) or trace (the
    agent's tool calls, ``run.tracecheck``); ``spec`` its fields."""

    name: str
    type: str
    spec: Mapping[str, Any]
    weight: float = 1.0
    gate: bool = False  # severity: gate — a violation fails the trial whatever the score


@dataclass(frozen=True)
class Judge:
    """A user-supplied scorer (the hook for a model-based judge): ``command`` (argv) runs in ``service``,
    or on the host (``service`` None; cwd: the grading file's directory) through the runner seam, with
    ``input`` (a file read from a service) on its stdin; it prints ``{"score": 0..1, "reason": "..."}``."""

    command: tuple[str, ...]
    service: str | None = None
    input_service: str | None = None
    input_path: str | None = None
    timeout: float = 60.0
    env: Mapping[str, str] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class Component:
    """One weighted part of the score: exactly one of ``checks`` (scored by weight), ``alternatives``
    (named routes, each a list of checks scored as a whole; the best route's score counts) or ``judge``."""

    name: str
    weight: float
    checks: tuple[Check, ...] = ()
    alternatives: Mapping[str, tuple[Check, ...]] = field(default_factory=frozen_map)
    judge: Judge | None = None

    @property
    def kind(self) -> str:
        return "judge" if self.judge is not None else "alternatives" if self.alternatives else "checks"


@dataclass(frozen=True)
class Grading:
    path: Path
    checks: tuple[Check, ...]  # the flat form: every check scored by weight (gates among them)
    threshold: float = 1.0  # weighted score >= threshold -> binary_pass
    gates: tuple[Check, ...] = ()  # outside any component or route: a violated one fails the trial
    components: tuple[Component, ...] = ()  # the weighted form (replaces ``checks``)


@dataclass(frozen=True)
class Task:
    name: str
    path: Path  # the task.yaml
    description: str
    environment: EnvironmentManifest  # effective: the project's, merged with the task's manifest
    oracle: Oracle | None = None
    grading: Grading | None = None
    instruction: str = ""
    # The MCP tools the trial's tool server offers (task.yaml `tools:`; forgelib.mcp.names), and whether
    # task.yaml named them (then even its oracle gets a server, and its run a trace).
    tools: tuple[str, ...] = DEFAULT_TOOLS
    tools_declared: bool = False
    # task.yaml `setup:`: run once per task on one stack (the oracle's fields); its end state is
    # checkpointed and every trial of the task starts from a fork of it (docs/checkpoints.md).
    setup: Oracle | None = None


@dataclass(frozen=True)
class Timeouts:
    """Seconds per phase; every external call made in that phase is bounded by it."""

    compose_up: float = 300.0
    recipe: float = 300.0
    oracle: float = 300.0
    grading: float = 60.0
    teardown: float = 120.0
    command: float = 60.0  # any other single command (ps, port, logs, inspect)


# Lines of each service's log a trial keeps (``log_tail_lines``); 0 keeps the whole log.
LOG_TAIL_LINES = 200


@dataclass(frozen=True)
class RunConfig:
    path: Path
    project: Path  # the project directory
    tasks: tuple[str, ...] = ()  # empty: all tasks
    repeats: int = 1
    workers: int = 1
    retries: int = (
        0  # a retryable attempt (oracle timeout, lost engine, judge failure, bug) reruns this often
    )
    cluster: str | None = None  # a Ray address: trials run on its nodes (forgelib.cluster)
    output: Path | None = None  # default: <project>/runs
    stacks: str = (
        "fresh"  # fresh: a stack per trial; warm: one per worker, reset in place (forgelib.stacks.warm)
    )
    capture_logs_on_success: bool = False
    log_tail_lines: int = LOG_TAIL_LINES
    timeouts: Timeouts = field(default_factory=Timeouts)
    profiles: tuple[str, ...] = ()  # compose profiles enabled in every trial's stack
    snapshots: bool = False  # fresh stacks and a warm stack's first provisioning start from goldens
    memory_budget_mb: int | None = None  # None: derived from MemAvailable (forgelib.stacks.budget)
    agent: Agent | None = None  # what solves the trials; None: each task's oracle


@dataclass(frozen=True)
class Project:
    name: str
    root: Path  # the directory holding project.yaml
    path: Path  # project.yaml
    description: str
    seeds: Mapping[str, Seed]
    environment: EnvironmentManifest  # default_environment
    tasks: tuple[Task, ...]
    run_configs: tuple[Path, ...] = ()
    # What validation noted but did not refuse: warnings (risky) and notes (what forge changes in the
    # stacks), said once per run and by `forge validate`.
    notices: tuple[SpecIssue, ...] = ()

    def task(self, name: str) -> Task:
        for t in self.tasks:
            if t.name == name:
                return t
        known = ", ".join(t.name for t in self.tasks) or "(none)"
        from forgelib.errors import ForgeError

        raise ForgeError(f"{self.path}: no task named {name!r}; tasks: {known}")
