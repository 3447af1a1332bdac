"""Spec rules of a mysql service that resets from a ``sql_dump``: checked by ``forge validate`` and at
every load, before any stack starts. A MySQL 8 dump bound to a MariaDB service (told from its image) is
refused with the fix (``forgelib.kinds.mysql.dumps``); only the exact reset exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import SpecIssue
from forgelib.kinds.mysql.dumps import flavour_of, refusal, scan


def problems(
    service: str, seed: str, sdef: Any, *, svc: ServiceConfig | None = None, path: Path | None = None
) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    image = svc.image if svc is not None else ""
    written = sdef.last("image")
    if path is not None and path.is_file() and image and written is not None:
        why = refusal(scan(path), flavour_of(image.rsplit("/", 1)[-1]), f"image {image}")
        if why:
            issues.append(written.issue(f"service {service!r} resets from seed {seed!r}: {why}"))
    return issues
