"""Shared fixtures. Integration and e2e tests run on a real engine: ``docker_ready`` makes sure one answers
and the stand-in images exist (both idempotent), so `nox -s integration` works on a bare machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from forgelib.runner import SubprocessRunner


@pytest.fixture(scope="session")
def runner() -> SubprocessRunner:
    return SubprocessRunner(default_timeout=120)


@pytest.fixture(scope="session")
def docker_ready(runner: SubprocessRunner) -> None:
    from forgelib.docker.engine import ensure_engine
    from forgelib.docker.images import ensure_images

    ensure_engine(runner)
    ensure_images(runner)


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    """A directory kept after the test for what a person should look at (screenshots): under
    ``$FORGE_TEST_ARTIFACTS`` (default ``<checkout>/build/test-artifacts``), one per test."""
    import os
    import re

    root = Path(
        os.environ.get("FORGE_TEST_ARTIFACTS")
        or Path(__file__).resolve().parents[1] / "build" / "test-artifacts"
    )
    d = root / re.sub(r"[^\w.-]+", "_", request.node.nodeid)
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """forge's state directory (golden locks, last-use marks, capture build dirs) per test session, never
    the user's: a test that reaps must not see another process's build directories."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.getbasetemp() / "state"))
