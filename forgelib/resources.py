"""Where forgelib's own files (schemas, image recipes, scripts) are: in a checkout, the repository's top
level; in an installed wheel, ``forgelib/_data`` (pyproject's force-include puts them there)."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """``schemas``, ``images`` or ``scripts``."""
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"forgelib's {name}/ directory is missing from {_PKG}; reinstall forgelib")
