"""Fixtures for the spec tests: a fresh copy of the ``basic`` fixture project per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ._support import FIXTURES


@pytest.fixture
def basic(tmp_path: Path) -> Path:
    """A writable copy of tests/fixtures/projects/basic (stamped, valid)."""
    dest = tmp_path / "basic"
    shutil.copytree(FIXTURES / "basic", dest, symlinks=True)
    return dest
