"""Reading forge's generated compose override back in tests: compose's ``!override``/``!reset`` tags become
``("!override", [...])`` and ``"!reset"``."""

from __future__ import annotations

from typing import Any

import yaml


class _TagLoader(yaml.SafeLoader):
    pass


_TagLoader.add_constructor("!override", lambda ld, n: ("!override", ld.construct_sequence(n, deep=True)))
_TagLoader.add_constructor("!reset", lambda ld, n: "!reset")


def load_override(text: str) -> dict[str, Any]:
    out: dict[str, Any] = yaml.load(text, Loader=_TagLoader)
    return out
