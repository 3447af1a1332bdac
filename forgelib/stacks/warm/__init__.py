"""Warm stacks (``forge run --stacks warm``): each worker keeps a stack up for the whole run and resets it
in place between trials, instead of a fresh ``up``/``down`` per trial.

* ``pool`` — ``WarmPool``: which stack a trial gets (per environment, at most ``workers``, grown or waited
  for), the reset services' in-place reset and fingerprint check, replacing a stack nobody proved clean,
  teardown.
* ``checkpoint`` — ``CheckpointWarmSteps``: a warm stack that starts from a checkpoint (a task's ``setup:``)
  and whose resets put the checkpoint's state back, not the seed's.
* ``ephemeral`` — ``Ephemerals``: a new container per trial for every ephemeral service of a stack
  (precreated beside the running trial, frozen and retired after it, started once proven never started).

The names below are what the rest of forgelib, the tests and the benchmarks import from
``forgelib.stacks.warm``."""

from __future__ import annotations

from forgelib.stacks.warm.ephemeral import Ephemerals
from forgelib.stacks.warm.ephemeral import _ephemeral_plan as _ephemeral_plan
from forgelib.stacks.warm.ephemeral import _networks as _networks
from forgelib.stacks.warm.ephemeral import _never_started as _never_started
from forgelib.stacks.warm.pool import DirtyStack, StartFrom, WarmPool, environment_key
from forgelib.stacks.warm.pool import PooledStack as PooledStack

__all__ = ["DirtyStack", "Ephemerals", "StartFrom", "WarmPool", "environment_key"]
