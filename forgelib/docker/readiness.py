"""When a stack's containers are ready, decided by us: each container's own healthcheck command, run through
``docker exec`` every ``PROBE_INTERVAL``, instead of compose's ``up --wait``.

Why: compose (and ``depends_on: service_healthy``) sees health only through Docker's healthcheck, which runs
once per ``interval`` and, on Docker 20.10, first only after one whole interval. A postgres that
answers soon after start is "healthy" to compose only at the next tick, its API at the tick after that:
whatever a golden or a warm stack saves is spent waiting on ticks. Running the same command ourselves is the
same criterion, seen as soon as it holds.

``start`` starts created containers (``compose up --no-start``) in ``depends_on`` order: each service as soon
as every dependency's condition holds (``service_started``: its container started; ``service_healthy``: its
healthcheck passed; ``service_completed_successfully``: it exited 0), a service on no dependency chain
only once the chains' heads' starts returned (``_after``), and returns once every service is ready as
``up --wait`` means it (healthy, or running when it has no healthcheck, or exited 0 as a one-shot).
``wait_ready`` is the second half alone, for containers something else started (warm stacks' recreated
services). Docker's own view is read every ``STATE_EVERY`` seconds too: a container that exited, or that
Docker found unhealthy (its healthcheck's ``retries`` used up), fails at once, as ``up --wait`` would.

Each run of the healthcheck costs a ``docker exec`` (the CLI, dockerd, the shim, runc): on the local
engine, once a container's first run failed, the next ones wait until the container listens on something
(``listening``: its sockets, read from the host's ``/proc``), or at the latest ``UNHEARD_EVERY``. A
container that exposes a port (a server) waits so before its first run too: just started, it listens on
nothing yet. The criterion stays the healthcheck; on a remote engine, or where ``/proc`` does not show the
container, every tick runs it as before. A healthcheck that ``hostprobe`` recognises exactly is also
answered from the host every tick, in the container's own namespaces, without an exec: its pass is ready;
while it says no, the real command still runs, every ``HOSTPROBE_EXEC_EVERY`` (``HOSTPROBE_DEAF_EVERY``
while nothing listens), as the authority (what a timeout's message quotes).

Every command goes through the runner, tagged (``start``/``exec``) so a stop refuses or kills it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from forgelib.docker import argv as dk
from forgelib.docker import hostprobe, listening
from forgelib.docker import labels as lab
from forgelib.docker.compose import ComposeProject
from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import CommandTimeout, ForgeError, Interrupted

PROBE_INTERVAL = 0.05  # seconds between two runs of a container's healthcheck command
STATE_EVERY = 0.5  # seconds between two looks at Docker's own state (exited? unhealthy?)
# seconds between two runs of the healthcheck while its container listens on nothing (``listening``)
# (not spaced out further while it stays deaf: a service whose healthcheck passes before it listens, or
# whose listener ``listening`` cannot see, would wait that much longer; benchmarks/README.md "Checkpoints")
UNHEARD_EVERY = 0.3
# seconds between two looks at Docker's state while ``listening`` watches the container's main process too:
# an exit shows there at once; what only the state shows is Docker's own health, which forge's override
# runs seldom (``compose.quiet_healthcheck``)
GATED_STATE_EVERY = 3.0
# seconds between two runs of the real healthcheck while its host probe (``hostprobe``) says no: the
# authority, run seldom, for what the host probe cannot see; the longer pause while its container listens
# on nothing (``listening``), when the real command is all the less likely to pass
HOSTPROBE_EXEC_EVERY = 1.0
HOSTPROBE_DEAF_EVERY = 3.0
# `FORGE_READINESS=compose`: fresh stacks come up by compose's own `up --wait` instead (the benchmarks'
# same-run baseline for what this module saves; not a user setting).
READINESS_ENV = "FORGE_READINESS"
STARTED, HEALTHY, COMPLETED = "service_started", "service_healthy", "service_completed_successfully"


class NotReady(ForgeError):
    """A service did not get ready: it exited, Docker found it unhealthy, or the time ran out. Its text
    says which in compose's words (``unhealthy``, ``exited (N)``, ``timed out``): the ``readiness`` stage."""

    def __init__(self, service: str, text: str) -> None:
        super().__init__(text)
        self.service = service


@dataclass(frozen=True)
class Container:
    service: str
    id: str
    name: str
    health: list[str] | None  # the healthcheck as an argv for `docker exec` (None: it has none)
    probe_timeout: float  # the healthcheck's own timeout
    server: bool = False  # it exposes a port (its image or its compose service): it serves on a socket


def compose_wait() -> bool:
    """Whether fresh stacks should use compose's ``up --wait`` (``FORGE_READINESS=compose``: benchmarks)."""
    return os.environ.get(READINESS_ENV, "") == "compose"


def health_argv(info: Mapping[str, Any]) -> tuple[list[str] | None, float]:
    """The container's healthcheck as an argv for ``docker exec`` (None: it has none), and its timeout."""
    hc = (info.get("Config") or {}).get("Healthcheck") or {}
    test = hc.get("Test") or []
    per_probe = (hc.get("Timeout") or 30_000_000_000) / 1e9
    if not test or test[0] == "NONE":
        return None, per_probe
    if test[0] == "CMD":
        return [str(a) for a in test[1:]], per_probe
    if test[0] == "CMD-SHELL":
        return ["/bin/sh", "-c", str(test[1])], per_probe
    return None, per_probe


def containers(
    compose: ComposeProject, services: Sequence[str], refs: Sequence[str] = (), *, required: bool = True
) -> dict[str, list[Container]]:
    """service -> its containers (replicas included) in ``compose``'s project, from labels: one ``docker
    ps`` and one ``docker inspect``, not a compose call (each pays the compose CLI's start). ``refs``: inspect
    exactly these containers (names or ids) instead of every one of the project. ``required``: a service
    without a container is an error (else it is simply absent from the answer)."""
    return of_inspect(compose, services, compose.inspect(refs), required=required)


def of_inspect(
    compose: ComposeProject,
    services: Sequence[str],
    found: Sequence[Mapping[str, Any]],
    *,
    required: bool = True,
) -> dict[str, list[Container]]:
    """service -> its containers among ``found`` (``docker inspect`` records, e.g. from a caller that just
    inspected them: no second call)."""
    out: dict[str, list[Container]] = {}
    for info in found:
        svc = str(lab.of_inspect(info).get(lab.COMPOSE_SERVICE, ""))
        if svc in services:
            argv, per_probe = health_argv(info)
            name = str(info.get("Name", "")).lstrip("/")
            server = bool((info.get("Config") or {}).get("ExposedPorts"))
            out.setdefault(svc, []).append(Container(svc, str(info.get("Id")), name, argv, per_probe, server))
    missing = [s for s in services if s not in out]
    if missing and required:
        raise ForgeError(f"service(s) {', '.join(missing)} have no container in project {compose.name}")
    return out


def start(
    compose: ComposeProject,
    config_services: Mapping[str, ServiceConfig],
    services: Sequence[str],
    *,
    timeout: float | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Start the created containers of ``services`` in ``depends_on`` order and wait until every one is
    ready (see the module doc). ``config_services``: the resolved compose config's services (their
    ``depends_on``); a dependency outside ``services`` is up already. Raises ``NotReady`` (readiness) or
    the failed ``docker start``'s ``CommandError`` (the container could not start at all).

    ``on_ready(service)``: called on the thread that waited for ``service`` as soon as it is ready (its
    dependents may be starting meanwhile); what it raises fails the whole start, as the service's own
    failure would (and is what ``start`` raises)."""
    wanted = list(dict.fromkeys(services))
    found = containers(compose, wanted)
    deps = {s: _deps(config_services.get(s) or ServiceConfig(s), wanted) for s in wanted}
    # What a service must reach before it counts as done: exited 0 when a dependent waits for that.
    complete = {d for s in wanted for d, cond in deps[s].items() if cond == COMPLETED}
    waves = _Waves(compose, found, deps, complete, _limit(compose, timeout), on_ready, after=_after(deps))
    waves.run(wanted)


def wait_ready(
    compose: ComposeProject,
    services: Sequence[str],
    *,
    timeout: float | None = None,
    refs: Sequence[str] = (),
    inspected: Sequence[Mapping[str, Any]] = (),
) -> None:
    """Wait until the (started) containers of ``services`` are ready, all in parallel. ``refs``: exactly
    these containers (names or ids; else every container of those services in the project);
    ``inspected``: exactly these, as ``docker inspect`` described them (their healthchecks) already."""
    wanted = list(dict.fromkeys(services))
    found = of_inspect(compose, wanted, inspected) if inspected else containers(compose, wanted, refs)
    waves = _Waves(compose, found, {s: {} for s in wanted}, set(), _limit(compose, timeout))
    waves.run(wanted, start=False)


def _after(deps: Mapping[str, Mapping[str, str]]) -> dict[str, list[str]]:
    """service -> the services whose ``docker start`` must have returned before its own starts, besides
    its dependencies' conditions. Starts that run together share the engine (dockerd, the shim, runc) and
    each takes longer: a service that others wait for and that waits for nothing (the head of a chain: a
    database its API waits for) starts first, and one that waits for nothing and that nothing waits for
    (a workstation, a sidecar: on no chain) once every such head's start returned, beside the head's own
    boot instead of its start. Services that wait for something start as their conditions hold."""
    waited = {d for ds in deps.values() for d in ds}
    heads = [s for s in deps if s in waited and not deps[s]]
    if not heads:
        return {}
    return {s: heads for s in deps if s not in waited and not deps[s]}


def _limit(compose: ComposeProject, timeout: float | None) -> float:
    return compose.timeouts.compose_up if timeout is None else timeout


def _deps(svc: ServiceConfig, wanted: Sequence[str]) -> dict[str, str]:
    """dependency -> condition, for the dependencies among ``wanted`` (the others are up already)."""
    out: dict[str, str] = {}
    # What compose orders by implicitly: another service's network namespace, its volumes, a link.
    implicit = [svc.network_mode, *svc.volumes_from, *(link.split(":")[0] for link in svc.links)]
    for ref in implicit:
        dep = ref.removeprefix("service:").split(":")[0]
        if dep in wanted:
            out[dep] = STARTED
    for dep, spec in svc.depends_on.items():
        if dep in wanted:
            out[dep] = str(spec.get("condition") or STARTED)
    return out


class _Waves:
    """One thread per service: wait for its dependencies' conditions, start it, probe it."""

    def __init__(
        self,
        compose: ComposeProject,
        found: Mapping[str, list[Container]],
        deps: Mapping[str, Mapping[str, str]],
        complete: set[str],
        limit: float,
        on_ready: Callable[[str], None] | None = None,
        *,
        after: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.compose = compose
        self.after = after or {}
        self.on_ready = on_ready
        self.runner = compose.runner
        self.found = found
        self.deps = deps
        self.complete = complete
        self.limit = limit
        self.deadline = time.monotonic() + limit
        self.started = {s: threading.Event() for s in deps}
        self.ready = {s: threading.Event() for s in deps}
        self.failed = threading.Event()

    def run(self, services: Sequence[str], *, start: bool = True) -> None:
        if not services:
            return
        with ThreadPoolExecutor(max_workers=len(services), thread_name_prefix="readiness") as pool:
            futures = [pool.submit(self._one, s, start) for s in services]
            errors: list[BaseException] = []
            for f in futures:
                try:
                    f.result()
                except BaseException as e:  # noqa: BLE001 - the first one is raised below, after all ended
                    errors.append(e)
        if errors:  # Ctrl-C first, then a service's own failure, then a dependent's "its dependency failed"
            own = next((e for e in errors if not isinstance(e, _DependencyFailed)), errors[0])
            raise next((e for e in errors if isinstance(e, Interrupted | KeyboardInterrupt)), own)

    def _one(self, service: str, start: bool) -> None:
        try:
            for dep, cond in self.deps[service].items():
                self._await(service, dep, self.started[dep] if cond == STARTED else self.ready[dep])
            for first in self.after.get(service, ()):
                self._await(service, first, self.started[first], role="service started before it")
            if start:
                ids = [c.id for c in self.found[service]]
                self.runner.run(dk.start(ids), timeout=self.compose.timeouts.command, tag="start")
            self.started[service].set()
            for c in self.found[service]:
                self._probe(c, complete=service in self.complete)
            self.ready[service].set()
            if self.on_ready is not None:
                self.on_ready(service)
        except BaseException:
            self.failed.set()
            raise

    def _await(self, service: str, dep: str, event: threading.Event, *, role: str = "dependency") -> None:
        while not event.wait(PROBE_INTERVAL):
            if self.failed.is_set():
                raise _DependencyFailed(service, f"service {service!r} not started: {role} {dep!r} failed")
            if time.monotonic() >= self.deadline:
                raise NotReady(
                    service, f"service {service!r} timed out after {self.limit:g}s waiting for {dep!r}"
                )

    def _probe(self, c: Container, *, complete: bool) -> None:
        """Until ``c`` is ready: healthy by its own healthcheck (or running, without one), or exited 0 when
        it is a one-shot (``complete``: a dependent waits for exactly that)."""
        said = ""
        # With a healthcheck, its first run comes before Docker's state (one `docker inspect` less on the
        # path of every ready container); an exited one fails that run, then the state says so.
        last_state = time.monotonic()
        probing = c.health is not None and not complete
        # Once the first run failed, the container's main process says where its sockets are
        # (``listening``), found in the host's cgroup listing (``listening.main_pid``), else by Docker's
        # state (its Pid), read at once. While nothing listens, the healthcheck runs only ``UNHEARD_EVERY``
        # after its last run (or as long as its last run took, if longer); as soon as something listens,
        # every tick again. Its main process gone (exited, or restarted under another pid), the state is
        # read at once and the gate dropped.
        gate: listening.Sockets | None = None
        gate_due = probing and listening.local_engine()
        # A healthcheck ``hostprobe`` recognises is asked from the host every tick (its PASS is the real
        # command's exit 0); the real one still runs, only ``HOSTPROBE_EXEC_EVERY`` after the last.
        host = hostprobe.HostProbe.of(c.id, c.health, c.probe_timeout) if probing else None
        host_since = time.monotonic()
        last_exec: float | None = None
        ran = 0.0  # how long the last run took
        if gate_due and c.server:
            # A server's first run, right after its start, fails as a rule: it waits for a listener (or
            # ``UNHEARD_EVERY``) as a later run would, its main process found without Docker's state.
            gate = listening.Sockets.of(listening.main_pid(c.id), c.id)
            if gate is not None:
                gate_due = False
                last_exec = time.monotonic()
        while True:
            if self.failed.is_set():
                raise _DependencyFailed(c.service, f"service {c.service!r}: another service failed")
            now = time.monotonic()
            if gate_due and last_exec is not None and (found := listening.main_pid(c.id)):
                gate = listening.Sockets.of(found, c.id)
                gate_due = gate is None  # else: by Docker's state below
            heard = True if gate is None else gate.listening()
            every = STATE_EVERY if gate is None else GATED_STATE_EVERY
            if (
                not probing
                or now - last_state >= every
                or heard is None
                or (gate_due and last_exec is not None)
            ):
                last_state = now
                state = self._state(c)
                if gate_due and last_exec is not None:
                    gate_due = False
                    gate = listening.Sockets.of(_int(state.get("Pid")), c.id)
                    heard = True if gate is None else gate.listening()
                elif heard is None:
                    gate, heard = None, True
                status, code = state.get("Status"), state.get("ExitCode")
                health = (state.get("Health") or {}).get("Status")
                if status == "exited" or status == "dead":
                    if code == 0 and (complete or c.health is None):
                        return  # a one-shot that finished: what `up --wait` accepts too
                    raise NotReady(c.service, f"service {c.service!r} container {c.name} exited ({code})")
                if health == "healthy" and not complete:
                    return  # Docker's own check got there first
                if health == "unhealthy":
                    raise NotReady(
                        c.service, f"service {c.service!r} container {c.name} is unhealthy{_said(said)}"
                    )
                if not complete and c.health is None and status == "running":
                    return  # no healthcheck: running is ready, as for `up --wait`
            if host is not None:
                passed = host.passes()
                if passed:
                    return
                if passed is None:
                    host = None  # not from here: every tick's run is the real one again
            if host is not None:  # the host asks every tick; the real command only every so often
                since = host_since if last_exec is None else last_exec
                pause = HOSTPROBE_DEAF_EVERY if heard is False else HOSTPROBE_EXEC_EVERY
                hold = now - since < max(pause, ran)
            else:
                hold = heard is False and last_exec is not None and now - last_exec < unheard_pause(ran)
            if probing and c.health is not None and not hold:
                began = time.monotonic()
                try:
                    r = self.runner.run(
                        dk.exec(c.id, c.health), timeout=c.probe_timeout, check=False, tag="exec"
                    )
                except CommandTimeout:
                    said = f"its healthcheck did not answer within {c.probe_timeout:g}s"
                else:
                    if r.rc == 0:
                        return
                    said = (r.stdout + r.stderr).strip()[-300:] or f"exit {r.rc}"
                last_exec = time.monotonic()  # when it ended
                ran = last_exec - began
            if time.monotonic() >= self.deadline:
                what = "did not complete" if complete else "not healthy"
                raise NotReady(
                    c.service,
                    f"service {c.service!r} {what} within {self.limit:g}s (timed out){_said(said)}",
                )
            time.sleep(PROBE_INTERVAL)

    def _state(self, c: Container) -> dict[str, Any]:
        out = self.runner.run(
            dk.inspect([c.id], format="{{json .State}}"),
            timeout=self.compose.timeouts.command,
            check=False,
        )
        try:
            state = json.loads(out.stdout or "{}")
        except json.JSONDecodeError:
            return {}
        return state if isinstance(state, dict) else {}


def unheard_pause(ran: float) -> float:
    """How long after its last run a container that listens on nothing waits for its next one, the last
    run having taken ``ran`` seconds (a run that took long, on a busy engine, waits as long again)."""
    return max(UNHEARD_EVERY, ran)


class _DependencyFailed(NotReady):
    """A service not started (or not waited for) because another one failed: never the error reported
    when the other one's own error is there."""


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _said(said: str) -> str:
    return f"; its healthcheck said: {said}" if said else ""
