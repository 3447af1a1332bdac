"""A warm stack that starts from a checkpoint (a task's ``setup:`` end state) and is reset to it in place.

``CheckpointWarmSteps`` are a fork's steps (``stacks.checkpoints.CheckpointSteps``: each captured service on
its checkpoint image, no recipe) with the warm preparation of ``WarmSteps`` taken from the checkpoint, not
the seed: each captured service comes up first, with the services it depends on and before any of its
dependents (``starts_first``), its fingerprint is checked against the one taken at capture, and only then is
it prepared for in-place resets by its kind's ``checkpoint_prepare`` (postgres's and mysql's pristine copy of
the data directory, redis's keyspace, the tree's entries: all of the state it started with) and its baseline
fingerprint taken. So every later reset puts the checkpoint's state back, and the pool's check after each
reset compares to a baseline proven equal to the checkpoint's. A reset service the checkpoint did not
capture (``checkpoint: fresh``) is seeded and prepared as on any warm stack.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from forgelib.kinds.base import ApplyContext, PreparedSeed
from forgelib.stacks.checkpoints import CheckpointSteps
from forgelib.stacks.provision import PhaseTimer, prepare_seed

if TYPE_CHECKING:
    from forgelib.stacks.provision import _Applied, _Binding


@dataclass
class CheckpointWarmSteps(CheckpointSteps):
    """A warm stack's steps from checkpoint ``checkpoint`` (see the module's docstring)."""

    def starts_first(self, service: str) -> bool:
        return service in self.checkpoint.services

    def seeded(self, applied: _Applied, phase: PhaseTimer) -> tuple[PreparedSeed, ...]:
        for b, ctx in applied:
            if b.service not in self.records_:  # not yet checked as it became ready (``ready``)
                self.ready(b, ctx, phase)
        if not applied:
            return ()
        with phase("warm_prepare", None):
            return tuple(
                prepare_seed(b, ctx, live=b.service in self.checkpoint.services) for b, ctx in applied
            )

    def started(
        self, bindings: Sequence[_Binding], context: Callable[[_Binding], ApplyContext], phase: PhaseTimer
    ) -> None:
        """Nothing more: each captured service was checked before its dependents started (``seeded``), and
        the pool checks every reset against the baseline taken then."""


__all__ = ["CheckpointWarmSteps"]
