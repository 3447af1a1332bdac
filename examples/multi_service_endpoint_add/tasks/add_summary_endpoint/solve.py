"""Oracle for add_summary_endpoint: add GET /orders/{id}/summary to /work/app.py, then run the suite.

Streamed by forge to ``python3 -`` in the ``runner`` service (stdlib only). /work is the volume testrunner
sees at /workspace, so POST /run-tests tests exactly the file edited here. Exits 1 unless the suite passes.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

APP = Path(os.environ.get("APP_FILE", "/work/app.py"))
TESTRUNNER = os.environ.get("TESTRUNNER", "http://testrunner:8000")

ENDPOINT = """

@app.get("/orders/{order_id}/summary")
def get_order_summary(order_id: int) -> dict:
    order = _order(order_id)
    return {
        "id": order["id"],
        "status": order["status"],
        "item_count": sum(item["quantity"] for item in order["items"]),
        "total_cents": sum(item["quantity"] * item["unit_price_cents"] for item in order["items"]),
    }
"""

source = APP.read_text(encoding="utf-8")
if '"/orders/{order_id}/summary"' not in source:  # idempotent: a re-run does not add it twice
    APP.write_text(source.rstrip("\n") + "\n" + ENDPOINT, encoding="utf-8")

req = urllib.request.Request(f"{TESTRUNNER}/run-tests", method="POST")
with urllib.request.urlopen(req, timeout=180) as resp:
    result = json.load(resp)
print(result["output"], file=sys.stderr)
print(f"oracle: suite {result['result']}", file=sys.stderr)
sys.exit(0 if result["result"] == "PASS" else 1)
