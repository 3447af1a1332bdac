"""cache-admin: a read-only window on the redis cache (GET only; it never writes a key)."""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from fastapi import FastAPI, HTTPException

REDIS_URL = os.environ["REDIS_URL"]

app = FastAPI(title="cache-admin")
cache = redis.Redis.from_url(REDIS_URL, decode_responses=True, socket_timeout=5)


@app.get("/healthz")
def healthz() -> dict[str, str]:
    cache.ping()
    return {"status": "ok"}


@app.get("/cache/{key}")
def get_key(key: str) -> dict[str, Any]:
    raw = cache.get(key)
    if raw is None:
        raise HTTPException(status_code=404, detail=f"no cached key {key!r}")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw  # not JSON: show it as stored
    # ttl: seconds left, or -1 for a key with no expiry (as redis reports it).
    return {"key": key, "ttl": cache.ttl(key), "raw": raw, "value": value}
