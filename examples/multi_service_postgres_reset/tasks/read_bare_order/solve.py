"""Oracle for read_bare_order: read the bare seed where forge mounted it, inside the container.

forge bind-mounts the `widget_order` seed read-only in `runner` and names it in FORGE_SEED_WIDGET_ORDER.
The submission joins the file's content with widget 1's name from widgets-api (seeded by sql_dump), so it
is right only when both seeds reached the trial. It also records that the mount refuses writes.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

seed = Path(os.environ["FORGE_SEED_WIDGET_ORDER"])
order = json.loads(seed.read_text(encoding="utf-8"))
with urllib.request.urlopen(f"http://widgets-api:8000/widgets/{order['widget_id']}", timeout=10) as resp:
    name = json.load(resp)["name"]
Path("/work/order.txt").write_text(f"{order['quantity']} x {name} ({order['ref']})", encoding="utf-8")

try:
    seed.write_text("tampered", encoding="utf-8")
    verdict = "writable"
except OSError:  # EROFS: the seed stays what its digest says
    verdict = "read-only"
Path("/work/seed_mount.txt").write_text(verdict, encoding="utf-8")
