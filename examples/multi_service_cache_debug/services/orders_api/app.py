"""orders-api: orders from postgres behind a read-through redis cache (``order:<id>``, JSON).

``POST /orders/{id}`` updates postgres and records the update in ``order_status_updates``; it leaves the
cached copy alone, so a cached order keeps being served with its old status until the key goes away.
That defect is what this pack's task diagnoses (see the pack's README), so it stays.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime
from typing import Any

import psycopg
import redis
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from psycopg.rows import dict_row
from pydantic import BaseModel

DATABASE_URL = os.environ["DATABASE_URL"]
REDIS_URL = os.environ["REDIS_URL"]
CACHE_TTL = int(os.environ.get("CACHE_TTL_SECONDS", "300"))

app = FastAPI(title="orders-api")
log = logging.getLogger("uvicorn.error")
# A warm stack swaps app's database in place between trials (a few milliseconds): a connection refused
# meanwhile is tried again this long before the request answers 503.
RETRY_SECONDS = 2.0


def _connect(**kw: Any) -> psycopg.Connection[Any]:
    deadline = time.monotonic() + RETRY_SECONDS
    while True:
        try:
            return psycopg.connect(DATABASE_URL, connect_timeout=5, **kw)
        except psycopg.OperationalError:  # nothing was sent yet: safe to repeat, even for an update
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


@app.exception_handler(psycopg.OperationalError)
def database_unavailable(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
    # One line in the log, not a traceback: the database being away is a state, not a bug of this API.
    log.warning("%s %s: database unavailable: %s", request.method, request.url.path, str(exc).strip())
    return JSONResponse(status_code=503, content={"detail": "database unavailable"})


cache = redis.Redis.from_url(REDIS_URL, decode_responses=True, socket_timeout=5)

COLUMNS = "id, customer, status, total_cents, updated_at"


class StatusUpdate(BaseModel):
    status: str


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}


def _load(order_id: int) -> dict[str, Any]:
    with _connect(row_factory=dict_row) as conn:
        row = conn.execute(f"SELECT {COLUMNS} FROM orders WHERE id = %s", (order_id,)).fetchone()
    if row is None:
        raise HTTPException(status_code=404, detail=f"no order {order_id}")
    return _jsonable(row)


@app.get("/healthz")
def healthz() -> dict[str, str]:
    # Healthy only when both layers answer, so `compose up --wait` means every read below can work.
    with _connect() as conn:
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
    with _connect(row_factory=dict_row) as conn:
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
