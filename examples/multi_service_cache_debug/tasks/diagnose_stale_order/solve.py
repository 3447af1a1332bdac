"""Oracle for diagnose_stale_order: compare two layers, write a root-cause note, change nothing.

Streamed by forge to ``python3 -`` in the ``runner`` service (stdlib only: the python image has no pip).
``ORACLE_ROUTE`` picks which of the two ways to prove the cache stale it takes (grading.yaml scores each as
a route; either one passes):
  served  orders-api GET /orders/4021 (what clients are served) vs GET /orders/4021/source (postgres)
  cache   cache-admin GET /cache/order:4021 (what redis holds) vs orders-api GET /orders/4021/source
and writes /work/notes/root_cause.md, quoting the status each of its reads returned, and reads.json.

Controls only: ``ORACLE_NOTE=unquoted`` writes the right cause without quoting any read (a weak note that
must fail); ``ORACLE_POST_STATUS`` also POSTs a status update, the one thing the task forbids (the gate
must fail it).
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


ROUTE = os.environ.get("ORACLE_ROUTE", "served")
source, _ = call("GET", f"{ORDERS_API}/orders/{ORDER}/source")
evidence = [
    f'- orders-api GET /orders/{ORDER}/source -> status "{source["status"]}" (postgres, the source of truth)'
]
if ROUTE == "cache":
    cached, _ = call("GET", f"{CACHE_ADMIN}/cache/order:{ORDER}")
    stale = cached["value"]["status"]
    evidence.insert(0, f'- cache-admin GET /cache/order:{ORDER} -> status "{stale}" (ttl {cached["ttl"]})')
else:
    served, headers = call("GET", f"{ORDERS_API}/orders/{ORDER}")
    stale = served["status"]
    evidence.insert(
        0, f'- orders-api GET /orders/{ORDER} -> status "{stale}" (X-Cache: {headers.get("x-cache", "n/a")})'
    )
reads = {"route": ROUTE, "stale": stale, "source": source["status"]}
if stale == source["status"]:
    sys.exit(f"oracle: expected a stale copy of order {ORDER}, read {reads}")

CAUSE = """Root cause: missing cache invalidation. `POST /orders/{id}` updates the order in postgres but never
deletes (or rewrites) the cached `order:<id>` entry, and `GET /orders/{id}` is cache-first, so the copy
cached before the order changed keeps being served.

Fix: invalidate `order:<id>` in the same code path that commits the status update (delete the key after
the commit), and add a test that reads an order, updates its status and reads it again.
"""

NOTES.mkdir(parents=True, exist_ok=True)
(NOTES / "reads.json").write_text(json.dumps(reads, indent=2) + "\n", encoding="utf-8")
if os.environ.get("ORACLE_NOTE") == "unquoted":
    note = f"# Order {ORDER} is served with an outdated status\n\nThe cache and postgres disagree.\n\n{CAUSE}"
else:
    note = (
        f"# Order {ORDER} is served with a stale status\n\nEvidence:\n" + "\n".join(evidence) + f"\n\n{CAUSE}"
    )
(NOTES / "root_cause.md").write_text(note, encoding="utf-8")
print(f"oracle: reads {reads}; wrote {NOTES / 'root_cause.md'}", file=sys.stderr)

if status := os.environ.get("ORACLE_POST_STATUS"):
    call("POST", f"{ORDERS_API}/orders/{ORDER}", {"status": status})
    print(f"oracle (control): posted status {status!r} for order {ORDER}", file=sys.stderr)
