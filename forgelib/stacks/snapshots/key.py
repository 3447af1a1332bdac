"""The key of a golden: everything that determines its bytes, hashed.

Parts: forgelib's snapshot ``FORMAT_VERSION``, the seed kind and its ``RECIPE_VERSION``, the service's
image **ID** (a tag can move), the seed's digest and binding options, and the part of the service's
resolved compose config that touches state — environment, command, entrypoint, user, working directory,
and every mount (a bind mount by the content digest of what it mounts, so an edited ``init.sql`` is a new
key). Any change is a new key, so an old golden is never restored: it is simply never found again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import ForgeError
from forgelib.spec.digest import dir_sha256, file_sha256

# Bump whenever what a golden holds or how it is restored changes (its layout, its labels' meaning):
# goldens of another format are then never found, and `forge snapshots prune` removes them.
FORMAT_VERSION = 2  # 2: the golden image has no VOLUME at its data directory (store.unvolumed)

# The resolved service config fields that decide what a fresh service writes to its data directory.
STATE_FIELDS = ("environment", "command", "entrypoint", "user", "working_dir")


@dataclass(frozen=True)
class GoldenKey:
    format: int
    kind: str
    recipe_version: int
    image_id: str
    seed_digest: str
    options: str  # canonical JSON of the binding's options
    config_digest: str  # sha256 of the state-relevant service config (``state_config``)

    @property
    def digest(self) -> str:
        """sha256 hex of every part: the golden's identity."""
        return hashlib.sha256(canonical(asdict(self)).encode()).hexdigest()

    def parts(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def state_config(service_config: ServiceConfig) -> dict[str, Any]:
    """The state-relevant part of a resolved compose service: ``STATE_FIELDS`` as written (its ``raw``
    values, so a key never changes with how the typed view normalises them), and each mount as (type,
    target, read-only, content digest of a bind mount's source)."""
    raw = service_config.raw
    out: dict[str, Any] = {f: raw.get(f) for f in STATE_FIELDS if raw.get(f) is not None}
    mounts = []
    for m in service_config.volumes:
        entry = {"type": m.get("type"), "target": m.get("target"), "read_only": bool(m.get("read_only"))}
        if m.get("type") == "bind":
            entry["content"] = content_digest(Path(str(m.get("source"))))
        mounts.append(entry)
    out["mounts"] = sorted(mounts, key=canonical)
    return out


def content_digest(path: Path) -> str:
    """A bind mount's source by content: a file's sha256, a directory's tree digest (spec.digest)."""
    try:
        if path.is_dir():
            return "dir:" + dir_sha256(path)
        if path.is_file():
            return "file:" + file_sha256(path)
    except (OSError, ForgeError) as e:
        raise ForgeError(f"cannot digest bind-mount source {path} for the golden key: {e}") from e
    return "absent"  # compose creates a missing source as an empty directory


def make_key(
    *,
    kind: str,
    recipe_version: int,
    image_id: str,
    seed_digest: str,
    options: Mapping[str, Any],
    service_config: ServiceConfig,
) -> GoldenKey:
    return GoldenKey(
        format=FORMAT_VERSION,
        kind=kind,
        recipe_version=recipe_version,
        image_id=image_id,
        seed_digest=seed_digest,
        options=canonical(dict(options)),
        config_digest=hashlib.sha256(canonical(state_config(service_config)).encode()).hexdigest(),
    )
