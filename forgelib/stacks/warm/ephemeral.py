"""The ephemeral (and unlabelled) services of one warm stack: a container no trial ran with, every trial.

While a trial runs, compose itself creates the next one beside it, not started (``up --no-start --no-deps
--no-recreate --scale <svc>=2``: the same labels, networks, aliases, mounts and environment as any ``up``,
numbered on; a created container has no network endpoint, so nothing of the trial sees it). When the trial
ends, after its logs were captured, its ephemeral containers are frozen (``docker pause``), so nothing of
theirs runs on while the reset services are reset, and, in the background during the reset, taken off
every network (so exactly one container answers for the service's name once its successor starts); they
are removed during the next trial, before compose creates the next spares. The next trial, after the
reset, checks each successor is provably fresh (never started: state ``created``, no start time, an id no
trial has used) and starts them with plain ``docker start`` in ``depends_on`` waves; the trial's execs go
to them by name (``ComposeProject.containers``). The ephemeral services that depend on no reset service,
directly or not (``independent``), start as soon as the reset services hold nothing of the trial any more
(their data put back, perhaps still starting: ``PreparedSeed.reset``'s ``restored``), the others once
those are reset. An image's VOLUME in an ephemeral service is an anonymous, labelled volume of each
container's own (``labels_override``'s ``per_container``): created with its spare, removed with the old
container. A service that mounts a named volume the user declared and only ephemeral services mount
(renewed with them: ``renewal``), and every service when there is no spare, has its old container
removed after the release and compose create its successor then (``up --no-start``, or ``--force-recreate
--renew-anon-volumes`` without spares); a failed or unprovable precreation falls back to ``up --no-deps
--force-recreate``. Ready when the container's own
healthcheck command, run by us through ``docker exec``, first passes (compose's ``--wait`` sees health
only at the healthcheck's interval).

``Ephemerals`` is one stack's share of this; the pool (``forgelib.stacks.warm.pool``) calls it at four points
of a stack's life: ``precreate`` as a trial gets the stack, ``release`` when the trial is over, ``recycle``
after the reset services were reset and verified, ``settle`` before the stack is torn down.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from forgelib.docker import argv as dk
from forgelib.docker import labels as lab
from forgelib.docker import readiness
from forgelib.docker.compose import ComposeProject, labels_override, published_of_inspect
from forgelib.errors import ForgeError
from forgelib.runner import Runner
from forgelib.spec.models import Timeouts
from forgelib.stacks.stack import Stack

# The pool's logger: warm stacks log under one name, whichever module of the package speaks.
log = logging.getLogger("forgelib.stacks.warm")
_T = TypeVar("_T")


class Timed(Protocol):
    """Runs one step of a trial's recycling and records how long it took under ``phase`` (the pool's)."""

    def __call__(self, phase: str, step: Callable[[], _T]) -> _T: ...


@dataclass
class _Successors:
    """The next trial's ephemeral containers, made in the background (``Ephemerals._spares`` during a
    trial, ``Ephemerals._retire`` after its release): service -> container id once created, their ``docker
    inspect`` records once the old ones are gone, or why they could not be made."""

    job: threading.Thread | None = None
    ids: dict[str, str] = field(default_factory=dict)
    infos: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None

    def wait(self) -> None:
        if self.job is not None:
            self.job.join()


@dataclass(eq=False)
class Ephemerals:
    """The ephemeral services of one warm stack and the containers they run in (see the module docstring).
    Its commands go through the stack's compose project, with that project's runner and timeouts (the
    pool's)."""

    trial: Stack  # the stack as provisioned (compose, resolved config)
    waves: list[list[str]]  # ephemeral services, in depends_on order
    renew: list[str]  # named volumes only ephemeral services mount (removed with them)
    # Why these services are recreated by compose every trial instead of started from spares (None:
    # spares). A spare is one precreated container per service; a service of several replicas has
    # several at once, so its successors are compose's to make (see `_ephemeral_plan`).
    fallback: str | None = None
    successors: _Successors | None = None  # the next trial's ephemeral containers, created not started
    used: set[str] = field(default_factory=set)  # ids of every ephemeral container a trial ran with
    # service -> the name of the ephemeral container the current (or last) trial runs with: compose
    # numbers each new one on (`<project>-<service>-<n>`), the trial's compose execs into this one.
    current: dict[str, str] = field(default_factory=dict)
    networks: dict[str, list[str]] = field(default_factory=dict)  # service -> its current one's networks
    retired: list[str] = field(default_factory=list)  # frozen, off every network, not yet removed
    # service -> a host directory mirroring absolute paths (``<dir>/logs/agent`` is ``/logs/agent``) copied
    # into each of its successors while it is created and not started, off every trial's path: what a host
    # would otherwise make in the container as its trial starts (harbor's log directories).
    furnish: dict[str, Path] = field(default_factory=dict)
    furnished: set[str] = field(default_factory=set)  # ids of the successors furnished so far
    # The ephemeral services whose current container was furnished (``recycle``).
    current_furnished: frozenset[str] = frozenset()
    # The ephemeral services that mount a volume in ``renew`` (``renewal``): their successors are made
    # after the release, the others' while the trial runs (``precreate``).
    renewing: list[str] = field(default_factory=list)
    # The ephemeral services that depend on no reset service (``independent``): the pool starts their
    # successors as soon as the reset services' trial changes are gone (``start_early``).
    early: list[str] = field(default_factory=list)
    # The successors ``recycle`` (or ``start_early``) took for this reset: None, recreated by compose.
    _fresh: dict[str, dict[str, Any]] | None = field(default=None, init=False, repr=False)
    _took: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        # A new stack's: the containers compose's `up` made first.
        self.current = {s: self.compose.container(s) for s in self.services}

    @property
    def name(self) -> str:
        return self.trial.name

    @property
    def compose(self) -> ComposeProject:
        return self.trial.compose

    @property
    def runner(self) -> Runner:
        return self.compose.runner

    @property
    def timeouts(self) -> Timeouts:
        return self.compose.timeouts

    @property
    def services(self) -> list[str]:
        return [s for wave in self.waves for s in wave]

    # ------------------------------------------------------------------------- what the pool calls

    def precreate(self) -> None:
        """A trial got the stack: while it runs, have compose create the next trial's ephemeral containers
        beside the running ones, not started (``up --no-start --no-deps --no-recreate --scale <svc>=2``:
        the same labels, networks, aliases, mounts and environment as any ``up``; numbered on by compose).
        A created container has no network endpoint: nothing of the trial can see it. Not for a service
        that mounts a volume renewed with it (a volume in use by the spare cannot be removed): ``_retire``
        makes those after the release."""
        spared = self._spared
        if not spared:
            return
        succ = self.successors = _Successors()

        def create() -> None:
            try:
                if self.retired:  # the last trial's: compose counts (and would try to start) them
                    self._remove(self.retired)
                    self.retired = []
                if set(self.networks) != set(self.services):  # a new stack's first containers
                    for svc, i in self._inspect(self.current.values()).items():
                        self.networks[svc] = _networks(i)
                scale = {svc: 2 for svc in spared}
                self.compose.up(
                    spared, wait=False, no_deps=True, no_start=True, no_recreate=True, scale=scale
                )
                succ.ids = self._created(spared)
                self._furnish(succ.ids)
            except (ForgeError, OSError, ValueError) as e:  # `_retire` makes them the usual way
                succ.error = str(e)

        succ.job = threading.Thread(target=create, name=f"forge-warm-spare-{self.name}", daemon=True)
        succ.job.start()

    def release(self) -> None:
        """The trial is over: freeze its ephemeral containers (nothing of theirs may run on into the next
        reset) and start making their successors in the background; the fallback removes every replica
        now instead. Raises ``ForgeError`` when that fails (the pool tears the stack down)."""
        if not self.services:
            return
        if self.fallback:
            self._clear()
            return
        spares, self.successors = self.successors, None
        if spares is not None:  # compose must be done: an `up` meeting a paused container fails
            spares.wait()
        self._freeze()
        succ = self.successors = _Successors()
        succ.job = threading.Thread(
            target=self._retire,
            args=(succ, spares),
            name=f"forge-warm-next-{self.name}",
            daemon=True,
        )
        succ.job.start()

    def recycle(self, timed: Timed, early: Collection[str] = ()) -> dict[str, list[str]]:
        """After the reset services were reset and verified: the successors started (``successors``,
        ``recreate``) and waited for (``ready``), wave by wave; the published ports of the ephemeral
        services' new containers. ``early``: services ``start_early`` started already (skipped). Raises
        ``ForgeError`` when they could not be made ready."""
        started = early if self._took else ()  # ``start_early`` ran for this reset
        if not self._took:
            self._take(timed)
        # Docker picks the host ports at start: read once the last wave is started, beside its readiness.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"forge-warm-ports-{self.name}") as ex:
            ports: list[Future[dict[str, list[str]]]] = []
            self._start_waves(
                timed,
                [s for s in self.services if s not in started],
                started=lambda: ports.append(ex.submit(self._published)),
            )
        self._fresh, self._took = None, False
        return ports[0].result() if ports else self._published()

    def start_early(self, timed: Timed, services: Collection[str]) -> None:
        """Before ``recycle``, once nothing a trial changed is left in the reset services (their data put
        back, perhaps still starting): the successors of ``services``, which depend on no reset service
        (``independent``), started and waited for; ``recycle`` then starts the rest."""
        self._take(timed)
        self._start_waves(timed, services)

    def _take(self, timed: Timed) -> None:
        self._took = True
        fresh = self._fresh = timed("successors", self._successors) if self.waves else None
        ids = {s: str(i.get("Id")) for s, i in (fresh or {}).items()}
        self.current_furnished = frozenset(s for s, cid in ids.items() if cid in self.furnished)

    def _start_waves(
        self, timed: Timed, services: Collection[str], started: Callable[[], None] | None = None
    ) -> None:
        """Start (or recreate) ``services`` wave by wave, each wave ready before the next; ``started``
        called once the last wave's containers are started, before its readiness."""
        fresh = self._fresh
        waves = [w for w in ([s for s in whole if s in services] for whole in self.waves) if w]
        for n, wave in enumerate(waves):
            if fresh is not None:  # created in the background, proven never started: start them
                timed("recreate", functools.partial(self._start, [fresh[s]["Id"] for s in wave]))
                infos = [fresh[s] for s in wave]
                self.current.update({s: str(fresh[s].get("Name", "")).lstrip("/") for s in wave})
                self.networks.update({s: _networks(fresh[s]) for s in wave})
            else:
                timed("recreate", functools.partial(self._recreate, wave))
                infos = []
            if started is not None and n == len(waves) - 1:
                started()
            timed("ready", functools.partial(self._ready, wave, infos))

    def settle(self) -> None:
        """Wait for the successors being made in the background: never ``down`` while compose may still be
        creating."""
        if self.successors is not None:
            self.successors.wait()

    # ------------------------------------------------------------------------------------- release

    def _clear(self) -> None:
        """The fallback's release: every container of the ephemeral services (all replicas) removed with its
        anonymous volumes, and the named volumes only they mount, so nothing of theirs runs on into the
        reset and the next trial's ``_recreate`` makes them all anew."""
        ids = [cid for cid, _, svc in self.compose.container_rows("") if svc in self.services]
        if ids:
            self._remove(ids)
        if self.renew:
            self.runner.run(dk.rm(self.renew, kind="volume"), timeout=self.timeouts.command)

    def _freeze(self) -> None:
        """Nothing of the ephemeral services runs on: paused at once (quick; removed in the background).
        One that cannot be paused (it exited, or is gone) is removed here instead; compose tries last
        (which removes the spares too: the next trial then recreates the usual way)."""
        names = [self.current[svc] for svc in self.services]
        if self.runner.run(dk.pause(names), timeout=self.timeouts.command, check=False).rc == 0:
            return
        rm = dk.rm(names, force=True, volumes=True)
        if self.runner.run(rm, timeout=self.timeouts.command, check=False).rc != 0:
            self.compose.run(["rm", "--stop", "--force", "--volumes", *self.services])

    @property
    def _spared(self) -> list[str]:
        """The services whose successors ``precreate`` makes while a trial runs: all but those that mount a
        volume renewed with them (``renewing``; all of them when that is not known), none for the
        fallback."""
        if self.fallback or (self.renew and not self.renewing):
            return []
        return [s for s in self.services if s not in self.renewing]

    def _created(self, services: Sequence[str] | None = None) -> dict[str, str]:
        """service -> id of the one never-started container of each ephemeral service (or of ``services``;
        raises otherwise)."""
        wanted = self.services if services is None else services
        found: dict[str, list[str]] = {}
        for cid, _, svc in self.compose.container_rows("created"):
            if svc in wanted:
                found.setdefault(svc, []).append(cid)
        odd = [s for s in wanted if len(found.get(s, ())) != 1]
        if odd:
            raise ForgeError(f"expected one created container of {', '.join(odd)}, found {found}")
        return {s: ids[0] for s, ids in found.items()}

    def _retire(self, succ: _Successors, spares: _Successors | None) -> None:
        """In the background after a release: take the frozen ephemeral containers off every network (so
        none answers for the service's name when its successor starts; the next ``precreate`` removes them,
        with their anonymous volumes, off the path of a trial), or remove them at once when there are no
        spares, have compose create the successors then (first removing the named volumes only they
        mount); then inspect the successors (``_successors`` proves them fresh from that record)."""
        try:
            names = [self.current[svc] for svc in self.services]
            spared = self._spared
            if spares is not None and spares.error is None and spared and set(spares.ids) == set(spared):
                ids = dict(spares.ids)
                kept = [self.current[svc] for svc in spared]
                late = [svc for svc in self.services if svc not in spared]
                with ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"forge-warm-off-{self.name}"
                ) as ex:
                    off = ex.submit(self._disconnect, spared)  # beside the renewed ones' replacement
                    if late:  # they mount a renewed volume: made now, the old ones and the volumes gone
                        self._remove([self.current[svc] for svc in late])
                        self.runner.run(dk.rm(self.renew, kind="volume"), timeout=self.timeouts.command)
                        # None of theirs is left, so a plain `up` makes one each: `--force-recreate`
                        # would first list the project's containers again, on the next trial's path.
                        # (Another one of theirs found after all: `_created` refuses, the usual way then.)
                        self.compose.up(late, wait=False, no_deps=True, no_start=True)
                        made = self._created(late)
                        self._furnish(made)
                        ids.update(made)
                    infos = self._inspect(ids.values())  # beside the disconnects
                    if off.result():
                        self.retired = kept
                    else:
                        self._remove(kept)
            else:
                self._remove([*self.retired, *names])
                self.retired = []
                if spares is not None:
                    log.warning("warm stack %s: spare containers unusable (%s)", self.name, spares.error)
                if self.renew:
                    self.runner.run(dk.rm(self.renew, kind="volume"), timeout=self.timeouts.command)
                # Every container of the services replaced by one, whatever spares are left.
                self.compose.up(self.services, wait=False, no_deps=True, force_recreate=True, no_start=True)
                ids = self._created()
                self._furnish(ids)
                infos = self._inspect(ids.values())
            succ.infos = infos
            succ.ids = {svc: str(i.get("Id")) for svc, i in succ.infos.items()}
        except (ForgeError, OSError, ValueError) as e:  # the next trial recreates them the usual way
            succ.error = str(e)

    def _furnish(self, ids: Mapping[str, str]) -> None:
        """Copy each service's ``furnish`` directory into its created, never-started successor (``docker
        cp`` works on a stopped container); raises ``ForgeError`` when a copy fails."""
        for svc, cid in ids.items():
            src = self.furnish.get(svc)
            if src is None:
                continue
            for top in sorted(src.iterdir()):
                res = self.runner.run(dk.cp(str(top), f"{cid}:/"), timeout=self.timeouts.command, check=False)
                if res.rc != 0:
                    raise ForgeError(f"could not furnish {svc}'s successor: {res.stderr.strip()[-300:]}")
            self.furnished.add(cid)

    def _inspect(self, refs: Iterable[str]) -> dict[str, dict[str, Any]]:
        """service -> the ``docker inspect`` record of these containers (one per service; raises if one is
        not there)."""
        res = self.runner.run(dk.inspect(list(refs)), timeout=self.timeouts.command)
        return {str(lab.of_inspect(i).get(lab.COMPOSE_SERVICE)): i for i in json.loads(res.stdout or "[]")}

    def _disconnect(self, services: Sequence[str]) -> bool:
        """Take the current ephemeral containers off their networks (quicker than removing them, which
        happens later, off the trial's path), each by its own ``docker network disconnect`` at once (the
        successors start only once all are off); False when one could not be (or its networks are not
        known): remove them instead."""
        if any(not self.networks.get(svc) for svc in services):
            return False
        pairs = [(net, self.current[svc]) for svc in services for net in self.networks[svc]]

        def off(pair: tuple[str, str]) -> bool:
            argv = dk.network_disconnect(*pair, force=True)
            return self.runner.run(argv, timeout=self.timeouts.command, check=False).rc == 0

        if len(pairs) <= 1:
            return all(off(p) for p in pairs)
        prefix = f"forge-warm-off-{self.name}"
        with ThreadPoolExecutor(max_workers=len(pairs), thread_name_prefix=prefix) as ex:
            return all(list(ex.map(off, pairs)))

    def _remove(self, names: Sequence[str]) -> None:
        """Remove these containers with their anonymous volumes (gone already is fine); raises otherwise."""
        gone = self.runner.run(
            dk.rm(names, force=True, volumes=True), timeout=self.timeouts.command, check=False
        )
        if gone.rc != 0 and "No such container" not in gone.stderr:
            raise ForgeError(f"could not remove {', '.join(names)}: {gone.stderr.strip()[-300:]}")

    # ------------------------------------------------------------------------------------- recycle

    def _successors(self) -> dict[str, dict[str, Any]] | None:
        """The precreated ephemeral containers (service -> its ``docker inspect`` record, taken after the
        trial before was over and its containers gone) if every one is provably fresh: created by compose
        for this stack and service, never started (state ``created``, no start time), an id no trial has
        run with. None (recreate them the usual way) otherwise."""
        succ, self.successors = self.successors, None
        if succ is None:
            return None
        succ.wait()
        if succ.error is not None or set(succ.infos) != set(self.services):
            log.warning("warm stack %s: precreated containers unusable (%s)", self.name, succ.error)
            return None
        for svc, info in succ.infos.items():
            if not _never_started(info, self.name, svc) or str(info.get("Id")) in self.used:
                log.warning("warm stack %s: precreated %s is not provably fresh", self.name, svc)
                return None
        self.used.update(str(i.get("Id")) for i in succ.infos.values())
        return succ.infos

    def _start(self, ids: Sequence[str]) -> None:
        """Start these containers, each by its own ``docker start`` at once (the CLI starts the containers
        it is given one after another)."""
        if len(ids) <= 1:
            self.runner.run(dk.start(ids), timeout=self.timeouts.compose_up, tag="start")
            return
        with ThreadPoolExecutor(
            max_workers=len(ids), thread_name_prefix=f"forge-warm-start-{self.name}"
        ) as ex:
            for job in [ex.submit(self._start, [cid]) for cid in ids]:
                job.result()

    def _recreate(self, services: Sequence[str]) -> None:
        """The fallback: compose replaces every container of ``services`` (spares included) by one."""
        self.compose.up(services, wait=False, no_deps=True, force_recreate=True)
        for cid, name, svc in self.compose.container_rows("running"):
            if svc in services:
                self.current[svc] = name
                self.used.add(cid)

    def _ready(self, services: Sequence[str], inspected: Sequence[Mapping[str, Any]]) -> None:
        """Wait until each recreated container is ready (``forgelib.docker.readiness``: its own healthcheck
        command through ``docker exec``, not compose's healthcheck ticks): the ones just started
        (``inspected`` before), never their successors."""
        refs = [] if self.fallback else [self.current[s] for s in services]  # []: every replica
        readiness.wait_ready(
            self.compose, services, timeout=self.timeouts.compose_up, refs=refs, inspected=inspected
        )

    def _published(self) -> dict[str, list[str]]:
        """The published ports of the ephemeral services' new containers (one ``docker inspect``, only
        when one of them publishes any): Docker picks each host port at start, so the last trial's no
        longer hold, and a precreated container's record (taken before its start) has none yet."""
        config = self.trial.resolved
        publish = [s for s in self.services if config.service(s).ports]
        if not publish:
            return {}
        if not self.fallback:
            found = self._inspect(self.current[s] for s in publish)
            return {s: published_of_inspect(found[s]) for s in publish}
        running = self.compose.container_rows("running")
        ids = [cid for cid, _, svc in running if svc in publish]  # every replica's
        res = self.runner.run(dk.inspect(ids), timeout=self.timeouts.command)
        out: dict[str, list[str]] = {s: [] for s in publish}
        for info in json.loads(res.stdout or "[]"):
            ports = out.setdefault(str(lab.of_inspect(info).get(lab.COMPOSE_SERVICE)), [])
            ports += [p for p in published_of_inspect(info) if p not in ports]
        return out


def independent(
    depends_on: Mapping[str, Collection[str]], ephemeral: Collection[str], reset: Collection[str]
) -> list[str]:
    """The ephemeral services that depend on no reset service, directly or through other services
    (``depends_on``: service -> the services it depends on): their successors may start while the reset
    services are still coming back, once nothing a trial changed is left in them. In ``ephemeral``'s
    order."""
    tainted: set[str] = set(reset)
    changed = True
    while changed:
        changed = False
        for svc, deps in depends_on.items():
            if svc not in tainted and any(d in tainted for d in deps):
                tainted.add(svc)
                changed = True
    return [s for s in ephemeral if s not in tainted]


def _never_started(info: Mapping[str, Any], project: str, service: str) -> bool:
    """``docker inspect``'s record of a container compose created for ``project``'s ``service`` and nobody
    ever started (Docker's zero time as its start time)."""
    state = info.get("State") or {}
    labels = lab.of_inspect(info)
    return (
        state.get("Status") == "created"
        and str(state.get("StartedAt", "")).startswith("0001-01-01")
        and labels.get(lab.COMPOSE_PROJECT) == project
        and labels.get(lab.COMPOSE_SERVICE) == service
    )


def _networks(info: Mapping[str, Any]) -> list[str]:
    """The networks ``docker inspect`` says a container is (or, created, will be) attached to; none for
    ``network_mode: host|none|service:…`` (nothing of its own to take off)."""
    mode = str((info.get("HostConfig") or {}).get("NetworkMode") or "")
    if mode in ("host", "none") or mode.startswith(("container:", "service:")):
        return []
    return sorted((info.get("NetworkSettings") or {}).get("Networks") or {})


def _ephemeral_plan(
    trial: Stack, image_volumes: Mapping[str, Sequence[str]]
) -> tuple[list[list[str]], list[str], str | None]:
    """The ephemeral (and unlabelled) services in ``depends_on`` waves, the named volumes only they
    mount (their full engine names; ``renewal``), and why
    they are recreated by compose every trial rather than started from spares (None: spares).

    Spares stand for one container per service (the trial's execs go to it by name); an ephemeral
    service of several replicas is recreated whole by compose instead (``up --force-recreate`` on the
    trial's path): every replica is new each trial, as the isolation promises, and the run says so once
    (a ``warm_ephemeral_recreated`` event) rather than paying for a spare attempt that cannot work."""
    config = trial.resolved
    services = config.services
    env = trial.environment
    eph = env.ephemeral(services)
    waves: list[list[str]] = []
    placed: set[str] = set()
    while len(placed) < len(eph):
        wave = [
            s
            for s in eph
            if s not in placed and all(d in placed or d not in eph for d in services[s].depends_on)
        ]
        if not wave:  # a cycle compose itself would refuse: one wave, compose orders it
            wave = [s for s in eph if s not in placed]
        waves.append(wave)
        placed.update(wave)
    renew, _ = renewal(trial, image_volumes, eph)
    several = {s: services[s].replicas for s in eph if services[s].replicas > 1}
    fallback = None
    if several:
        listed = ", ".join(f"{s} ({n} replicas)" for s, n in sorted(several.items()))
        fallback = f"ephemeral {listed}: recreated by compose every trial (spares stand for one container)"
    return waves, renew, fallback


def renewal(
    trial: Stack, image_volumes: Mapping[str, Sequence[str]], ephemeral: Collection[str]
) -> tuple[list[str], list[str]]:
    """The named volumes only ``ephemeral`` services mount (their full engine names: removed with them,
    each trial) and the services that mount them (their successors are made once the old containers
    and the volumes are gone, never beside them). A service in ``trial.own_volumes`` (as its provisioning
    decided) has its image's VOLUMEs as an anonymous volume of each container's own, none of these; any
    other ephemeral service has a named one for them, renewed."""
    config = trial.resolved
    users: dict[str, set[str]] = {}
    own = trial.own_volumes
    added = labels_override(trial.config, {}, image_volumes, per_container=own).get("services") or {}
    for n, svc in config.services.items():
        for m in [*svc.volumes, *((added.get(n) or {}).get("volumes") or [])]:
            if isinstance(m, Mapping) and m.get("type") == "volume" and m.get("source"):
                users.setdefault(str(m["source"]), set()).add(n)
    declared = config.volumes
    renewed = {
        v: who
        for v, who in sorted(users.items())
        if who <= set(ephemeral) and not (declared.get(v) or {}).get("external")
    }
    names = [str((declared.get(v) or {}).get("name") or f"{trial.name}_{v}") for v in renewed]
    mounting = set().union(*renewed.values()) if renewed else set()
    return names, [s for s in ephemeral if s in mounting]
