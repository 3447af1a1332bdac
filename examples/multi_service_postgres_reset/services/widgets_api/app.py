"""widgets-api: a read-only HTTP view of the ``widgets`` table (the role PostgREST plays in the design).

Every request opens its own connection and reads the table, so what it returns is always the database's
current state — never something cached from before the seed was applied.
"""

from __future__ import annotations

import os

import psycopg
from fastapi import FastAPI, HTTPException

DATABASE_URL = os.environ["DATABASE_URL"]

app = FastAPI(title="widgets-api")


def _query(sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with psycopg.connect(DATABASE_URL, connect_timeout=5) as conn:
        return conn.execute(sql, params).fetchall()


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
