"""orders-api's read-through cache (the multi_service_cache_debug pack): redis is seeded with a stale copy
of order 4021 ('processing') while postgres says 'shipped'.

The module shares one stack; redis (the reset service) is reset to the seed between tests. postgres is an
ephemeral service here (recreated between tests, not reset), so the test that writes through the API gets
a fresh stack of its own.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.forge(
    project="../multi_service_cache_debug", task="diagnose_stale_order", scope="module"
)


def test_the_seeded_copy_is_served_stale(forge_stack, http):
    r = http(forge_stack.url("orders-api", 8000, "/orders/4021"))
    assert (r.body["status"], r.headers["x-cache"]) == ("processing", "hit")
    truth = http(forge_stack.url("orders-api", 8000, "/orders/4021/source"))
    assert truth.body["status"] == "shipped"


def test_evicting_the_key_serves_the_truth(forge_stack, http):
    cache = forge_stack.redis("redis")
    assert cache.delete("order:4021") == 1
    r = http(forge_stack.url("orders-api", 8000, "/orders/4021"))
    assert (r.body["status"], r.headers["x-cache"]) == ("shipped", "miss")
    assert json.loads(cache.get("order:4021"))["status"] == "shipped"  # read through, cached again


def test_each_test_starts_from_the_seeded_cache(forge_stack):
    cache = forge_stack.redis("redis", decode_responses=True)
    assert json.loads(cache.get("order:4021"))["status"] == "processing"  # the eviction above is undone
    assert cache.get("order:4022") is None


@pytest.mark.forge(project="../multi_service_cache_debug", task="diagnose_stale_order")  # a fresh stack
def test_a_status_update_leaves_the_cached_copy_alone(forge_stack, http):
    url = forge_stack.url("orders-api", 8000, "/orders/4022")
    assert http(url).body["status"] == "processing"  # a miss: now cached
    assert http(url, "POST", {"status": "shipped"}).body["status"] == "shipped"
    assert http(url).body["status"] == "processing"  # the defect the pack's task diagnoses
    # app-db publishes no port in this pack (it is not a reset service): ask psql inside it instead.
    audit = [
        "psql",
        "-At",
        "-U",
        "app",
        "-d",
        "app",
        "-c",
        "select old_status, new_status from order_status_updates",
    ]
    assert forge_stack.exec("app-db", audit).stdout.split() == ["processing|shipped"]
