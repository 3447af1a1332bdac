"""Spec rules of a redis service that resets from a ``redis_dump``: what its compose definition must not
do. Called by ``forgelib.spec.rules`` with the service's definition as written (``ServiceDef``)."""

from __future__ import annotations

import re
import shlex
from typing import Any

from forgelib.errors import SpecIssue

_APPENDONLY = re.compile(r"(?:^|[\s\"'])-{0,2}appendonly(?:\s+|=)[\"']?yes\b", re.IGNORECASE)


def problems(service: str, seed: str, sdef: Any) -> list[SpecIssue]:
    issues = []
    for key in ("command", "entrypoint"):
        written = sdef.last(key)
        if written is not None and _turns_on_appendonly(written.value):
            issues.append(
                written.issue(
                    f"service {service!r} resets from redis dump {seed!r} but its {key} turns on "
                    "appendonly; with AOF on Redis ignores dump.rdb at startup, so remove "
                    "'--appendonly yes' (or use isolation: ephemeral)",
                )
            )
    return issues


def _turns_on_appendonly(command: Any) -> bool:
    if isinstance(command, list):
        text = " ".join(str(part) for part in command)
    elif isinstance(command, str):
        try:
            text = " ".join(shlex.split(command))
        except ValueError:
            text = command
    else:
        return False
    return bool(_APPENDONLY.search(text))
