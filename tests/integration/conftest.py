"""Fixtures for the integration tests (the real engine)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from forgelib.docker import labels as lab
from forgelib.runner import SubprocessRunner


@pytest.fixture
def run_id(runner: SubprocessRunner) -> Iterator[str]:
    """A fresh run id; afterwards, nothing labelled with it may remain on the engine."""
    rid = f"it-{secrets.token_hex(4)}"
    yield rid
    left = lab.resources_with_labels(runner, {lab.RUN: rid})
    assert lab.is_empty(left), f"leaked: {left}"
