"""widgets-api: a read-only HTTP view of the ``widgets`` table (the role PostgREST plays in the design).

Every request opens its own connection and reads the table, so what it returns is always the database's
current state — never something cached from before the seed was applied.
"""

from __future__ import annotations

import logging
import os
import time

import psycopg
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

DATABASE_URL = os.environ["DATABASE_URL"]
# A warm stack swaps the database in place between trials (a few milliseconds, ending open sessions): a
# read that meets the swap is retried on a new connection this long before it answers 503.
RETRY_SECONDS = 2.0

app = FastAPI(title="widgets-api")
log = logging.getLogger("uvicorn.error")


def _query(sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    deadline = time.monotonic() + RETRY_SECONDS
    while True:
        try:
            with psycopg.connect(DATABASE_URL, connect_timeout=5) as conn:
                return conn.execute(sql, params).fetchall()
        except psycopg.OperationalError:  # refused, closed or terminated: reads are safe to repeat
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


@app.exception_handler(psycopg.OperationalError)
def database_unavailable(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
    # One line in the log, not a traceback: the database being away is a state, not a bug of this API.
    log.warning("%s %s: database unavailable: %s", request.method, request.url.path, str(exc).strip())
    return JSONResponse(status_code=503, content={"detail": "database unavailable"})


@app.get("/healthz")
def healthz() -> dict[str, str]:
    # Healthy means the database answers too: `compose up --wait` then means the API can serve.
    _query("SELECT 1")
    return {"status": "ok"}


@app.get("/widgets")
def list_widgets() -> list[dict[str, object]]:
    return [{"id": i, "name": n} for i, n in _query("SELECT id, name FROM widgets ORDER BY id")]


@app.get("/widgets/{widget_id}")
def get_widget(widget_id: int) -> dict[str, object]:
    rows = _query("SELECT id, name FROM widgets WHERE id = %s", (widget_id,))
    if not rows:
        raise HTTPException(status_code=404, detail=f"no widget {widget_id}")
    wid, name = rows[0]
    return {"id": wid, "name": name}
