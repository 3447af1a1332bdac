"""orders-api: orders from postgres behind a read-through redis cache (``order:<id>``, JSON).

``POST /orders/{id}`` updates postgres and records the update in ``order_status_updates``; it leaves the
cached copy alone, so a cached order keeps being served with its old status until the key goes away.
That defect is what this pack's task diagnoses (see the pack's README), so it stays.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any

import psycopg
import redis
from fastapi import FastAPI, HTTPException, Response
from psycopg.rows import dict_row
from pydantic import BaseModel

DATABASE_URL = os.environ["DATABASE_URL"]
REDIS_URL = os.environ["REDIS_URL"]
CACHE_TTL = int(os.environ.get("CACHE_TTL_SECONDS", "300"))

app = FastAPI(title="orders-api")
cache = redis.Redis.from_url(REDIS_URL, decode_responses=True, socket_timeout=5)

COLUMNS = "id, customer, status, total_cents, updated_at"


class StatusUpdate(BaseModel):
    status: str


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}


def _load(order_id: int) -> dict[str, Any]:
    with psycopg.connect(DATABASE_URL, connect_timeout=5, row_factory=dict_row) as conn:
        row = conn.execute(f"SELECT {COLUMNS} FROM orders WHERE id = %s", (order_id,)).fetchone()
    if row is None:
        raise HTTPException(status_code=404, detail=f"no order {order_id}")
    return _jsonable(row)


@app.get("/healthz")
def healthz() -> dict[str, str]:
    # Healthy only when both layers answer, so `compose up --wait` means every read below can work.
    with psycopg.connect(DATABASE_URL, connect_timeout=5) as conn:
        conn.execute("SELECT 1")
    cache.ping()
    return {"status": "ok"}


@app.get("/orders/{order_id}")
def get_order(order_id: int, response: Response) -> dict[str, Any]:
    """Cache first; on a miss, read postgres and fill the cache."""
    key = f"order:{order_id}"
    cached = cache.get(key)
    if cached is not None:
        response.headers["X-Cache"] = "hit"
        order: dict[str, Any] = json.loads(cached)
        return order
    order = _load(order_id)
    cache.set(key, json.dumps(order), ex=CACHE_TTL)
    response.headers["X-Cache"] = "miss"
    return order


@app.get("/orders/{order_id}/source")
def get_order_source(order_id: int) -> dict[str, Any]:
    """The order straight from postgres, bypassing the cache."""
    return _load(order_id)


@app.post("/orders/{order_id}")
def update_order_status(order_id: int, update: StatusUpdate) -> dict[str, Any]:
    # One transaction (the connection block commits on success, rolls back on an exception): the update
    # and its audit row land together or not at all.
    with psycopg.connect(DATABASE_URL, connect_timeout=5, row_factory=dict_row) as conn:
        row = conn.execute("SELECT status FROM orders WHERE id = %s FOR UPDATE", (order_id,)).fetchone()
        if row is None:
            raise HTTPException(status_code=404, detail=f"no order {order_id}")
        conn.execute(
            "UPDATE orders SET status = %s, updated_at = now() WHERE id = %s", (update.status, order_id)
        )
        conn.execute(
            "INSERT INTO order_status_updates (order_id, old_status, new_status) VALUES (%s, %s, %s)",
            (order_id, row["status"], update.status),
        )
    return _load(order_id)
