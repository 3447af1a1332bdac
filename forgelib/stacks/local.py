"""A backend for a front end that lives inside another program's process (the harbor environment):
fresh stacks, or a warm pool of them, on this machine's engine. The one place outside ``make_backend``
that builds a ``DockerBackend``, so front ends never construct one (or a ``WarmPool``) themselves."""

from __future__ import annotations

from collections.abc import Callable

from forgelib.provision import StackContext
from forgelib.signals import LiveStacks
from forgelib.stacks.backends import DockerBackend
from forgelib.warm import WarmPool


def local_backend(
    ctx: StackContext,
    *,
    warm: bool,
    workers: int,
    live: LiveStacks | None,
    stopping: Callable[[], bool],
) -> DockerBackend:
    """Fresh stacks (from goldens with ``ctx.goldens``), or with ``warm`` a pool of at most ``workers``
    stacks reset in place between trials (a stack not proven clean is replaced)."""
    if not warm:
        return DockerBackend(ctx)
    return DockerBackend(ctx, pool=WarmPool(ctx, workers=workers, stacks=live, stopping=stopping))


__all__ = ["local_backend"]
