"""Oracle for diagnose_stale_order: compare the layers, write a root-cause note, change nothing.

Streamed by forge to ``python3 -`` in the ``runner`` service (stdlib only: the python image has no pip).
Reads, in order:
  1. cache-admin  GET /cache/order:4021       what redis holds
  2. orders-api   GET /orders/4021/source     what postgres holds
  3. orders-api   GET /orders/4021            what clients are served
and writes /work/notes/root_cause.md (quoting the stale status it read) and /work/notes/reads.json.

``ORACLE_POST_STATUS`` (set only by the control task) makes it also POST a status update, the one thing the
task forbids: the control run shows the gate catches it.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

ORDER = 4021
ORDERS_API = os.environ.get("ORDERS_API", "http://orders-api:8000")
CACHE_ADMIN = os.environ.get("CACHE_ADMIN", "http://cache-admin:8000")
NOTES = Path(os.environ.get("NOTES_DIR", "/work/notes"))


def call(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp), dict(resp.headers)


cached, _ = call("GET", f"{CACHE_ADMIN}/cache/order:{ORDER}")
source, _ = call("GET", f"{ORDERS_API}/orders/{ORDER}/source")
served, served_headers = call("GET", f"{ORDERS_API}/orders/{ORDER}")

reads = {
    "cache_admin": cached["value"]["status"],
    "source": source["status"],
    "orders_api": served["status"],
    "orders_api_x_cache": served_headers.get("x-cache", ""),
}
stale = reads["orders_api"] == reads["cache_admin"] != reads["source"]
if not stale:
    sys.exit(f"oracle: expected a stale cache entry for order {ORDER}, read {reads}")

NOTES.mkdir(parents=True, exist_ok=True)
(NOTES / "reads.json").write_text(json.dumps(reads, indent=2) + "\n", encoding="utf-8")
(NOTES / "root_cause.md").write_text(
    f"""# Order {ORDER} is served with a stale status

Stale status served: "{reads["orders_api"]}" (X-Cache: {reads["orders_api_x_cache"] or "n/a"}),
while postgres has "{reads["source"]}".

Evidence:
- cache-admin GET /cache/order:{ORDER} -> status "{reads["cache_admin"]}" (ttl {cached["ttl"]})
- orders-api GET /orders/{ORDER}/source -> status "{reads["source"]}"
- orders-api GET /orders/{ORDER} -> status "{reads["orders_api"]}"

Root cause: missing cache invalidation. `POST /orders/{{id}}` updates the order in postgres but never
deletes (or rewrites) the cached `order:<id>` entry, and `GET /orders/{{id}}` is cache-first, so the copy
cached before the order shipped keeps being served.

Fix: invalidate `order:<id>` in the same code path that commits the status update (delete the key after
the commit), and add a test that reads an order, updates its status and reads it again.
""",
    encoding="utf-8",
)
print(f"oracle: reads {reads}; wrote {NOTES / 'root_cause.md'}", file=sys.stderr)

if status := os.environ.get("ORACLE_POST_STATUS"):
    call("POST", f"{ORDERS_API}/orders/{ORDER}", {"status": status})
    print(f"oracle (control): posted status {status!r} for order {ORDER}", file=sys.stderr)
