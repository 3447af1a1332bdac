"""The golden side of provisioning one fresh trial: plan (restore, or capture under the key's lock),
capture after the seed, verify after a restore, discard a golden that fails.

``forgelib.stacks.provision`` calls it; every decision about *what* a kind captures and how its state is read
stays in the seed module (``golden_path``, ``state_digest``, ``RECIPE_VERSION``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from forgelib.docker import argv as dk
from forgelib.docker.compose import ComposeProject
from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import ForgeError, Interrupted, ProvisionError
from forgelib.kinds.base import ApplyContext, Recipe, fingerprint_diff
from forgelib.runner import Runner
from forgelib.spec.models import Seed, Timeouts
from forgelib.stacks.snapshots import store
from forgelib.stacks.snapshots.key import GoldenKey, canonical, make_key

log = logging.getLogger("forgelib.stacks.snapshots")


class GoldenFailed(Exception):
    """A restored golden did not come up, or came up with state other than the golden's: the trial's
    stack is discarded and provisioned again the normal way (internal control flow, never user-facing)."""

    def __init__(self, plan: Plan, reason: str) -> None:
        super().__init__(f"{plan.service}: {reason}")
        self.plan = plan
        self.reason = reason


@dataclass
class Plan:
    service: str
    key: GoldenKey | None = None
    golden: store.Golden | None = None  # restore the service from this golden
    capture: bool = False  # this trial holds the key's lock: seed normally, then capture
    lock: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def release(self) -> None:
        self.lock.close()


class Binding(Protocol):
    """What the planner needs of a reset binding (``provision._Binding`` satisfies it)."""

    @property
    def service(self) -> str: ...
    @property
    def seed(self) -> Seed: ...
    @property
    def recipe(self) -> Recipe: ...
    @property
    def options(self) -> Mapping[str, Any]: ...


@dataclass
class TrialGoldens:
    runner: Runner
    timeouts: Timeouts
    run_id: str
    project: str
    stopping: Callable[[], bool] = lambda: False
    # image ref -> the ID this owner last found it to have (its ``ProvisionCache``'s): a guess ``plan``
    # checks in the same answer it uses it in, never trusted alone.
    seen: dict[str, str] = field(default_factory=dict)
    disabled: set[str] = field(default_factory=set)  # services whose golden failed in this provisioning
    # service -> what happened, for trial.yaml: outcome restored | captured | none, golden (key prefix),
    # reason, and `discarded: {golden, reason}` when a golden failed and the trial fell back.
    records: dict[str, dict[str, Any]] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------ plan

    def plan(
        self,
        bindings: Sequence[Binding],
        services: Mapping[str, ServiceConfig],
        locks: contextlib.ExitStack,
    ) -> dict[str, Plan]:
        """A plan per reset service of a kind with goldens: restore when a complete golden of its key
        exists, claiming it (``store.key_claim``, held in ``locks``: until the trial's containers exist,
        ``prune`` leaves it alone); otherwise take the key's lock (waiting while another trial captures
        it), look again, and capture after seeding if it is still missing.

        The key holds the service's image ID, so finding a golden takes two looks: the image, then the
        key's tag. With an ID this owner saw before for the image (``seen``), both are one ``docker image
        inspect``: the key that ID gives is claimed first, and its golden is used only when the same answer
        shows the image still has that ID (else the key is the image's new one, looked up as without)."""
        plans: dict[str, Plan] = {}
        wanted = [b for b in bindings if b.recipe.SUPPORTS_GOLDEN and b.service not in self.disabled]
        configs = {b.service: services.get(b.service) or ServiceConfig(b.service) for b in wanted}
        with contextlib.ExitStack() as guesses:  # the guessed keys' claims, until each plan holds its own
            guessed: dict[str, tuple[GoldenKey, contextlib.ExitStack]] = {}
            for b in wanted:
                seen = self.seen.get(configs[b.service].image)
                k = self._key(b, configs[b.service], seen) if seen else None
                if k is not None and k.digest not in guessed:
                    claim = guesses.enter_context(contextlib.ExitStack())
                    claim.enter_context(
                        store.key_claim(k.digest, timeout=self._lock_timeout(), stopping=self.stopping)
                    )
                    guessed[k.digest] = (k, claim)
            images, found = self._look([configs[b.service].image for b in wanted], list(guessed))
            hits: dict[str, store.Golden] = {}
            for k, claim in guessed.values():
                golden = store.matching(found, k)
                if golden is None:  # none there: this trial may want the key's lock below
                    claim.close()
                else:
                    hits[k.digest] = golden
            capturing: set[str] = set()
            for b in sorted(wanted, key=lambda b: b.service):
                cfg = configs[b.service]
                image = images.get(cfg.image)
                if not image:
                    self._note(b.service, "none", reason=f"image {cfg.image!r} is not on the engine yet")
                    continue
                self.seen[cfg.image] = image
                key = self._key(b, cfg, image)
                p = Plan(b.service, key)
                plans[b.service] = p
                if key.digest in capturing:  # this trial holds the key's lock: another service captures it
                    continue
                # Looked up already, under the guess's claim (still held): claimed for the trial, not again.
                p.golden = self._claimed(p, locks, known=hits.get(key.digest), looked=key.digest in guessed)
                if p.golden is None:
                    p.lock.enter_context(
                        store.key_lock(key.digest, timeout=self._lock_timeout(), stopping=self.stopping)
                    )
                    locks.callback(p.release)
                    if store.find(self.runner, key, self.timeouts.command) is None:  # taken meanwhile?
                        p.capture = True
                        capturing.add(key.digest)
                    else:
                        p.release()
                        p.golden = self._claimed(p, locks)
        return plans

    def _key(self, b: Binding, cfg: ServiceConfig, image_id: str) -> GoldenKey:
        return make_key(
            kind=str(b.seed.kind),
            recipe_version=b.recipe.RECIPE_VERSION,
            image_id=image_id,
            seed_digest=b.seed.digest,
            options=b.options,
            service_config=cfg,
        )

    def _claimed(
        self, p: Plan, locks: contextlib.ExitStack, *, known: store.Golden | None = None, looked: bool = False
    ) -> store.Golden | None:
        """``p``'s complete golden, claimed for this trial until ``locks`` closes; None when there is none.
        ``looked``: already looked up while its key was claimed (``known``: what was found then)."""
        assert p.key is not None
        if looked and known is None:
            return None
        claim = contextlib.ExitStack()
        timeout = self._lock_timeout()
        claim.enter_context(store.key_claim(p.key.digest, timeout=timeout, stopping=self.stopping))
        golden = known if looked else store.find(self.runner, p.key, self.timeouts.command)
        if golden is None:
            claim.close()
            return None
        p.lock.enter_context(claim)
        locks.callback(p.release)
        return golden

    def _lock_timeout(self) -> float:
        # The holder seeds and captures one service: bounded by its own up, recipe and build timeouts.
        return self.timeouts.compose_up + 3 * self.timeouts.recipe

    def _look(self, refs: Sequence[str], keys: Sequence[str]) -> tuple[dict[str, str], list[store.Golden]]:
        """One ``docker image inspect`` of ``refs`` and the goldens tagged with ``keys``: ref -> image ID
        (the refs present), and the goldens found."""
        todo = sorted({r for r in refs if r})
        if not todo:
            return {}, []
        argv = dk.inspect([*todo, *(store.tag_of(k) for k in keys)], kind="image")
        res = self.runner.run(argv, timeout=self.timeouts.command, check=False)
        try:
            found = json.loads(res.stdout or "[]")
        except json.JSONDecodeError:
            return {}, []
        out: dict[str, str] = {}
        goldens: list[store.Golden] = []
        for info in found if isinstance(found, list) else []:
            if not isinstance(info, dict):
                continue
            if keys and store.is_golden(info):
                goldens.append(store.Golden.from_inspect(info))
            names = [*(info.get("RepoTags") or []), *(info.get("RepoDigests") or []), info.get("Id")]
            names += [n.removesuffix(":latest") for n in names if isinstance(n, str)]
            for ref in todo:
                if ref in names:
                    out[ref] = str(info.get("Id"))
        return out, goldens

    def images(self, plans: Mapping[str, Plan]) -> dict[str, str]:
        """service -> the golden image it starts from (by ID: a tag can be moved or removed meanwhile). The
        trial's override runs it (``compose.labels_override``'s ``built``: never pulled, and no volume for
        the image's VOLUMEs, which the golden does not declare at its data directory)."""
        return {s: p.golden.id for s, p in sorted(plans.items()) if p.golden is not None}

    # --------------------------------------------------------------------------------------- capture

    def capture(
        self, plan: Plan, recipe: Recipe, ctx: ApplyContext, seed: Seed, up: Callable[[], None]
    ) -> None:
        """Capture the freshly seeded service into a golden, then start it again (``up``). A golden that
        cannot be taken costs the trial nothing but a note: it goes on from its normally seeded state."""
        assert plan.key is not None
        svc = ctx.service
        stopped = False
        try:
            state = canonical(recipe.golden_fingerprint(ctx))
            path = recipe.golden_path(ctx)
            why = unrestorable(ctx.service_config, path)
            if why:
                self._note(svc, "none", plan.key, reason=why)
                return
            assert path is not None
            ctx.compose.stop([svc], timeout=self.timeouts.recipe)  # a clean shutdown: consistent files
            stopped = True
            with store.build_dir() as d:
                tar = d / "data.tar"
                ctx.compose.run(["cp", f"{svc}:{path}", "-"], stdout_path=tar, timeout=self.timeouts.recipe)
                labels = store.golden_labels(
                    plan.key, service=svc, project=self.project, seed=seed.name, path=path, state=state,
                    run_id=self.run_id, data_bytes=tar.stat().st_size, entries=tar_entries(tar),
                )  # fmt: skip
                golden = store.build(
                    self.runner, key=plan.key, path=path, data_tar=tar, labels=labels,
                    timeout=self.timeouts.recipe,
                )  # fmt: skip
            self._note(svc, "captured", plan.key, bytes=int(golden.labels.get(store.DATA_BYTES, 0)))
        except Interrupted:  # Ctrl-C, not a capture failure: nothing recorded, no restart (the stack goes)
            stopped = False
            raise
        except ForgeError as e:
            log.warning("could not capture a golden of %s: %s", svc, e)
            self._note(svc, "none", plan.key, reason=f"capturing the golden failed: {e}")
        finally:
            plan.release()
            if stopped:
                up()

    # ---------------------------------------------------------------------------------------- restore

    def restored(self, plans: Mapping[str, Plan]) -> list[str]:
        return [s for s, p in plans.items() if p.golden is not None]

    def verify(self, plan: Plan, recipe: Recipe, ctx: ApplyContext) -> None:
        """The restored service's golden fingerprint must equal the one taken when the golden was captured."""
        assert plan.golden is not None and plan.key is not None
        try:
            expected = json.loads(plan.golden.labels.get(store.STATE, ""))
        except ValueError:
            expected = None
        if not isinstance(expected, dict) or not expected:
            raise GoldenFailed(plan, "the golden carries no fingerprint to check its restore against")
        try:
            found = recipe.golden_fingerprint(ctx)
        except Interrupted:  # Ctrl-C says nothing about the golden: it stays
            raise
        except ForgeError as e:
            raise GoldenFailed(plan, f"could not read the restored state: {e}") from e
        differ = fingerprint_diff(expected, found)
        if differ:
            raise GoldenFailed(
                plan,
                f"the restored state is not the golden's (fingerprint parts differ: {', '.join(differ)})",
            )
        store.mark_used(plan.key.digest)
        self._note(ctx.service, "restored", plan.key)

    def check_started(
        self, compose: ComposeProject, plans: Mapping[str, Plan], services: Sequence[str], cause: ForgeError
    ) -> None:
        """After a failed ``up``: a restored service among ``services`` that is not running (or unhealthy)
        failed because of its golden (a corrupt data directory), so that golden is at fault."""
        restored = [s for s in self.restored(plans) if not services or s in services]
        failed = getattr(cause.__cause__, "service", None)  # readiness.NotReady names the service
        if failed is not None:  # that service did not get ready: its golden's fault if it has one
            if failed in restored:
                tail = compose.log_tail(failed, 10)
                raise GoldenFailed(
                    plans[failed], f"did not start from the golden ({cause}); log tail:\n{tail}"
                )
            return
        if not restored:
            return
        states = self._observe(compose, restored, cause)
        for svc in restored:
            found = states.get(svc) or [("absent", "")]
            # "starting" is no verdict: Docker's first probe comes one (spaced-out) interval after start.
            if any(status != "running" or health == "unhealthy" for status, health in found):
                tail = compose.log_tail(svc, 10)
                raise GoldenFailed(plans[svc], f"did not start from the golden ({cause}); log tail:\n{tail}")

    def _observe(
        self, compose: ComposeProject, restored: Sequence[str], cause: ForgeError
    ) -> dict[str, list[tuple[str, str]]]:
        """The restored services' container states, looked at twice at most. A look that fails (the engine
        did not answer) is no verdict on a golden: a discard would throw away a good golden and make later
        trials pay a capture again, so the trial fails instead, saying why, and its goldens stay."""
        for attempt in (1, 2):
            try:
                return compose.service_states(restored)
            except Interrupted:
                raise
            except ForgeError as e:
                if attempt == 2:
                    stage = getattr(cause, "stage", "compose_up")
                    reason = getattr(cause, "reason", str(cause))
                    raise ProvisionError(
                        stage,
                        f"{reason}; whether the restored service(s) {', '.join(restored)} started from their"
                        f" goldens could not be checked, so the goldens are kept (looking at their containers"
                        f" failed twice: {e})",
                    ) from e
                log.warning("looking at the restored services failed, once more: %s", e)
        raise AssertionError("unreachable")

    def discard(self, plan: Plan, reason: str) -> None:
        """Untag the failed golden (no trial restores it again; its image goes once unused) and record
        why, loudly: the trial falls back to the normal path."""
        assert plan.golden is not None and plan.key is not None
        log.warning("discarding golden %s of %s: %s", plan.key.digest[:12], plan.service, reason)
        err = store.remove(self.runner, plan.golden, force_untag=True)
        if err:
            log.warning("removing golden %s: %s", plan.key.digest[:12], err)
        self.disabled.add(plan.service)
        self.records[plan.service] = {"discarded": {"golden": plan.key.digest[:12], "reason": reason}}

    def _note(self, service: str, outcome: str, key: GoldenKey | None = None, **extra: Any) -> None:
        rec = self.records.setdefault(service, {})
        rec["outcome"] = outcome
        if key is not None:
            rec["golden"] = key.digest[:12]
        rec.update(extra)


def tar_entries(path: Path) -> int:
    """Members of a tar archive (streamed: only the headers are read)."""
    with tarfile.open(path, "r|") as tf:
        return sum(1 for _ in tf)


def unrestorable(service_config: ServiceConfig, path: str | None) -> str | None:
    """Why a golden of ``path`` could not be restored into this service, or None. A golden is the image's
    content at ``path``: Docker copies it into a fresh *volume* mounted there (or the container's own file
    system holds it), but a bind mount hides it and ``nocopy`` skips the copy."""
    if not path or not path.startswith("/"):
        return f"the service reported no usable data directory ({path!r})"
    for m in service_config.volumes:
        target = str(m.get("target") or "").rstrip("/")
        covers = path == target or path.startswith(target + "/")
        if covers and m.get("type") == "bind":
            return (
                f"its data directory {path} is a bind mount ({m.get('source')}), which a golden cannot fill"
            )
        if covers and m.get("type") == "volume" and (m.get("volume") or {}).get("nocopy"):
            return f"the volume at {target} is mounted with nocopy, so Docker would not fill it from a golden"
        if covers and m.get("type") == "tmpfs":
            return f"its data directory {path} is a tmpfs"
    return None
