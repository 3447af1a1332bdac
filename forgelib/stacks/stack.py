"""``Stack``: the one handle on a provisioned compose stack, which every consumer takes.

Grading, the MCP server and its tools, ``connect``, the agent manifest, ``forge run``'s orchestrator, the
pytest fixture, the inspect sandbox and the harbor environment all hold a ``Stack``; nothing else
describes a live stack. It carries:

* the stack itself: its compose project (``compose``: every container call goes through it), the
  environment it was provisioned from, its labels;
* each service as compose resolved it, typed (``resolved``/``service``: ``docker.resolved``) and the kind
  forge recognises it as (``kind``: ``kinds.registry.detect``);
* how to reach a service: from the host (``ports``, what it publishes; ``port``/``url``, one published
  port; the kinds' clients through ``stacks.connect``) and from inside the stack (``inside``: the
  service name on the compose network);
* the facts of the trial it was provisioned for (``trial_dir``, ``timings``, ``bare_seeds``, ``source``:
  fresh, warm or shared; ``pooled``; ``prepared``; ``snapshots``).

Why one value and not a stack plus a separate trial record: every stack forge provisions is provisioned
*for* one owner (a trial, a fixture, a sample), and the per-trial facts are few, immutable and written by
the one place that provisions (``stacks.provision``, then the warm pool or shared stacks stamp
``source``). A second record would have to be threaded next to the stack through every consumer that
writes trial.yaml, for no consumer that wants one without the other.

``ServiceAccess`` is the one narrow interface beside it: run a command in a service and find a published
port. ``Stack`` and its ``compose`` have it; so do grading's read-once view of a stack (``grading.checks.
ReadOnce``) and a unit test's fake. Grading and the oracle take it because they also run against that
view; everything that needs more of the stack takes ``Stack``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol, Required, TypedDict, Unpack

from forgelib.docker.compose import ComposeProject
from forgelib.docker.resolved import ResolvedConfig, ServiceConfig
from forgelib.errors import ForgeError
from forgelib.kinds import registry as kinds
from forgelib.kinds.base import PreparedSeed, SeedMount
from forgelib.kinds.kind import Kind
from forgelib.runner import Result
from forgelib.spec.models import EnvironmentManifest


class ExecOptions(TypedDict, total=False):
    """The keywords of ``ServiceAccess.exec`` (``ComposeProject.exec`` documents them), written once for
    the protocol, the stack and the test double."""

    stdin: Path | None
    input: str | None
    timeout: Required[float]  # checks and the oracle always bound a command
    env: Mapping[str, str] | None
    workdir: str | None
    check: bool
    secrets: Sequence[str]
    stdout_path: Path | None
    stderr_path: Path | None


class ServiceAccess(Protocol):
    """Run a bounded command in a service; find where the host reaches one of its ports."""

    def exec(self, service: str, argv: Sequence[str], **options: Unpack[ExecOptions]) -> Result: ...

    def port(self, service: str, container_port: int) -> tuple[str, int]: ...


@dataclass(frozen=True)
class Stack:
    """A provisioned stack and the trial it was provisioned for (module docstring)."""

    name: str  # the compose project name
    environment: EnvironmentManifest
    compose: ComposeProject
    timings: dict[str, float]
    bare_seeds: dict[str, SeedMount]  # service -> its seed's extra mount (Recipe.seed_mount; trial.yaml)
    trial_dir: Path
    labels: Mapping[str, str] = field(default_factory=dict)
    shared: bool = False  # the run's shared stack: teardown_trial leaves it to teardown_run
    config: Mapping[str, Any] = field(default_factory=dict)  # `docker compose config`, as compose wrote it
    # service -> ["127.0.0.1:49153->5432/tcp", ...]: where the host reaches what the stack publishes
    ports: Mapping[str, list[str]] = field(default_factory=dict)
    # Warm stacks: each reset service's recipe, what its `prepare` built and its baseline fingerprint.
    prepared: tuple[PreparedSeed, ...] = ()
    # How the trial got its stack: {"mode": "fresh"|"warm"|"shared", "name", "reuse", "replaced"}
    # (trial.yaml's `stack:`).
    source: Mapping[str, Any] = field(default_factory=dict)
    # A warm pool's stack: giving it back resets it for a later trial instead of tearing it down.
    pooled: bool = False
    # service -> what its golden did (restored / captured / none, discarded with the reason): trial.yaml
    snapshots: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The ephemeral services whose image VOLUMEs are each container's own (``labels_override``'s
    # ``per_container``), as provisioning decided: a warm pool's successors follow the same decision.
    own_volumes: tuple[str, ...] = ()

    # ------------------------------------------------------------------------------ its services

    @cached_property
    def resolved(self) -> ResolvedConfig:
        """The resolved compose config, typed."""
        return ResolvedConfig.of(self.config)

    @property
    def services(self) -> tuple[str, ...]:
        """The stack's services, in compose's order."""
        return tuple(self.resolved.services)

    def service(self, name: str) -> ServiceConfig:
        """``name`` as compose resolved it; a clear error when the stack has no such service."""
        services = self.resolved.services
        if name not in services:
            known = ", ".join(sorted(services)) or "(none)"
            raise ForgeError(f"the stack has no service {name!r}; services: {known}")
        return services[name]

    def kind(self, name: str) -> Kind | None:
        """The kind ``name`` is recognised as (``kinds.registry.detect``); None: no server kind."""
        return kinds.detect(self.service(name))

    # ------------------------------------------------------------------------------ reaching them

    def exec(self, service: str, argv: Sequence[str], **options: Unpack[ExecOptions]) -> Result:
        """``argv`` in ``service`` (``ComposeProject.exec``)."""
        return self.compose.exec(service, argv, **options)

    def port(self, service: str, container_port: int) -> tuple[str, int]:
        """Where the host reaches ``service:container_port`` (it must be published)."""
        return self.compose.port(service, container_port)

    def url(self, service: str, container_port: int, path: str = "", *, scheme: str = "http") -> str:
        """``scheme://host:port/path`` of a published port, from the host."""
        host, port = self.port(service, container_port)
        return f"{scheme}://{host}:{port}/{path.lstrip('/')}"

    @staticmethod
    def inside(service: str, container_port: int) -> str:
        """``service:port``: how another container of the stack reaches it (the compose network's DNS)."""
        return f"{service}:{container_port}"


class TrialRequest(TypedDict, total=False):
    """Which trial a stack is provisioned for (``provision.TrialSpec``'s fields but the task: what the
    orchestrator decides), written once for every backend."""

    run_id: Required[str]
    trial_index: Required[int]
    trial_dir: Required[Path]
    on_phase: Callable[[str, float], None] | None  # (phase, seconds) as each provisioning phase ends
    attempt: int  # > 1: a retry, on a fresh stack
    checkpoint: str | None  # the stack starts as a fork of this checkpoint (a task's setup: run.setup)
    setup: bool  # the stack a task's setup runs on (its own compose project: ``<task>-setup``)
