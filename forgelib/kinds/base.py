"""The types every seed recipe shares: what a recipe sees (``SeedTarget``, ``ApplyContext``) and what it
provides (``Recipe``). Kept apart from the registry in ``__init__`` so recipe modules import them plainly.

A recipe has two lives. On a **fresh** stack ``apply`` seeds a new service. On a **warm** stack (``forge run
--stacks warm``), right after that first ``apply`` and before any dependent starts, ``prepare`` builds what
makes an in-place reset fast (a pristine data directory outside the service, or a template database; the
redis keyspace as dumps; the tree's own mode) and ``fingerprint`` records the state a trial could change
beyond the reset's reach; before every later trial ``reset`` restores the seed in place and
``fingerprint`` must match again, or the stack is replaced (``forgelib.stacks.warm``). Whatever ``prepare``
keeps must be out of a trial's sight and reach, or verified before each reuse (contents, not only
existence).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from forgelib.docker.compose import ComposeProject, ImageProcess
from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import CommandTimeout, ForgeError, Interrupted, RecipeError, tail
from forgelib.runner import Result
from forgelib.spec.models import Seed, Timeouts

T = TypeVar("T")

# Seconds a direct connection (a recipe's, ``forgelib.stacks.connect``'s) waits for a published port: one
# that does not answer is a dead stack, not a slow one.
CONNECT_TIMEOUT = 10


class Memo:
    """Values derived from a seed version, computed once per owner (a run's backend) and shared by its trials.

    Key by what the value is derived from (e.g. the seed's path *and* digest): provisioning re-verifies a
    seed's digest right before every apply, so a value made for that digest still describes the seed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # trials of a run apply the same seed concurrently under --workers
        self._values: dict[Hashable, Any] = {}

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        with self._lock:
            if key not in self._values:
                self._values[key] = make()
            value: T = self._values[key]
            return value


@dataclass(frozen=True)
class SeedTarget:
    """What a recipe's host-side ``check`` sees: the seed and how the service binds it."""

    service: str
    seed: Seed
    options: Mapping[str, Any] = field(default_factory=dict)

    def fail(self, step: str, detail: str) -> RecipeError:
        """The error a recipe raises: which step on which service, and the diagnostics."""
        return RecipeError(f"{step} step on service '{self.service}': {detail}")


@dataclass(frozen=True)
class SeedMount:
    """A seed kind's extra mount (``Recipe.seed_mount``): the seed's host path bind-mounted read-only in its
    service by the trial's override, and the variable that names where (in the service's environment and in
    the oracle's exec when the oracle runs in that service)."""

    service: str
    seed: str
    host_path: Path  # absolute, verified against the seed's digest at load
    path: str  # inside the service
    env_var: str

    def volume(self) -> dict[str, Any]:
        """The override's long-syntax bind mount (read-only: the seed must stay what its digest says)."""
        return {"type": "bind", "source": str(self.host_path), "target": self.path, "read_only": True}

    def env(self) -> dict[str, str]:
        """The variable naming where the seed is mounted: ``{env_var: path}``."""
        return {self.env_var: self.path}

    def record(self) -> dict[str, str]:
        """As trial.yaml (``bare_seeds``) and ``forge provision --json`` show it."""
        return {"seed": self.seed, "host_path": str(self.host_path), "path": self.path, "env": self.env_var}


def no_mount(target: SeedTarget) -> SeedMount | None:
    """``seed_mount`` of a kind that works in the running container and mounts nothing."""
    return None


def no_warm_process(target: SeedTarget, service: ServiceConfig, image: ImageProcess | None) -> None:
    """``warm_process`` of a kind whose reset leaves the service's process as it is."""
    return None


@dataclass(frozen=True, kw_only=True)
class ApplyContext(SeedTarget):
    """``SeedTarget`` plus the live stack: every container call goes through ``compose``."""

    compose: ComposeProject
    # The service as compose resolved it (`docker compose config`), typed: its environment, command, ...
    service_config: ServiceConfig = field(default_factory=lambda: ServiceConfig(""))
    timeouts: Timeouts = field(default_factory=Timeouts)
    memo: Memo = field(default_factory=Memo)  # shared by the trials of one backend (see ``Memo``)

    # (service, container port) -> (host, port) of the loopback publication: looked up once per stack
    # (``docker compose port`` pays the compose CLI's start; the mapping lives as long as the container).
    addresses: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict, compare=False)

    def environment(self) -> Mapping[str, str]:
        return self.service_config.environment

    def address(self, container_port: int) -> tuple[str, int]:
        """Where the host reaches this service's ``container_port`` (published on 127.0.0.1)."""
        key = (self.service, container_port)
        if key not in self.addresses:
            self.addresses[key] = self.compose.port(self.service, container_port)
        return self.addresses[key]


# part name -> sha256 hex of that part's canonical text (``fingerprint_part``). Named parts, so a mismatch
# says what differs ("roles", "config") rather than only that something does.
Fingerprint = dict[str, str]


def fingerprint_part(lines: Any) -> str:
    """The sha256 of ``lines`` (any iterable of rows) rendered one ``repr`` per line: a stable, cheap digest
    of a query's rows or a listing."""
    h = hashlib.sha256()
    for line in lines:
        h.update(repr(line).encode())
        h.update(b"\n")
    return h.hexdigest()


def fingerprint_diff(expected: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """The parts whose digests differ (or that one side lacks), sorted; empty when equal."""
    return sorted(k for k in set(expected) | set(actual) if expected.get(k) != actual.get(k))


@dataclass
class PreparedSeed:
    """One reset service of a warm stack: its context, what ``prepare`` built and the baseline
    ``fingerprint`` taken right after it (both on the first, fresh seeding)."""

    recipe: Recipe
    ctx: ApplyContext
    prepared: object
    baseline: Fingerprint

    def reset(self, restored: Callable[[], None] | None = None) -> None:
        """Put the service back at its seed. ``restored``: called once nothing a trial changed is left
        there, the service perhaps still starting (what a successor may reach then is a fresh stack's
        state or nothing); the recipe's ``reset_staged`` says when."""
        if restored is None:
            self.recipe.reset(self.ctx, self.prepared)
        else:
            self.recipe.reset_staged(self.ctx, self.prepared, restored)

    def fingerprint(self) -> Fingerprint:
        return self.recipe.fingerprint(self.ctx)

    @property
    def restarts(self) -> bool:
        """Whether ``reset`` restarts the service's container (new host ports: the pool reads them again).
        A recipe's prepared object says so with a true ``restarts_container`` attribute."""
        return bool(getattr(self.prepared, "restarts_container", False))


class Recipe(Protocol):
    """What every module in this package provides (modules satisfy it structurally)."""

    @property
    def OPTIONS(self) -> frozenset[str]:
        """The ``reset:`` binding options the recipe understands (anything else is a spec error)."""
        ...

    def check(self, target: SeedTarget) -> None:
        """Host-side guards (the seed has the right shape); never touches a container."""
        ...

    def apply(self, ctx: ApplyContext) -> None:
        """Apply the seed to the running service; raise ``RecipeError`` on any failure."""
        ...

    def prepare(self, ctx: ApplyContext) -> object:
        """Warm preparation, right after ``apply`` on a fresh stack (dependents not started yet): build what
        ``reset`` restores from and return it (opaque to everyone else). Raise ``RecipeError``."""
        ...

    def checkpoint_prepare(self, ctx: ApplyContext) -> object:
        """``prepare`` for a warm stack whose service started from a checkpoint
        (``forgelib.stacks.checkpoints``): ``reset`` must then restore the state the service holds now, not
        its seed. A kind whose ``prepare`` captures the live state already names ``prepare``."""
        ...

    def reset(self, ctx: ApplyContext, prepared: object) -> None:
        """Restore the seed in place, from what ``prepare`` returned; raise ``RecipeError`` when it cannot
        (the stack is then replaced, never trusted)."""
        ...

    def reset_staged(self, ctx: ApplyContext, prepared: object, restored: Callable[[], None]) -> None:
        """``reset``, calling ``restored`` as soon as nothing a trial changed is left in the service, which
        may be before ``reset`` would return (the server still starting), so that what waits on the reset
        starts beside that wait (``PreparedSeed.reset``). A kind with no such earlier moment names
        ``reset_after(reset)``."""
        ...

    def fingerprint(self, ctx: ApplyContext) -> Fingerprint:
        """A cheap digest of the state a trial could change that ``reset`` does not restore (named parts).
        Equal right after the seeding and after each reset, or the stack is dirty. Raise ``RecipeError``."""
        ...

    def direct_port(self, service_config: ServiceConfig) -> int | None:
        """The container port forge talks to directly (published on 127.0.0.1 by the override), or None
        when the recipe works through ``compose exec``/``cp`` only."""

    def seed_mount(self, target: SeedTarget) -> SeedMount | None:
        """What the trial's override mounts in the service for this seed before it starts (a ``SeedMount``:
        read-only bind, and its variable), or None (``no_mount``): the kind's say in every override."""
        ...

    def warm_process(
        self, target: SeedTarget, service: ServiceConfig, image: ImageProcess | None
    ) -> Mapping[str, Any] | None:
        """What every override sets on the service to run its process (``entrypoint``, ``command``:
        ``kinds.supervisor.wrap``), from its config and its image's defaults (None: not present locally);
        None leaves them alone (``no_warm_process``). The kind's say in every override (fresh, warm,
        golden, fork): what runs for its warm reset runs in a fresh stack too, or a trial could tell."""
        ...

    @property
    def RECIPE_VERSION(self) -> int:
        """Part of every golden's key: bump it when ``apply`` would write different bytes."""
        ...

    @property
    def SUPPORTS_GOLDEN(self) -> bool:
        """Whether a fresh stack may start this kind's service from a golden
        (``forgelib.stacks.snapshots``)."""
        ...

    def golden_path(self, ctx: ApplyContext) -> str | None:
        """The container directory holding the seeded state, asked of the live service (a golden captures
        it); None when the kind has no golden (its ``apply`` is the copy a golden would be)."""
        ...

    def golden_fingerprint(self, ctx: ApplyContext) -> Fingerprint:
        """``fingerprint`` plus whatever of the seeded state it leaves out (it may: a warm reset rewrites
        that part anyway). Taken when a golden is captured and compared after each restore, so a golden
        that restores wrong or empty state is caught. Raise ``RecipeError``."""
        ...

    def checkpoint_path(self, ctx: ApplyContext) -> str | None:
        """A checkpoint's capture of the live service (``forgelib.stacks.checkpoints``): write whatever
        the server holds only in memory to its files (redis: ``SAVE``) and name the container directory
        that then holds the service's whole state; None when the kind has no state to checkpoint. Called
        with the stack's other services paused, right before this one is paused and copied."""
        ...

    def checkpoint_settle(self, ctx: ApplyContext, copy_dir: str) -> Sequence[str] | None:
        """The command that brings a checkpoint's copy of ``checkpoint_path`` to the state a clean stop
        leaves, so that no fork pays a crash recovery: run once at capture, in a throwaway container of
        the service's own image (no network, as the directory's owner, stdin empty) with the copy at
        ``copy_dir``; a non-zero exit fails the checkpoint. None (``no_settle``): the copy is used as
        taken."""
        ...

    def checkpoint_restore(self, ctx: ApplyContext, copy: CheckpointCopy) -> bool:
        """Put the live service back at a checkpoint's capture **in place**, the way its warm reset
        restores the seed (``forgelib.stacks.checkpoints.restore``): the same container, its server
        restarted inside it or not at all; True once done (the caller then checks the fingerprint), False
        when the kind cannot here (``no_checkpoint_restore``; a data directory not under the loop): the
        caller restores through the checkpoint's image instead. Raise ``RecipeError`` on a failure."""
        ...


def reset_after(
    reset: Callable[[ApplyContext, object], None],
) -> Callable[[ApplyContext, object, Callable[[], None]], None]:
    """``reset_staged`` of a kind whose ``reset`` has no earlier moment than its end at which a trial's
    changes are gone: ``restored`` is called once ``reset`` returned."""

    def reset_staged(ctx: ApplyContext, prepared: object, restored: Callable[[], None]) -> None:
        reset(ctx, prepared)
        restored()

    return reset_staged


def no_checkpoint(ctx: ApplyContext) -> str | None:
    """``checkpoint_path`` of a kind whose state is not in its service (``bare``: a read-only mount)."""
    return None


def no_settle(ctx: ApplyContext, copy_dir: str) -> Sequence[str] | None:
    """``checkpoint_settle`` of a kind whose copy needs nothing run on it (redis's dump, a tree)."""
    return None


def no_golden(ctx: ApplyContext) -> str | None:
    """``golden_path`` of a kind with ``SUPPORTS_GOLDEN = False``: it has no data directory to snapshot."""
    return None


@dataclass(frozen=True)
class CheckpointCopy:
    """What ``Recipe.checkpoint_restore`` restores from: the checkpoint's image of one service, holding
    the captured ``path`` (digest-verified before use), and ``key``: hex naming that content (the image
    ID's), for what a kind stages or keeps of it. ``labels``: the ones a helper container it creates
    carries (the service's forge labels: ``forge reap`` finds one a kill left)."""

    image: str
    path: str
    key: str
    labels: Mapping[str, str] = field(default_factory=dict)
    info: Mapping[str, Any] = field(default_factory=dict)  # the service container's ``docker inspect``


def no_checkpoint_restore(ctx: ApplyContext, copy: CheckpointCopy) -> bool:
    """``checkpoint_restore`` of a kind with no in-place restore: the checkpoint's image is used."""
    return False


# ------------------------------------------------------------------------------------- observing


class ExecStack(Protocol):
    """What an observer needs of a live stack: run a bounded command in a service (as
    ``ComposeProject.exec``) and find a published port."""

    def exec(self, service: str, argv: Sequence[str], *, timeout: float, check: bool = ...) -> Result: ...

    def port(self, service: str, container_port: int) -> tuple[str, int]: ...


class ObservationError(Exception):
    """A check could not observe the state (its message becomes the check's reason)."""


def exec_failure(shown: str, service: str, failure: ForgeError | Result) -> str:
    """How a command exec'd in a service failed, in one sentence (checks and the oracle say it alike)."""
    where = f"`{shown}` in service {service!r}"
    if isinstance(failure, CommandTimeout):
        return f"{where} timed out after {failure.timeout:g}s"
    if isinstance(failure, ForgeError):  # a missing program, docker failing to exec
        return f"{where} could not run: {failure}"
    return f"{where} exited {failure.rc}: {tail(failure.stderr or failure.stdout, 5) or '(no output)'}"


def observe_exec(stack: ExecStack, service: str, argv: Sequence[str], timeout: float) -> str:
    """``argv``'s stdout in ``service``; ``ObservationError`` saying how it failed otherwise."""
    try:
        r = stack.exec(service, argv, timeout=timeout, check=False)
    except Interrupted:  # the stop killed or refused it: no observation, and no failed check either
        raise
    except ForgeError as e:
        raise ObservationError(exec_failure(" ".join(argv), service, e)) from None
    if r.rc != 0:
        raise ObservationError(exec_failure(" ".join(argv), service, r))
    return r.stdout


# ------------------------------------------------------------------------------------- MCP tools


class ToolFailure(Exception):
    """A tool call that could not be carried out; ``str()`` is what the agent is told."""


class ToolContext(Protocol):
    """What a kind's tool backend gets from the trial's toolbox: commands in a service and its published
    ports, each failure already a ``ToolFailure``."""

    def run(self, service: str, argv: Sequence[str], timeout: float, input: str | None = None) -> Result: ...

    def published(self, service: str, port: int) -> tuple[str, int] | None: ...


class ToolBackend(Protocol):
    """A kind's answer to its tools (``Kind.tools``) for one trial: ``call`` carries out one call on a
    service recognised as the kind (thread-safe); ``close`` drops its connections."""

    def __init__(self, ctx: ToolContext) -> None: ...

    def call(self, tool: str, service: str, svc: ServiceConfig, args: Mapping[str, Any]) -> str: ...

    def close(self) -> None: ...


# ------------------------------------------------------------------------------------- direct clients

# Where a container port of a service is reached: (host, port) published on the host, or (service name,
# port) from inside the stack (``forgelib.stacks.connect.address``).
Address = Callable[[int], tuple[str, int]]


class Client(Protocol):
    """A kind's client module (``Kind.client``): how forge, a test or an agent reaches a service of the
    kind directly. Each function takes the service as compose resolved it, its seed binding's ``options``
    (user, database, ...; empty when unbound) and ``address``. ``forgelib.stacks.connect`` dispatches to it
    by the service's kind, so a kind registered with a client is reachable from ``connect`` and the pytest
    fixture with no code outside its package.

    ``params`` also takes the kind's own keywords, keyword-only, which choose the connection (postgres and
    mysql: ``database``; redis: ``db``), and returns a frozen value with ``url()`` (the connection as a
    URL, for code that connects itself) and ``client(**how)`` (an open client with ``close()``: psycopg,
    PyMySQL, redis-py; ``how``: ``autocommit``, ``decode_responses``). ``connect.client`` hands
    ``params`` the keywords it names and the rest to ``client``."""

    def params(
        self, service_config: ServiceConfig, options: Mapping[str, Any], address: Address, /, **keywords: Any
    ) -> Any:
        """The connection's parameters: a frozen value with ``url()`` and ``client(**how)``."""

    def connection_strings(
        self, service_config: ServiceConfig, options: Mapping[str, Any], address: Address
    ) -> dict[str, str]:
        """What the agent's manifest gives for the service."""


CLIENT_MEMBERS = ("params", "connection_strings")  # what test_kind_clients checks each has


def tool_failed(r: Result, what: str) -> str:
    return f"{what}: {tail(r.stderr or r.stdout, 5).strip() or f'exit status {r.rc}'}"


def as_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def sql_result(
    columns: Sequence[Any], rows: Sequence[Sequence[Any]], *, limit: int, rowcount: int, status: str | None
) -> str:
    """``sql_query``'s answer, whichever SQL server ran it: at most ``limit`` rows, the rest counted."""
    return as_json(
        {
            "columns": list(columns),
            "rows": [list(r) for r in rows[:limit]],
            "rowcount": rowcount,
            "status": status,
            "rows_truncated": len(rows) > limit,
        }
    )
