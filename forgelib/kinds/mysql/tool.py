"""``sql_query`` on a mysql service: one autocommit PyMySQL connection per (service, database) on its
published loopback port, or the server's client in the container when the port is not published."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from forgelib.clients import deferred
from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import ForgeError
from forgelib.kinds import toolschema as ts
from forgelib.kinds.base import ToolContext, ToolFailure, sql_result, tool_failed
from forgelib.kinds.mysql import ROW_LIMIT
from forgelib.kinds.mysql.client import MysqlParams, client_argv, credentials, direct_port, message

if TYPE_CHECKING:
    import pymysql
else:
    pymysql = deferred("pymysql")


class Backend:
    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._conns: dict[tuple[str, str], _Conn] = {}

    def call(self, tool: str, service: str, svc: ServiceConfig, args: Mapping[str, Any]) -> str:
        creds = credentials({"database": args.get("database")}, svc.environment)
        timeout = float(args.get("timeout", ts.DEFAULT_TIMEOUT))
        where = self._ctx.published(service, direct_port(svc))
        if where is None:  # not published on loopback (no reset recipe binds it): the client in the container
            return self._client(service, svc, args["query"], args.get("database"), timeout)
        database = creds.database or ""
        with self._lock:
            conn = self._conns.get((service, database))
            if conn is None:
                try:
                    password = creds.password(svc.environment, lambda p: self._read(service, p))
                except ForgeError as e:
                    raise ToolFailure(f"SQL on service {service!r} failed: {e}") from None
                params = MysqlParams(where[0], where[1], creds.user, password, creds.database)
                conn = self._conns[(service, database)] = _Conn(params)
        return conn.query(args["query"], timeout, service)

    def _read(self, service: str, path: str) -> str:
        r = self._ctx.run(service, ["cat", path], ts.DEFAULT_TIMEOUT)
        if r.rc != 0:
            raise ToolFailure(tool_failed(r, f"reading {path} in service {service!r} failed"))
        return r.stdout

    def _client(self, service: str, svc: ServiceConfig, query: str, database: Any, timeout: float) -> str:
        creds = credentials({"database": database}, svc.environment)
        r = self._ctx.run(service, client_argv(creds, "--batch", "--execute", query), timeout)
        if r.rc != 0:
            raise ToolFailure(tool_failed(r, f"SQL on service {service!r} failed"))
        lines = [line.split("\t") for line in r.stdout.splitlines()]
        columns, rows = (lines[0], lines[1:]) if lines else ([], [])
        return sql_result(columns, rows, limit=ROW_LIMIT, rowcount=len(rows), status=None)

    def close(self) -> None:
        with self._lock:
            conns = list(self._conns.values())
            self._conns.clear()
        for c in conns:
            c.close()


class _Conn:
    """One autocommit connection to a mysql service's published port, used by one call at a time;
    reconnected once when it broke (a server restart, a reset)."""

    def __init__(self, params: MysqlParams) -> None:
        self._params = params
        self._lock = threading.Lock()
        self._conn: Any = None

    def query(self, query: str, timeout: float, service: str) -> str:
        with self._lock:
            for attempt in (1, 2):
                try:
                    return self._query(query, timeout)
                except pymysql.err.OperationalError as e:
                    broken = self._conn is None or not self._conn.open or _lost(e)
                    self.close_locked()
                    if not broken or attempt == 2:
                        raise ToolFailure(f"SQL on service {service!r} failed: {message(e)}") from None
                except (pymysql.Error, ForgeError) as e:
                    raise ToolFailure(f"SQL on service {service!r} failed: {message(e)}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _query(self, query: str, timeout: float) -> str:
        if self._conn is None:
            self._conn = self._params.connect()
        # PyMySQL re-arms the socket's timeout from this before each read: a query that never answers
        # fails after ``timeout`` (there is no public setter once connected).
        self._conn._read_timeout = timeout
        with self._conn.cursor() as cur:
            cur.execute(query)
            columns = [c[0] for c in cur.description] if cur.description else []
            rows = cur.fetchmany(ROW_LIMIT + 1) if cur.description else []
            rowcount = cur.rowcount
            while cur.nextset():  # the last statement's result, as postgres gives
                columns = [c[0] for c in cur.description] if cur.description else []
                rows = cur.fetchmany(ROW_LIMIT + 1) if cur.description else []
                rowcount = cur.rowcount
        return sql_result(columns, rows, limit=ROW_LIMIT, rowcount=rowcount, status=None)

    def close_locked(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except pymysql.Error:
                pass
            finally:
                self._conn = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()


def _lost(e: BaseException) -> bool:
    """The connection went away (2006: server gone, 2013: lost during a query)."""
    args: tuple[Any, ...] = tuple(getattr(e, "args", ()))
    return bool(args) and args[0] in (2006, 2013)
