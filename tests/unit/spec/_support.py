"""Helpers shared by the spec tests."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "projects"


def edit(path: Path, old: str, new: str) -> None:
    """Replace the single occurrence of ``old`` in ``path`` (failing loudly if it is not exactly once)."""
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in {path}"
    path.write_text(text.replace(old, new))
