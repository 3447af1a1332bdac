"""widgets-api against its real database (the multi_service_postgres_reset pack).

One stack for the module: every test starts from the postgres_baseline seed, because the plugin resets
app-db in place between tests — so each test may write to the database freely.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.forge(project="../multi_service_postgres_reset", task="read_widget", scope="module")

BASELINE = [{"id": 1, "name": "baseline"}]


def test_serves_the_seeded_widget(forge_stack, http):
    r = http(forge_stack.url("widgets-api", 8000, "/widgets/1"))
    assert (r.status, r.body) == (200, {"id": 1, "name": "baseline"})


def test_a_rename_is_served_at_once(forge_stack, http):
    with forge_stack.postgres("app-db") as db:
        db.execute("update widgets set name = 'renamed' where id = 1")
    assert http(forge_stack.url("widgets-api", 8000, "/widgets/1")).body["name"] == "renamed"


def test_new_widgets_are_listed_in_id_order(forge_stack, http):
    assert http(forge_stack.url("widgets-api", 8000, "/widgets")).body == BASELINE  # the rename is gone
    with forge_stack.postgres("app-db") as db:
        db.execute("insert into widgets (id, name) values (3, 'third'), (2, 'second')")
    names = [w["name"] for w in http(forge_stack.url("widgets-api", 8000, "/widgets")).body]
    assert names == ["baseline", "second", "third"]


def test_an_unknown_widget_is_a_404(forge_stack, http):
    with forge_stack.postgres("app-db") as db:
        assert db.execute("select count(*) from widgets").fetchone() == (1,)  # the inserts are gone too
    r = http(forge_stack.url("widgets-api", 8000, "/widgets/2"))
    assert r.status == 404
    assert r.body == {"detail": "no widget 2"}
