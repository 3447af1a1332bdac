"""The shop's API against its real MySQL database (the multi_service_mysql_shop pack: MariaDB offline).

One stack for the module: shop-db is put back to the orders sql_dump between tests (rows, users and
grants alike), so each test may write to it freely through a PyMySQL client.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.forge(project="../multi_service_mysql_shop", task="read_order", scope="module")

SEEDED = ((1, "shipped"), (2, "pending"), (3, "cancelled"))


def orders(db):
    with db.cursor() as cur:
        cur.execute("select id, status from orders order by id")
        return cur.fetchall()


def reporter_grants(db):
    with db.cursor() as cur:
        cur.execute("select count(*) from mysql.user where user = 'reporter'")
        if cur.fetchone() != (1,):
            return None
        cur.execute("show grants for 'reporter'@'%'")
        return [row[0] for row in cur.fetchall()]


def test_serves_the_seeded_orders(forge_stack, http):
    with forge_stack.mysql("shop-db", database="shop") as db:
        assert orders(db) == SEEDED
    r = http(forge_stack.url("api", 8000, "/orders/1"))
    assert (r.status, r.body["item"], r.body["status"]) == (200, "kettle", "shipped")


def test_a_new_order_is_served_and_the_seed_is_ours_to_break(forge_stack, http):
    with forge_stack.mysql("shop-db", database="shop") as db, db.cursor() as cur:
        cur.execute("insert into orders values (4, 'edsger', 'whisk', 'pending')")
        cur.execute("update orders set status = 'lost' where id = 2")
        cur.execute("drop user 'reporter'@'%'")
        assert reporter_grants(db) is None
    r = http(forge_stack.url("api", 8000, "/orders/4"))
    assert (r.status, r.body["customer"], r.body["item"]) == (200, "edsger", "whisk")
    assert http(forge_stack.url("api", 8000, "/orders/2")).body["status"] == "lost"


def test_each_test_starts_from_the_seed(forge_stack, http):
    with forge_stack.mysql("shop-db", database="shop") as db:
        assert orders(db) == SEEDED  # order 4 and the 'lost' status are gone
        grants = reporter_grants(db)
    assert grants is not None and any("GRANT SELECT ON `shop`.`orders`" in g for g in grants), grants
    r = http(forge_stack.url("api", 8000, "/orders/4"))
    assert (r.status, r.body) == (404, {"detail": "no order 4"})
