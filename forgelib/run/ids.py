"""Run ids: the one generator behind ``forge run``'s and ``forge provision``'s ``io.forgelib.run`` values."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime


def new_run_id(now: float | None = None) -> str:
    """Sortable (UTC timestamp first) and unique (6 random hex): ``20260129T112351Z-4f0c2a``."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"
