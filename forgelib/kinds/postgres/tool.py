"""``sql_query`` on a postgres service: one autocommit psycopg connection per (service, database) on its
published loopback port, or ``psql`` in the container when the port is not published."""

from __future__ import annotations

import csv
import io
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from forgelib.clients import deferred
from forgelib.docker.resolved import ServiceConfig
from forgelib.kinds import toolschema as ts
from forgelib.kinds.base import ToolContext, ToolFailure, sql_result, tool_failed
from forgelib.kinds.postgres import ROW_LIMIT
from forgelib.kinds.postgres.client import direct_port, postgres_credentials

if TYPE_CHECKING:
    import psycopg
else:
    psycopg = deferred("psycopg")


class Backend:
    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._pg: dict[tuple[str, str], _Pg] = {}

    def call(self, tool: str, service: str, svc: ServiceConfig, args: Mapping[str, Any]) -> str:
        user, database = postgres_credentials({"database": args.get("database")}, svc.environment)
        timeout = float(args.get("timeout", ts.DEFAULT_TIMEOUT))
        where = self._ctx.published(service, direct_port(svc))
        if where is None:  # not published on loopback (no reset recipe binds it): psql in the container
            return self._psql(service, user, database, args["query"], timeout)
        with self._lock:
            pg = self._pg.get((service, database))
            if pg is None:
                password = svc.environment.get("POSTGRES_PASSWORD") or None
                pg = self._pg[(service, database)] = _Pg(where, user, password, database)
        return pg.query(args["query"], timeout, service)

    def _psql(self, service: str, user: str, database: str, query: str, timeout: float) -> str:
        argv = ["psql", "-X", "-q", "--csv", "-v", "ON_ERROR_STOP=1", "-U", user, "-d", database, "-c", query]
        r = self._ctx.run(service, argv, timeout)
        if r.rc != 0:
            raise ToolFailure(tool_failed(r, f"SQL on service {service!r} failed"))
        lines = [row for row in csv.reader(io.StringIO(r.stdout)) if row]
        columns, rows = (lines[0], lines[1:]) if lines else ([], [])
        return sql_result(columns, rows, limit=ROW_LIMIT, rowcount=len(rows), status=None)

    def close(self) -> None:
        with self._lock:
            pgs = list(self._pg.values())
            self._pg.clear()
        for pg in pgs:
            pg.close()


class _Pg:
    """One autocommit connection to a postgres service's published port, used by one call at a time;
    reconnected once when it broke (a server restart, a reset that dropped it)."""

    def __init__(self, where: tuple[str, int], user: str, password: str | None, database: str) -> None:
        self._kw: dict[str, Any] = {"host": where[0], "port": where[1], "user": user, "dbname": database}
        if password:
            self._kw["password"] = password
        self._lock = threading.Lock()
        self._conn: Any = None
        self._timeout_ms: int | None = None

    def query(self, query: str, timeout: float, service: str) -> str:
        with self._lock:
            for attempt in (1, 2):
                try:
                    return self._query(query, timeout)
                except psycopg.OperationalError as e:
                    broken = self._conn is None or self._conn.closed
                    self.close_locked()
                    if not broken or attempt == 2:
                        raise ToolFailure(f"SQL on service {service!r} failed: {_pg_message(e)}") from None
                except psycopg.Error as e:
                    raise ToolFailure(f"SQL on service {service!r} failed: {_pg_message(e)}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _query(self, query: str, timeout: float) -> str:
        if self._conn is None:
            self._conn = psycopg.connect(**self._kw, autocommit=True, connect_timeout=10)
            self._timeout_ms = None
        ms = max(1, int(timeout * 1000))
        if ms != self._timeout_ms:  # SET only when it changes: one round trip fewer per call
            self._conn.execute(f"SET statement_timeout = {ms}")
            self._timeout_ms = ms
        cur = self._conn.execute(query)
        columns = [c.name for c in cur.description] if cur.description else []
        rows = cur.fetchmany(ROW_LIMIT + 1) if cur.description else []
        return sql_result(columns, rows, limit=ROW_LIMIT, rowcount=cur.rowcount, status=cur.statusmessage)

    def close_locked(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()


def _pg_message(e: BaseException) -> str:
    state = getattr(e, "sqlstate", None)
    text = str(e).strip() or type(e).__name__
    return f"{text} (SQLSTATE {state})" if state else text
