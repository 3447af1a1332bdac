"""Checkpoint a live stack, fork it into new stacks, roll a stack back: ``checkpoint``, ``fork``, ``restore``.

**checkpoint** captures every reset service of a running stack at one moment: the stack's other services
are paused (``docker pause``: nothing they do reaches a database meanwhile), each reset service writes
what it holds in memory to its files and names the directory holding its state (``checkpoint_path`` of
its kind: postgres's data directory, redis's ``dir`` after ``SAVE``, a tree's target) and its fingerprint
is read (``golden_fingerprint``), then the reset services are paused too, their directories copied out
(``docker cp``), and everything unpaused. The stack is paused only for the copies; after, each copy is
settled by its kind (``checkpoint_settle``: postgres's crash recovery, run once in a helper container
rather than in every fork) and the images are built. Services that are not reset (ephemeral: an HTTP
app, a workspace without a seed), reset services the spec marks ``checkpoint: fresh`` and those whose
kind keeps no state in the service (a bare seed) are not captured: a fork starts them as every new
stack does (from their image; a reset one seeded from its seed). Stored as
``forgelib.stacks.snapshots.checkpoints`` says (images on the engine, a verified manifest).

**fork** brings up ``n`` new stacks through the fresh pipeline (``provision_stack``) with
``CheckpointSteps``: each captured service runs its checkpoint image (its state in the container's own
layer: no volume is shared with the source or another fork), needs no recipe, and its fingerprint must
equal the one taken at capture. Each fork is registered with the ``Stacks`` it came from, so leaving
``stacks.open`` (or Ctrl-C) tears it down.

**restore** puts a live stack's captured services back at the checkpoint in place: each by its kind's own
restore of the running service (``Recipe.checkpoint_restore``: the operation its warm reset uses, from
the checkpoint's copy instead of the seed's), its fingerprint checked; where the kind cannot, or the
fingerprint still differs, through the checkpoint's image (``roll_back`` says how).

A stack is checkpointed only when it is forge's (labelled) and owned by this process or by one no longer
running (``forge provision --keep``): another live process's stack changes under it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import secrets
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from forgelib.docker import argv as dk
from forgelib.docker import labels as lab
from forgelib.docker import readiness
from forgelib.docker.compose import ComposeProject, project_name, write_override
from forgelib.docker.resolved import ResolvedConfig, ServiceConfig
from forgelib.errors import ForgeError, ProvisionError, RecipeError
from forgelib.kinds import registry as kinds
from forgelib.kinds.base import (
    ApplyContext,
    CheckpointCopy,
    Fingerprint,
    Memo,
    Recipe,
    fingerprint_diff,
    no_checkpoint,
)
from forgelib.runner import Runner
from forgelib.spec.models import EnvironmentManifest, Project, Seed, Timeouts
from forgelib.stacks.budget import MIB, capacity
from forgelib.stacks.provision import (
    FreshSteps,
    PhaseTimer,
    StackContext,
    StackPlan,
    provision_stack,
    teardown_trial,
)
from forgelib.stacks.snapshots import checkpoints as ckstore
from forgelib.stacks.snapshots import store
from forgelib.stacks.snapshots.checkpoints import Checkpoint, CheckpointError
from forgelib.stacks.snapshots.trial import unrestorable
from forgelib.stacks.stack import Stack

if TYPE_CHECKING:
    from forgelib.stacks.budget import Admission
    from forgelib.stacks.live import LiveStacks, StopState
    from forgelib.stacks.provision import _Binding


class _Backend(Protocol):
    @property
    def ctx(self) -> StackContext: ...


class StacksView(Protocol):
    """What checkpoints take of ``stacks.open``'s ``Stacks`` (``forgelib.stacks.session``, which sits above
    this module: its backends hand checkpoints to a run)."""

    project: Project | None
    runner: Runner
    timeouts: Timeouts
    admission: Admission
    live: LiveStacks
    stop: StopState

    @property
    def backend(self) -> _Backend: ...


FORK_TASK = "fork"  # the trial label's task part of a fork
PAUSE_ATTEMPTS = 3
# Forks of one checkpoint that come up together under one start place: a fork's start is its services'
# own start alone (no initdb, no recipe, no image of its own to build), a fraction of a fresh stack's.
FORKS_PER_START = 4


@dataclass(frozen=True)
class _Service:
    """A reset service of a live stack, as a checkpoint sees it."""

    name: str
    seed: Seed
    recipe: Recipe
    ctx: ApplyContext


def _services(project: Project, trial: Stack, timeouts: Timeouts) -> list[_Service]:
    resolved = trial.resolved
    written = ResolvedConfig.of(trial.environment.compose)
    memo = Memo()
    out = []
    for svc in trial.environment.reset_services():
        seed = project.seeds.get(svc.reset.seed) if svc.reset is not None else None
        if seed is None or svc.reset is None:
            continue
        recipe = kinds.recipe_for(seed.kind, written.service(svc.name))
        if recipe is None:
            continue
        ctx = ApplyContext(
            svc.name, seed, dict(svc.reset.options), compose=trial.compose,
            service_config=resolved.service(svc.name), timeouts=timeouts, memo=memo,
        )  # fmt: skip
        out.append(_Service(svc.name, seed, recipe, ctx))
    return out


def _captured(trial: Stack, s: _Service) -> bool:
    """Whether a checkpoint captures ``s``: not ``checkpoint: fresh`` in the spec, and of a kind that keeps
    state in the service (a bare seed is a read-only mount a fork gets again)."""
    spec = trial.environment.services.get(s.name)
    return (spec is None or spec.captured) and s.recipe.checkpoint_path is not no_checkpoint


def _owned(trial: Stack, infos: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a stack that is not forge's, or that another live process owns."""
    if not infos:
        raise CheckpointError(f"stack {trial.name} has no containers on this engine")
    me = lab.current_owner()
    for info in infos:
        labels = lab.of_inspect(info)
        name = str(info.get("Name", "")).lstrip("/")
        if labels.get(lab.MANAGED) != "true":
            raise CheckpointError(f"{name} is not forge's (no {lab.MANAGED} label): not checkpointed")
        owner = lab.Owner.from_labels(labels)
        if owner == me or labels.get(lab.KEPT) == "true":
            continue
        alive = owner.host == me.host and owner.boot_id == me.boot_id
        if alive and lab.pid_start_time(owner.pid) == owner.start_time:
            raise CheckpointError(
                f"stack {trial.name} belongs to another running forge process (pid {owner.pid}): "
                "checkpoint it from that process"
            )


def checkpoint(stacks: StacksView, trial: Stack) -> Checkpoint:
    """One consistent capture of ``trial``'s reset services (see the module's docstring); the complete,
    verified checkpoint. A failure or Ctrl-C leaves the stack unpaused and no complete checkpoint; what
    was built is removed here, or by ``forge reap`` once this process is gone."""
    project = stacks.project
    if project is None:
        raise ForgeError("checkpoint: stacks opened without a project")
    return capture(project, trial, stacks.runner, stacks.timeouts)


def capture(
    project: Project,
    trial: Stack,
    runner: Runner,
    timeouts: Timeouts,
    *,
    labels: Mapping[str, str] | None = None,
) -> Checkpoint:
    """``checkpoint`` without a ``Stacks`` (``forge checkpoint`` on a kept stack); ``labels``: more on its
    manifest image (a run's own checkpoint: ``snapshots.checkpoints.run_scoped``)."""
    t0 = time.monotonic()
    compose = trial.compose
    infos = compose.inspect()
    _owned(trial, infos)
    served = compose.served(found=infos)
    containers = {svc: str(found[0].get("Id")) for svc, found in served.items() if found}
    images = {svc: str(found[0].get("Image")) for svc, found in served.items() if found}
    services = [
        s for s in _services(project, trial, timeouts) if s.name in containers and _captured(trial, s)
    ]
    if not services:
        raise CheckpointError(
            f"stack {trial.name} has no running service to capture (a reset service whose kind keeps state "
            "in it, without `checkpoint: fresh`)"
        )
    cid = ckstore.new_id()
    run_id = next((r for i in infos if (r := lab.of_inspect(i).get(lab.RUN))), None)
    others = [c for svc, c in containers.items() if svc not in {s.name for s in services}]
    paused: list[str] = []
    built: list[str] = []
    manifest: dict[str, Any] = {}
    try:
        with store.build_dir(run_id) as d:
            pause_t0 = time.monotonic()
            try:
                _pause(runner, others, paused, timeouts)
                meta: dict[str, tuple[str, Fingerprint]] = {}
                for s in services:
                    try:
                        path = s.recipe.checkpoint_path(s.ctx)
                        fp = s.recipe.golden_fingerprint(s.ctx)
                    except RecipeError as e:
                        raise CheckpointError(f"checkpoint of {trial.name}: {e}") from e
                    why = unrestorable(s.ctx.service_config, path)
                    if why or path is None:
                        raise CheckpointError(f"service {s.name!r} cannot be checkpointed: {why}")
                    meta[s.name] = (path, fp)
                _pause(runner, [containers[s.name] for s in services], paused, timeouts)
                for s in services:
                    tar = d / s.name / "data.tar"
                    tar.parent.mkdir()
                    argv = dk.cp(f"{containers[s.name]}:{meta[s.name][0]}", "-")
                    runner.run(argv, timeout=timeouts.recipe, stdout_path=tar, tag="cp")
            finally:
                _unpause(runner, paused, timeouts)
            paused_s = time.monotonic() - pause_t0
            for s in services:
                info = served[s.name][0]
                _settle(runner, s, info, images[s.name], meta[s.name][0], d / s.name / "data.tar", timeouts)
            captured: dict[str, Any] = {}
            for s in services:
                path, fp = meta[s.name]
                image = ckstore.build_service_image(
                    runner, checkpoint_id=cid, service=s.name, base_image=images[s.name], path=path,
                    data_tar=d / s.name / "data.tar", labels=ckstore.service_labels(cid, s.name, run_id),
                    timeout=timeouts.recipe,
                )  # fmt: skip
                built.append(image)
                captured[s.name] = {
                    "image": image, "base": images[s.name], "path": path, "kind": str(s.seed.kind),
                    "seed": s.seed.name, "seed_digest": s.seed.digest, "fingerprint": fp,
                    "recipe_version": s.recipe.RECIPE_VERSION,
                }  # fmt: skip
            manifest = {
                "format": ckstore.FORMAT,
                "source": trial.name,
                "project": project.name,
                "stack_services": sorted(trial.environment.services),
                "services": captured,
                "fresh": sorted(set(trial.environment.services) - set(captured)),  # forks start these anew
                "images": images,
                "created": ckstore.now(),
                "paused_seconds": round(paused_s, 3),
                "seconds": round(time.monotonic() - t0, 3),
            }
            return ckstore.write_manifest(runner, cid, manifest, d / "manifest", timeouts.recipe, labels)
    except BaseException:
        ckstore.remove(runner, cid, timeouts.command)
        raise


SETTLE_PARENT = "/tmp"  # where a settle helper holds the copy: a directory every image has, and no VOLUME


def _settle(
    runner: Runner,
    s: _Service,
    info: Mapping[str, Any],
    image: str,
    path: str,
    tar: Path,
    timeouts: Timeouts,
) -> None:
    """Run the kind's ``checkpoint_settle`` on the copy in ``tar`` (replaced by the settled copy): a
    helper container of the service's image, as the copy's owner, without network, stdin empty; removed
    on every path (and labelled like the service, so ``forge reap`` finds one a kill -9 left)."""
    copy_dir = f"{SETTLE_PARENT}/{Path(path).name}"
    argv = s.recipe.checkpoint_settle(s.ctx, copy_dir)
    if not argv:
        return
    uid = _owner(tar)
    # this process's, not the source stack's owner (a kept stack's may be gone): no reaper takes it meanwhile
    labels = {**_helper_labels(info), **lab.current_owner().labels(), lab.HELPER: "checkpoint-settle"}
    name = f"forge-settle-{secrets.token_hex(6)}"
    create = dk.create(
        image, list(argv[1:]),
        name=name, network="none", user=str(uid), entrypoint=argv[0],
        label=[f"{k}={v}" for k, v in sorted(labels.items())],
    )  # fmt: skip
    try:
        runner.run(create, timeout=timeouts.command, tag="create")
        runner.run(
            dk.cp("-", f"{name}:{SETTLE_PARENT}", archive=True), stdin=tar, timeout=timeouts.recipe, tag="cp"
        )
        res = runner.run(dk.start([name], attach=True), timeout=timeouts.recipe, check=False, tag="settle")
        if res.rc != 0:
            lines = res.stderr.strip().splitlines() or res.stdout.strip().splitlines()
            said = lines[-1] if lines else f"rc={res.rc}"
            raise CheckpointError(f"service {s.name!r}: settling its captured copy failed: {said}")
        runner.run(dk.cp(f"{name}:{copy_dir}", "-"), timeout=timeouts.recipe, stdout_path=tar, tag="cp")
    finally:
        runner.run(dk.rm([name], force=True, volumes=True), timeout=timeouts.command, check=False, tag="rm")


def _owner(tar: Path) -> int:
    """The uid owning the copy's top directory (``docker cp`` puts it first in its tar). Alone, not with
    its gid: ``docker cp --archive`` looks the container's user up in the image's passwd database."""
    with tarfile.open(tar, "r|") as tf:
        top = tf.next()
    if top is None:
        raise CheckpointError(f"the captured copy {tar} is empty")
    return top.uid


def _pause(runner: Runner, refs: Sequence[str], paused: list[str], timeouts: Timeouts) -> None:
    """Pause ``refs`` (recorded in ``paused`` first: a refusal may come after some were frozen). The
    kernel's freezer can refuse a container whose process is in an uninterruptible wait: tried again."""
    running = [r for r in refs if r]
    if not running:
        return
    paused.extend(running)
    for attempt in range(1, PAUSE_ATTEMPTS + 1):
        res = runner.run(dk.pause(running), timeout=timeouts.command, check=False, tag="pause")
        if res.rc == 0:
            return
        runner.run(dk.unpause(running), timeout=timeouts.command, check=False, tag="unpause")
        if attempt == PAUSE_ATTEMPTS:
            said = (res.stderr.strip().splitlines() or [f"rc={res.rc}"])[-1]
            raise CheckpointError(f"could not pause the stack's services for a consistent capture: {said}")


def _unpause(runner: Runner, paused: list[str], timeouts: Timeouts) -> None:
    if paused:
        runner.run(dk.unpause(paused), timeout=timeouts.command, check=False, tag="unpause")
        paused.clear()


# ---------------------------------------------------------------------------------------------- fork


@dataclass
class CheckpointSteps(FreshSteps):
    """The fresh pipeline's steps for a fork: each captured service on its checkpoint image (no recipe),
    its fingerprint checked once the stack is up; the other services as a fresh stack's."""

    checkpoint: Checkpoint
    runner: Runner
    timeouts: Timeouts
    records_: dict[str, dict[str, Any]] = field(default_factory=dict)
    # what the services' images are now: looked up once for all the forks of one ``fork`` call
    images_seen: _ImageIds = field(default_factory=lambda: _ImageIds())

    def images(self, bindings: Sequence[_Binding], locks: Any) -> list[Any]:
        def plan(services: Mapping[str, ServiceConfig]) -> Mapping[str, str]:
            self._check_images(services)
            out = {}
            for svc, rec in self.checkpoint.services.items():
                why = unrestorable(services[svc], str(rec["path"])) if svc in services else "not in the stack"
                if why:
                    raise CheckpointError(f"checkpoint {self.checkpoint.id}: service {svc!r}: {why}")
                out[svc] = str(rec["image"])
            return out

        return [("checkpoint_plan", "compose_config", plan)]

    def _check_images(self, services: Mapping[str, ServiceConfig]) -> None:
        for svc, image in sorted(self.checkpoint.images.items()):
            if svc not in services:
                continue
            now = self.images_seen.id(self.runner, services[svc].image, self.timeouts.command)
            if now and now != image:
                raise CheckpointError(
                    f"checkpoint {self.checkpoint.id}: service {svc!r} now runs image {now[:19]}, not the "
                    f"{image[:19]} it ran at capture (the image changed): not forked"
                )

    def needs_recipe(self, service: str) -> bool:
        return service not in self.checkpoint.services

    def ready(self, b: _Binding, ctx: ApplyContext, phase: PhaseTimer) -> None:
        rec = self.checkpoint.services.get(b.service)
        if rec is None:
            return
        with phase(f"checkpoint_verify:{b.service}", "checkpoint"):
            _verify(b.recipe, ctx, rec, self.checkpoint.id)
        self.records_[b.service] = {"outcome": "forked", "checkpoint": self.checkpoint.id}

    def started(
        self, bindings: Sequence[_Binding], context: Callable[[_Binding], ApplyContext], phase: PhaseTimer
    ) -> None:
        for b in bindings:
            if b.service not in self.records_:
                self.ready(b, context(b), phase)

    def records(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self.records_.items()}


class _ImageIds:
    """image reference -> its ID on the engine, each looked up once (thread-safe: forks come up at once)."""

    def __init__(self) -> None:
        self._ids: dict[str, str] = {}
        self._lock = threading.Lock()

    def id(self, runner: Runner, ref: str, timeout: float) -> str:
        with self._lock:
            if ref not in self._ids:
                self._ids[ref] = ckstore.image_id(runner, ref, timeout)
            return self._ids[ref]


def same_recipe(ck: Checkpoint, service: str, recipe: Recipe) -> None:
    """Refuse ``ck``'s capture of ``service`` when ``recipe`` is not at the version that captured it (or
    the checkpoint recorded none): a kind bumps ``RECIPE_VERSION`` when what it captures or how its
    fingerprint is taken changes, so the fingerprint recorded then cannot verify a fork or restore now."""
    rec = ck.services.get(service) or {}
    then, now = rec.get("recipe_version"), recipe.RECIPE_VERSION
    if then == now:
        return
    was = f"version {then}" if then is not None else "a version this checkpoint does not record (older)"
    raise CheckpointError(
        f"checkpoint {ck.id}: service {service!r} was captured by the {rec.get('kind')} recipe's {was}, "
        f"this forgelib's is version {now} (what it captures or checks changed): take a new checkpoint "
        f"(`forge checkpoint STACK`) and remove this one (`forge snapshots prune --checkpoint {ck.id}`)"
    )


def _verify(recipe: Recipe, ctx: ApplyContext, rec: Mapping[str, Any], cid: str) -> None:
    try:
        found = recipe.golden_fingerprint(ctx)
    except RecipeError as e:
        raise ProvisionError("checkpoint", f"could not read {ctx.service}'s restored state: {e}") from e
    differ = fingerprint_diff(rec.get("fingerprint") or {}, found)
    if differ:
        raise ProvisionError(
            "checkpoint",
            f"service {ctx.service!r} is not at checkpoint {cid} "
            f"(fingerprint parts differ: {', '.join(differ)})",
        )


def fork(
    stacks: StacksView, checkpoint_id: str, n: int, *, trial_dir: Path, run_id: str | None = None
) -> list[Stack]:
    """``n`` new stacks of ``stacks.project``, each at checkpoint ``checkpoint_id`` (verified first), their
    files under ``trial_dir/fork-<i>``; registered with ``stacks`` (torn down when it closes, or by
    ``teardown``). ``run_id``: their run label (``forge reap --run``); a new one per call by default.

    The forks come up together, in groups of ``FORKS_PER_START``: a group's forks are counted in
    ``stacks``' memory budget (waiting for room), then the group holds one of its start places (the bound
    every stack of every forge process on the engine shares: ``Admission.starting``) while all its forks
    come up at once, as one step; groups take places as any stack does. One checkpoint load and one look
    at the services' images serve every fork. A fork that fails tears itself down; the others (those
    already up, and those coming up as it failed) go with ``stacks``, the ones not begun are not begun,
    and the first failure is raised once every fork under way has ended.

    Kept forks (``stacks`` opened ``kept``: ``forge provision --from-checkpoint``) are counted in the
    budget while the call brings them up, as any fork, and give their room back as it returns them: a
    kept stack is the caller's from then on, never this process's to tear down, so holding its room
    would only starve the caller's later stacks (the memory it takes is in the engine's ``MemAvailable``
    for whoever opens a budget next). When the call fails, the kept forks already up were never handed
    over: they are torn down (a kept stack is never reaped)."""
    project = stacks.project
    if project is None:
        raise ForgeError("fork: stacks opened without a project")
    if n < 1:
        raise ForgeError(f"fork: the number of stacks must be at least 1, not {n}")
    ck = ckstore.load(stacks.runner, checkpoint_id, stacks.timeouts.command)
    if ck.manifest.get("project") != project.name:
        raise CheckpointError(
            f"checkpoint {ck.id} was taken of project {ck.manifest.get('project')!r}, not {project.name!r}"
        )
    written = ResolvedConfig.of(project.environment.compose)
    for svc, rec in sorted(ck.services.items()):
        recipe = kinds.recipe_for(str(rec.get("kind")), written.service(svc))
        if recipe is not None:
            same_recipe(ck, svc, recipe)
    ctx: StackContext = stacks.backend.ctx
    # a run of its own per call: two forks of one checkpoint in one process never share a project name
    run_id = run_id or f"fork-{ck.id}-{secrets.token_hex(3)}"
    env = _environment(project, ck)
    seen = _ImageIds()
    specs = [
        StackPlan(
            env,
            project_name(project.name, run_id, FORK_TASK, i, 1),
            lab.run_labels(run_id, lab.trial_label(FORK_TASK, i), kept=ctx.kept, work_dir=ctx.work_dir),
            trial_dir / f"fork-{i}",
        )
        for i in range(n)
    ]

    def one(spec: StackPlan) -> Stack:
        return provision_stack(
            ctx, spec, CheckpointSteps(ck, stacks.runner, stacks.timeouts, images_seen=seen)
        )

    groups = [specs[i : i + FORKS_PER_START] for i in range(0, n, FORKS_PER_START)]
    hopeless = functools.partial(_beyond_budget, stacks.admission, n, project.name)

    def bring_up(kept: list[Stack]) -> list[Stack]:
        made = _concurrently(
            stacks, lambda group: _group(stacks, ctx, group, one, kept, hopeless), groups, main=True
        )
        return [trial for group in made for trial in group]

    return _hand_over(stacks, bring_up)


def _hand_over(stacks: StacksView, bring_up: Callable[[list[Stack]], list[Stack]]) -> list[Stack]:
    """``bring_up(kept)``'s stacks; the kept ones it put on ``kept`` (as they came up) give their room in
    the budget back as they are returned, or are torn down (and give it back) when it fails."""
    kept: list[Stack] = []  # appended from the forks' threads
    try:
        return bring_up(kept)
    except BaseException:
        for trial in kept:
            with contextlib.suppress(Exception):  # the failure raised is the one to report
                teardown_trial(trial, graceful=False)
        raise
    finally:
        for _ in kept:
            stacks.admission.leave()


def _beyond_budget(admission: Admission, n: int, project: str) -> str | None:
    """Why ``n`` forks can never all be up at once (None: they may): the stacks' measured footprint says
    the memory budget holds fewer. Every fork holds its room until the call returns them all, so waiting
    for more room would wait for ever."""
    per_stack, budget = admission.per_stack, admission.budget
    cap = capacity(per_stack, budget)
    if per_stack is None or budget is None or cap is None or n <= cap:
        return None
    return (
        f"fork: {n} stacks of {project} do not fit the memory budget ({budget // MIB} MiB holds "
        f"{cap} stacks of {per_stack // MIB} MiB each); fork at most {cap} at once "
        "(forge provision --count), or give stacks.open a larger memory_budget_mb"
    )


def _group(
    stacks: StacksView,
    ctx: StackContext,
    specs: Sequence[StackPlan],
    one: Callable[[StackPlan], Stack],
    kept: list[Stack] | None = None,
    hopeless: Callable[[], str | None] = lambda: None,
) -> list[Stack]:
    """``specs``' forks counted in the memory budget, then brought up at once under one start place, each
    registered with ``stacks`` as it is up (its teardown gives its room back). A kept stack (``forge
    provision --keep``) is never registered: it outlives this process on purpose; it goes on ``kept``
    instead, still counted (``fork`` gives its room back as it hands it over)."""
    admission = stacks.admission
    counted = 0
    begun: list[StackPlan] = []
    try:
        memory = 0.0
        for _ in specs:
            memory += admission.enter(hopeless)
            counted += 1
        with admission.starting() as queued:
            waits = {"memory_wait": round(memory, 3), "start_wait": round(queued, 3)}

            def up(spec: StackPlan) -> Stack:
                begun.append(spec)
                try:
                    trial = one(spec)
                except BaseException:
                    admission.leave()
                    raise
                trial = dataclasses.replace(trial, timings={**trial.timings, **waits})
                if not ctx.kept:
                    return _registered(stacks, trial)
                if kept is not None:
                    kept.append(trial)
                return trial

            made = _concurrently(stacks, up, specs, main=False)
    finally:
        for _ in range(counted - len(begun)):  # counted, never begun: their room back
            admission.leave()
    admission.measure("fresh", ctx.runner, made[0].name, timeout=ctx.timeouts.command)
    return made


def _registered(stacks: StacksView, trial: Stack) -> Stack:
    try:
        stacks.live.add(trial.name, _teardown(trial, stacks.admission.leave))
    except BaseException:  # a stop came while it came up: nobody else will tear it down
        teardown_trial(trial, graceful=False)
        stacks.admission.leave()
        raise
    return trial


def _concurrently(
    stacks: StacksView, do: Callable[[Any], Any], items: Sequence[Any], *, main: bool
) -> list[Any]:
    """``do(item)`` for every item, each on a thread of its own; the answers in ``items``' order. The
    first failure cancels what has not begun and is raised once the rest ended. ``main``: called on the
    main thread, which a stop (Ctrl-C) interrupts: waited for outside ``concurrent.futures``' own locks
    (``StopState.deferred``), and raised as ``KeyboardInterrupt`` once every item under way ended."""
    pool = ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="forge-fork")
    futures = [pool.submit(do, item) for item in items]
    try:
        pending: set[Future[Any]] = set(futures)
        while pending:
            with stacks.stop.deferred() if main else contextlib.nullcontext():
                done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            for f in done:
                if (error := f.exception()) is not None:
                    for other in pending:
                        other.cancel()
                    raise error
            if main and stacks.stop.requested:
                raise KeyboardInterrupt
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # every fork under way has ended (up, or torn down)


def _teardown(trial: Stack, then: Callable[[], None]) -> Callable[[bool], float]:
    def down(graceful: bool) -> float:
        try:
            return teardown_trial(trial, graceful=graceful)
        finally:
            then()

    return down


def _environment(project: Project, ck: Checkpoint) -> EnvironmentManifest:
    """The project environment the checkpoint's source stack ran (the default, or the task whose
    services match)."""
    wanted = sorted(ck.manifest.get("stack_services") or [])
    for env in [project.environment, *(t.environment for t in project.tasks)]:
        if sorted(env.services) == wanted:
            return env
    raise CheckpointError(f"checkpoint {ck.id}: no environment of project {project.name!r} has its services")


# ------------------------------------------------------------------------------------------- restore

_RESTORE = 'set -e; s="$1"; t="$2"; find "$t" -mindepth 1 -delete; cp -a "$s/." "$t/"'
RESTORE_FILE = "compose.restore.yaml"  # in a stack's directory: the images its recreated services run


def restore(stacks: StacksView, trial: Stack, checkpoint_id: str) -> Stack:
    """Roll ``trial``'s captured services back to ``checkpoint_id`` in place; the trial with its published
    ports read again (a restarted container gets new host ports) and ``timings["restore:<service>"]``."""
    project = stacks.project
    if project is None:
        raise ForgeError("restore: stacks opened without a project")
    return roll_back(project, trial, checkpoint_id, stacks.runner, stacks.timeouts)


def roll_back(
    project: Project, trial: Stack, checkpoint_id: str, runner: Runner, timeouts: Timeouts
) -> Stack:
    """``restore`` without a ``Stacks`` (``forge restore`` on a kept stack).

    Each service is first restored by its kind in its running container (``_in_place``): the same
    container, its ports kept. Where that is declined or leaves the fingerprint different, through the
    checkpoint's image: a captured directory on a **volume** (a stack provisioned from its seeds: the
    image's ``VOLUME`` or the compose file's) is refilled from the checkpoint image by a helper container
    while the service is stopped. A directory in the container's **own layer** (a fork's, whose
    checkpoint image has no ``VOLUME`` there, or a tree outside any volume) is put back by recreating the
    service's container from the checkpoint image (``compose up --force-recreate --no-deps``, the image
    named in ``RESTORE_FILE``): that container then holds exactly what a fork's would, so changes the
    trial made elsewhere in that
    container's file system go too."""
    ck = ckstore.load(runner, checkpoint_id, timeouts.command)
    compose = trial.compose
    infos = compose.inspect()
    _owned(trial, infos)
    served = compose.served(found=infos)
    by_name = {s.name: s for s in _services(project, trial, timeouts)}
    if ck.manifest.get("project") != project.name or set(ck.services) - set(by_name):
        raise CheckpointError(f"checkpoint {ck.id} is not of this stack's project and services")
    for svc in sorted(ck.services):  # every one before any is restored: never half a restore
        same_recipe(ck, svc, by_name[svc].recipe)
    timings = dict(trial.timings)
    restarted = False
    for svc, rec in sorted(ck.services.items()):
        t0 = time.monotonic()
        found = served.get(svc) or []
        if not found:
            raise CheckpointError(f"stack {trial.name} has no container for service {svc!r}")
        info = found[0]
        if str(info.get("Image")) != rec.get("base") and str(info.get("Image")) != rec.get("image"):
            raise CheckpointError(
                f"service {svc!r} of {trial.name} runs another image than at checkpoint {ck.id}: not restored"
            )
        s = by_name[svc]
        verified = _in_place(s, dataclasses.replace(s.ctx, compose=compose), info, rec, ck.id)
        if verified is not None:
            timings[f"restore:{svc}"] = time.monotonic() - t0
            timings[f"restore_verify:{svc}"] = verified
            continue
        restarted = True
        on_volume = _volume_at(info, str(rec["path"]))
        if on_volume is None:
            compose = _recreate(trial, compose, svc, str(rec["image"]), timeouts)
        else:
            _refill(runner, compose, svc, info, rec, on_volume, timeouts)
        s.ctx.addresses.clear()
        t1 = time.monotonic()
        try:
            _verify(s.recipe, dataclasses.replace(s.ctx, compose=compose), rec, ck.id)
        except ProvisionError as e:
            raise CheckpointError(e.reason) from e
        timings[f"restore:{svc}"] = time.monotonic() - t0
        timings[f"restore_verify:{svc}"] = time.monotonic() - t1
    ports = compose.published_ports() if restarted else trial.ports
    return dataclasses.replace(trial, compose=compose, ports=ports, timings=timings)


def _in_place(
    s: _Service, ctx: ApplyContext, info: Mapping[str, Any], rec: Mapping[str, Any], cid: str
) -> float | None:
    """The kind's restore of the live service in place (``Recipe.checkpoint_restore``), its fingerprint
    checked: how long that check took, when it put the service back at the checkpoint. None when the kind
    cannot here, or when the fingerprint still differs (what the kind does not restore in place changed:
    redis's configuration); the caller then restores through the checkpoint's image, which puts back
    everything."""
    image = str(rec["image"])
    copy = CheckpointCopy(
        image=image, path=str(rec["path"]), key=image.removeprefix("sha256:"),
        labels=_helper_labels(info), info=info,
    )  # fmt: skip
    _published(ctx, info)
    try:
        if not s.recipe.checkpoint_restore(ctx, copy):
            return None
    except RecipeError as e:
        raise CheckpointError(f"restoring {s.name!r} of {ctx.compose.name} to checkpoint {cid}: {e}") from e
    t0 = time.monotonic()
    try:
        _verify(s.recipe, ctx, rec, cid)
    except ProvisionError:
        return None
    return time.monotonic() - t0


def _published(ctx: ApplyContext, info: Mapping[str, Any]) -> None:
    """The loopback publications of the service's container, from its ``docker inspect``, into
    ``ctx.addresses``: a restore in place keeps the container and its ports, so none is asked again."""
    ports = (info.get("NetworkSettings") or {}).get("Ports") or {}
    for mapping, binds in ports.items():
        number, _, proto = str(mapping).partition("/")
        if proto != "tcp" or not number.isdigit():
            continue
        for b in binds or []:
            port = str(b.get("HostPort", ""))
            if port.isdigit() and int(port):
                host = str(b.get("HostIp") or "127.0.0.1")
                ctx.addresses[(ctx.service, int(number))] = (
                    "127.0.0.1" if host in ("0.0.0.0", "::", "") else host,
                    int(port),
                )
                break


def _refill(
    runner: Runner,
    compose: ComposeProject,
    svc: str,
    info: Mapping[str, Any],
    rec: Mapping[str, Any],
    on_volume: tuple[str, str],
    timeouts: Timeouts,
) -> None:
    """Stop the service, empty the volume under its directory and copy the captured one in, start it."""
    container = str(info.get("Id"))
    target, volume = on_volume
    runner.run(dk.stop([container]), timeout=timeouts.teardown, tag="stop")
    try:
        argv = dk.run(
            str(rec["image"]),
            ["-c", _RESTORE, "forge-restore", str(rec["path"]), target],
            rm=True, network="none", user="0", entrypoint="sh",
            mount=f"type=volume,src={volume},dst=/forge-restore",
            label=[f"{k}={v}" for k, v in sorted(_helper_labels(info).items())],
        )  # fmt: skip
        runner.run(argv, timeout=timeouts.recipe, tag="run")
    finally:
        runner.run(dk.start([container]), timeout=timeouts.compose_up, tag="start")
    readiness.wait_ready(compose, [svc], refs=[container], timeout=timeouts.compose_up)


def _recreate(
    trial: Stack, compose: ComposeProject, svc: str, image: str, timeouts: Timeouts
) -> ComposeProject:
    """Recreate ``svc``'s container from ``image`` (written into the stack's ``RESTORE_FILE``, the last of
    its compose files); the compose project with that file."""
    path = trial.trial_dir / RESTORE_FILE
    doc = restore_images(trial.trial_dir)
    doc[svc] = image
    write_override(path, {"services": {k: {"image": v} for k, v in sorted(doc.items())}}, header=_RESTORED)
    compose = compose.with_files(*[f for f in compose.files if f != path], path)
    compose.up([svc], wait=False, no_deps=True, force_recreate=True, timeout=timeouts.compose_up)
    readiness.wait_ready(compose, [svc], timeout=timeouts.compose_up)
    return compose


_RESTORED = "the images of services forge restore recreated from a checkpoint"


def restore_images(trial_dir: Path) -> dict[str, str]:
    """service -> image: what ``RESTORE_FILE`` in ``trial_dir`` names (empty when there is none)."""
    try:
        doc = yaml.safe_load((trial_dir / RESTORE_FILE).read_text()) or {}
    except FileNotFoundError:
        return {}
    return {str(k): str(v.get("image")) for k, v in (doc.get("services") or {}).items()}


def _volume_at(info: Mapping[str, Any], path: str) -> tuple[str, str] | None:
    """Where ``path`` lies in the helper (under ``/forge-restore``) and the name of the volume holding it;
    None when it is in the container's own layer."""
    best: Mapping[str, Any] | None = None
    for m in info.get("Mounts") or []:
        dest = str(m.get("Destination", "")).rstrip("/")
        covers = m.get("Type") == "volume" and (path == dest or path.startswith(dest + "/"))
        if covers and (best is None or len(dest) > len(str(best.get("Destination", "")))):
            best = m
    if best is None:
        return None
    rel = path[len(str(best.get("Destination", "")).rstrip("/")) :]
    return "/forge-restore" + rel, str(best.get("Name"))


def _helper_labels(info: Mapping[str, Any]) -> dict[str, str]:
    """The service container's forge labels: the reaper finds a helper a kill -9 left."""
    out = {k: v for k, v in lab.of_inspect(info).items() if k.startswith("io.forgelib.")}
    out[lab.HELPER] = "checkpoint-restore"
    return out


__all__ = [
    "RESTORE_FILE",
    "Checkpoint",
    "CheckpointError",
    "CheckpointSteps",
    "capture",
    "checkpoint",
    "fork",
    "restore",
    "restore_images",
]
