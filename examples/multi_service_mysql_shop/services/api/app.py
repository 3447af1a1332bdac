"""The shop's API: orders from MySQL, each read cached in redis for a minute.

A new connection per request, to the database and to the cache alike: shop-db reset in place or the cache
replaced by a new container (a warm stack) is invisible to it, so the API itself may be ``shared``.
"""

from __future__ import annotations

import json
import os

import pymysql
import redis
from fastapi import FastAPI, HTTPException

app = FastAPI()


def _cache() -> redis.Redis:
    return redis.Redis(host=os.environ.get("CACHE", "cache"), decode_responses=True)


def _db() -> pymysql.Connection:
    return pymysql.connect(host=os.environ.get("SHOP_DB", "shop-db"), user="shop", password="shop",
                           database="shop", autocommit=True)


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.get("/orders/{order_id}")
def order(order_id: int) -> dict[str, object]:
    with _cache() as cache:
        hit = cache.get(f"order:{order_id}")
        if hit:
            return {**json.loads(hit), "cached": True}
        with _db() as conn, conn.cursor() as cur:
            cur.execute("select id, customer, item, status from orders where id = %s", (order_id,))
            row = cur.fetchone()
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        body = dict(zip(("id", "customer", "item", "status"), row))
        cache.set(f"order:{order_id}", json.dumps(body), ex=60)
    return {**body, "cached": False}
