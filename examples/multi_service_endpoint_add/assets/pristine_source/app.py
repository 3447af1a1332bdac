"""orders: a small FastAPI service over an in-memory order book."""

from __future__ import annotations

from fastapi import FastAPI, HTTPException

app = FastAPI(title="orders")

ORDERS: dict[int, dict] = {
    4017: {
        "id": 4017,
        "customer": "Grace Hopper",
        "status": "delivered",
        "items": [
            {"sku": "KB-01", "quantity": 1, "unit_price_cents": 4500},
        ],
    },
    4021: {
        "id": 4021,
        "customer": "Ada Lovelace",
        "status": "shipped",
        "items": [
            {"sku": "NB-12", "quantity": 2, "unit_price_cents": 1250},
            {"sku": "PN-03", "quantity": 3, "unit_price_cents": 499},
            {"sku": "LM-77", "quantity": 1, "unit_price_cents": 9002},
        ],
    },
}


def _order(order_id: int) -> dict:
    if order_id not in ORDERS:
        raise HTTPException(status_code=404, detail=f"no order {order_id}")
    return ORDERS[order_id]


@app.get("/orders")
def list_orders() -> list[dict]:
    return [{"id": o["id"], "status": o["status"]} for o in ORDERS.values()]


@app.get("/orders/{order_id}")
def get_order(order_id: int) -> dict:
    return _order(order_id)
