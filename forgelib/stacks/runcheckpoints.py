"""The checkpoints a run takes for itself: a task's ``setup:`` end state (``forgelib.run.setup``).

``take`` checkpoints the task's setup stack (``stacks.checkpoints.capture``) with the run's labels on its
manifest (``snapshots.checkpoints.run_scoped``: the run's own, so ``forge reap`` removes it once the run's
process is gone); ``steps`` gives the fresh pipeline's steps of a trial that forks it (loaded and verified
once per run, each fork's images and fingerprints checked as every fork's are), ``warm_steps`` a warm stack's
that starts from it and is reset to it (``stacks.warm.checkpoint``); ``finish`` removes every
one the run took, as the run ends (interrupted or not).

On a cluster the setup runs on one node; ``export`` packs its checkpoint for the others
(``snapshots.transfer``), and each other node's ``adopt`` loads it on its engine as that node's own copy
of the run's checkpoint: registered before the load starts (so ``finish`` removes a load cut short too),
its manifest image written by the adopting process (so ``forge reap`` there judges it by that process).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from forgelib.errors import ForgeError
from forgelib.stacks.checkpoints import CheckpointSteps, capture
from forgelib.stacks.provision import StackContext
from forgelib.stacks.snapshots import checkpoints as ckstore
from forgelib.stacks.snapshots.checkpoints import Checkpoint
from forgelib.stacks.snapshots.transfer import CheckpointCopy, pack, unpack
from forgelib.stacks.stack import Stack
from forgelib.stacks.warm.checkpoint import CheckpointWarmSteps


@dataclass
class RunCheckpoints:
    """The checkpoints one backend's run took, by id (thread-safe: the run's workers ask at once)."""

    taken: dict[str, Checkpoint] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    adopting: set[str] = field(default_factory=set)  # copies being loaded here: ``finish`` removes them too

    def take(self, ctx: StackContext, trial: Stack, run_id: str) -> str:
        """Checkpoint ``trial`` (a task's setup stack) for ``run_id``; its id."""
        ck = capture(ctx.project, trial, ctx.runner, ctx.timeouts, labels=ckstore.run_scoped(run_id))
        with self.lock:
            self.taken[ck.id] = ck
        return ck.id

    def export(self, ctx: StackContext, checkpoint_id: str, workdir: Path) -> CheckpointCopy:
        """This run's checkpoint ``checkpoint_id``, verified, packed for another engine (``adopt``)."""
        return pack(ctx.runner, self._load(ctx, checkpoint_id), workdir, ctx.timeouts.command)

    def adopt(self, ctx: StackContext, copy: CheckpointCopy, run_id: str, workdir: Path) -> str:
        """Load ``copy`` (another engine's checkpoint of ``run_id``) on this engine as this run's own; its
        id once it verifies. Nothing to do when this engine already has it as this run's."""
        with self.lock:
            if copy.id in self.taken:
                return copy.id
            self.adopting.add(copy.id)
        ck = unpack(ctx.runner, copy, workdir, ctx.timeouts.command, ckstore.run_scoped(run_id))
        with self.lock:
            self.taken[ck.id] = ck
            self.adopting.discard(ck.id)
        return ck.id

    def steps(self, ctx: StackContext, checkpoint_id: str) -> CheckpointSteps:
        """A fork's steps: each captured service on its checkpoint image, its fingerprint checked."""
        return CheckpointSteps(self._load(ctx, checkpoint_id), ctx.runner, ctx.timeouts)

    def warm_steps(self, ctx: StackContext, checkpoint_id: str) -> CheckpointWarmSteps:
        """A warm stack's steps from the checkpoint: a fork's, each captured service then prepared for
        in-place resets to the checkpoint's state (``stacks.warm.checkpoint``)."""
        return CheckpointWarmSteps(self._load(ctx, checkpoint_id), ctx.runner, ctx.timeouts)

    def _load(self, ctx: StackContext, checkpoint_id: str) -> Checkpoint:
        with self.lock:
            ck = self.taken.get(checkpoint_id)
        if ck is None:  # not this run's: verified as any other checkpoint is
            ck = ckstore.load(ctx.runner, checkpoint_id, ctx.timeouts.command)
        return ck

    def finish(self, ctx: StackContext) -> None:
        """Remove every checkpoint taken here; what could not be removed, raised once all were tried."""
        with self.lock:
            ids, self.taken, self.adopting = sorted({*self.taken, *self.adopting}), {}, set()
        failed = [
            f"{cid}: {why}" for cid in ids if (why := ckstore.remove(ctx.runner, cid, ctx.timeouts.teardown))
        ]
        if failed:
            raise ForgeError(f"could not remove the run's checkpoint(s): {'; '.join(failed)}")


__all__ = ["RunCheckpoints"]
