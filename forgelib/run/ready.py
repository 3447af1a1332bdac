"""Time to ready: from the moment a trial asks for a stack until its solver may start, and what it waited on.

Read off the provision phase's timings (the backend records each step as it ends), so it costs nothing and
is the same for every backend: ``queue`` (``stack_wait`` without its memory and reset parts: a warm trial
waiting for a busy stack, a fresh one for a start place), ``memory`` (the run's memory budget held it back,
``memory_wait``), ``reset`` (a warm trial waiting for a stack's reset still under way, ``reset_wait``; or
the in-place reset steps of a pool that resets on the trial's path) and ``provisioning`` (the rest:
bringing a stack up and seeding it; for a stack handed out ready, its hand-out). A warm pool resets a stack
when it is given back, off any trial's path (``forgelib.stacks.warm.pool``): a reused stack's ready time is
its hand-out. ``reused`` (true) marks a trial on a warm stack that an earlier trial used.
"""

from __future__ import annotations

from collections.abc import Mapping

# A reused warm stack's steps (forgelib.stacks.warm.pool.WarmPool._recycle): `reset:<svc>`,
# `fingerprint:<svc>`, `recreate`, `ready`.
_RESET_STEPS = ("reset:", "fingerprint:")
_RESET_NAMES = frozenset({"recreate", "ready"})
WAITED_ON = ("queue", "memory", "provisioning", "reset")


def ready_breakdown(
    timings: Mapping[str, float], seconds: float, *, reused: bool = False
) -> dict[str, float]:
    """``{"seconds": total, "queue", "memory", "provisioning", "reset"}`` (seconds, rounded to ms) for a
    provision phase of ``seconds`` whose steps are ``timings``; the parts add up to the total. With
    ``"reused"``: whether it is a warm stack an earlier trial used."""
    memory = max(0.0, float(timings.get("memory_wait", 0.0)))
    reset_wait = max(0.0, float(timings.get("reset_wait", 0.0)))
    queue = max(0.0, float(timings.get("stack_wait", 0.0)) - memory - reset_wait)
    reset = reset_wait + sum(
        float(v) for k, v in timings.items() if k.startswith(_RESET_STEPS) or k in _RESET_NAMES
    )
    provisioning = max(0.0, seconds - queue - memory - reset)
    parts = {"queue": queue, "memory": memory, "provisioning": provisioning, "reset": reset}
    out: dict[str, float] = {"seconds": round(seconds, 3), **{k: round(v, 3) for k, v in parts.items()}}
    # Always on record (false too): a record without it is an older log's, read by its own rule (events)
    out["reused"] = reused
    return out
