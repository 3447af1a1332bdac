"""Observe everything in shop-db as root (printed as JSON on stdout), then vandalise it: a new database,
user and grant, a global variable, a changed and a deleted row, a new column."""

from __future__ import annotations

import json
from pathlib import Path

import pymysql

conn = pymysql.connect(host="shop-db", user="root", password="root", autocommit=True)
cur = conn.cursor()


def rows(query: str) -> list[list[str]]:
    cur.execute(query)
    return [[str(v) for v in r] for r in cur.fetchall()]


seen = {
    "databases": rows("show databases"),
    "users": rows("select user, host from mysql.user order by 1, 2"),
    "grants": {f"{u}@{h}": rows(f"show grants for '{u}'@'{h}'") for u, h in rows(
        "select user, host from mysql.user where user not in ('mariadb.sys') order by 1, 2")},
    "variables": rows(
        "select variable_name, variable_value from information_schema.global_variables where variable_name in"
        " ('MAX_CONNECTIONS', 'SQL_MODE', 'EVENT_SCHEDULER', 'READ_ONLY', 'WAIT_TIMEOUT') order by 1"
    ),
    "orders": rows("select * from shop.orders order by id"),
    "columns": rows("select column_name from information_schema.columns where table_schema = 'shop'"
                    " order by ordinal_position"),
}
Path("/tmp/orders.txt").write_text(",".join(f"{r[0]}:{r[3]}" for r in seen["orders"]))
print(json.dumps(seen, sort_keys=True))

for statement in (
    "create database loot",
    "create user 'mallory'@'%' identified by 'x'",
    "grant all on *.* to 'mallory'@'%'",
    "grant insert on shop.orders to 'reporter'@'%'",
    "set global max_connections = 7",
    "set global sql_mode = 'ANSI'",
    "update shop.orders set status = 'stolen' where id = 1",
    "delete from shop.orders where id = 2",
    "alter table shop.orders add column note text",
):
    cur.execute(statement)
