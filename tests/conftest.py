"""Shared fixtures. Integration and e2e tests run on a real engine: ``docker_ready`` makes sure one answers
and the stand-in images exist (both idempotent), so `nox -s integration` works on a bare machine."""

from __future__ import annotations

import pytest

from forgelib.runner import SubprocessRunner


@pytest.fixture(scope="session")
def runner() -> SubprocessRunner:
    return SubprocessRunner(default_timeout=120)


@pytest.fixture(scope="session")
def docker_ready(runner: SubprocessRunner) -> None:
    from forgelib.engine import ensure_engine
    from forgelib.images import ensure_images

    ensure_engine(runner)
    ensure_images(runner)
