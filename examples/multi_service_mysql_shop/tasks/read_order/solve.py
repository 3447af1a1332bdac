"""Oracle for read_order: read order 1 through the API and submit its status (stdlib only)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

with urllib.request.urlopen("http://api:8000/orders/1", timeout=10) as resp:
    order = json.load(resp)
Path("/work/submission.txt").write_text(order["status"], encoding="utf-8")
