"""The orders service's test suite (unittest; run from this directory: python3 -m unittest -v)."""

from __future__ import annotations

import unittest

from app import app
from fastapi.testclient import TestClient


class OrdersTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = TestClient(app)

    def test_list_orders(self) -> None:
        resp = self.client.get("/orders")
        self.assertEqual(resp.status_code, 200)
        self.assertEqual({o["id"] for o in resp.json()}, {4017, 4021})

    def test_get_order(self) -> None:
        resp = self.client.get("/orders/4021")
        self.assertEqual(resp.status_code, 200)
        self.assertEqual(resp.json()["customer"], "Ada Lovelace")

    def test_unknown_order_is_404(self) -> None:
        self.assertEqual(self.client.get("/orders/9999").status_code, 404)

    def test_order_summary(self) -> None:
        # GET /orders/{id}/summary: status, number of items (sum of quantities) and total in cents.
        resp = self.client.get("/orders/4021/summary")
        self.assertEqual(resp.status_code, 200)
        self.assertEqual(
            resp.json(),
            {"id": 4021, "status": "shipped", "item_count": 6, "total_cents": 12999},
        )

    def test_unknown_order_summary_is_404(self) -> None:
        self.assertEqual(self.client.get("/orders/9999/summary").status_code, 404)


if __name__ == "__main__":
    unittest.main()
