"""The per-trial MCP tool server (forgelib/mcp): a tool call against doing the same thing directly, the
server's start-to-ready, and writing the trace.

On one provisioned stack of the postgres pack (torn down afterwards, leftovers checked):

- **calls**: MCP ``read_file`` / ``sql_query`` / ``http_request`` through the SDK's ``ClientSession`` over
  Streamable HTTP (one session, as an agent keeps one) against the direct way, alternating call by call:
  ``docker exec <container> cat`` (a subprocess; and the tool's own ``head`` through forge's runner, to
  split what MCP adds from what forge's exec does), psycopg on the published port (a connection kept open,
  as the tool keeps one; and a new connection per query), ``http.client`` to the published port (a new
  connection per request, as the tool makes). Medians; ratio MCP ÷ direct, target ≤ 1.3.
- **start**: ``ToolServer.start`` until it returns (listening, app started), and until a first
  ``initialize`` is answered, loopback only and also on the trial network's gateway; then ``close``.
  Median of ``--starts``, target ≤ 50 ms.
- **trace**: 1,000 records per trial through ``TraceWriter`` (one ``os.write`` per call; with and without
  ``fsync``) against a buffered file of the same lines written once at the end (what per-call durability
  costs), for a small and a truncated large result.

``--rounds`` (default 30, ``FORGE_BENCH_MCP_ROUNDS``) calls per tool and arm, ``--starts`` (30).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness as bs
from forgelib.docker import labels as lab
from forgelib.mcp import ALL_TOOLS, ToolServer
from forgelib.mcp.network import TrialNetwork, stack_network_name
from forgelib.mcp.tools import FILE_LIMIT
from forgelib.mcp.trace import TraceWriter
from forgelib.runner import SubprocessRunner
from forgelib.spec import models as m
from forgelib.spec.loader import load_project_config
from forgelib.stacks import connect
from forgelib.stacks.provision import (
    StackContext,
    TrialSpec,
    provision_trial,
    teardown_trial,
)
from forgelib.stacks.stack import Stack

NAME = "mcp"
CALL_TARGET = 1.3
START_TARGET_S = 0.050
TRACE_CALLS = 1000
QUERY = "select id, name from widgets order by id"
FILE = "/etc/os-release"


def provision(runner: SubprocessRunner, tmp: Path) -> Stack:
    project = load_project_config(bs.PACK)
    timeouts = m.Timeouts(compose_up=180, recipe=120, teardown=120, command=60)
    rid = f"bench-mcp-{secrets.token_hex(3)}"
    return provision_trial(StackContext(project, timeouts, runner), TrialSpec(None, rid, 0, tmp / "trial"))


# ----------------------------------------------------------------------------------------------- calls


async def _timed(fn: Callable[[], Awaitable[Any]]) -> float:
    t = time.perf_counter()
    await fn()
    return time.perf_counter() - t


def _sync_timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


async def measure_calls(trial: Stack, tmp: Path, rounds: int) -> list[dict[str, Any]]:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    container = trial.compose.container("runner")
    pg = connect.postgres(trial, "app-db")
    api_host, api_port = trial.compose.port("widgets-api", 8000)
    kept = pg.connect()

    def docker_cat() -> None:
        subprocess.run(["docker", "exec", container, "cat", FILE], check=True, capture_output=True)

    def forge_exec() -> None:  # the tool's own command through forge's runner, without MCP
        trial.compose.exec("runner", ["head", "-c", str(FILE_LIMIT + 1), "--", FILE], timeout=60)

    def psycopg_kept() -> None:
        kept.execute(QUERY).fetchall()

    def psycopg_new() -> None:
        with pg.connect() as conn:
            conn.execute(QUERY).fetchall()

    def http_direct() -> None:
        conn = http.client.HTTPConnection(api_host, api_port, timeout=30)
        conn.request("GET", "/widgets/1")
        conn.getresponse().read()
        conn.close()

    out: list[dict[str, Any]] = []
    with ToolServer.start(trial, tools=ALL_TOOLS, trace_path=tmp / "calls.jsonl") as srv:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {srv.token}"}) as client,
            streamable_http_client(srv.url, http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()

            def tool(name: str, args: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
                async def go() -> None:
                    r = await session.call_tool(name, args)
                    if r.is_error:
                        raise RuntimeError(f"{name} failed: {r.content[0]}")

                return go

            arms: list[tuple[str, Callable[[], Awaitable[Any]], list[tuple[str, Callable[[], Any]]]]] = [
                (
                    "read_file",
                    tool("read_file", {"service": "runner", "path": FILE}),
                    [("docker exec cat", docker_cat), ("forge exec head, no MCP", forge_exec)],
                ),
                (
                    "sql_query",
                    tool("sql_query", {"service": "app-db", "query": QUERY}),
                    [("psycopg, kept connection", psycopg_kept), ("psycopg, new connection", psycopg_new)],
                ),
                (
                    "http_request",
                    tool("http_request", {"service": "widgets-api", "path": "/widgets/1"}),
                    [("http.client", http_direct)],
                ),
            ]
            for name, mcp_call, directs in arms:
                for _ in range(3):  # warm-up: imports, the port lookup, the kept connections
                    await mcp_call()
                    for _, d in directs:
                        d()
                mcp_s: list[float] = []
                direct_s: dict[str, list[float]] = {label: [] for label, _ in directs}
                for r in range(rounds):
                    # alternate which goes first, so neither always runs on a cache the other warmed
                    if r % 2 == 0:
                        mcp_s.append(await _timed(mcp_call))
                    for label, d in directs:
                        direct_s[label].append(_sync_timed(d))
                    if r % 2 == 1:
                        mcp_s.append(await _timed(mcp_call))
                for label, samples in direct_s.items():
                    ratio = bs.ratio(bs.median(mcp_s), bs.median(samples))
                    out.append(
                        {
                            "tool": name,
                            "direct": label,
                            "mcp_ms": round(bs.median(mcp_s) * 1000, 2),
                            "direct_ms": round(bs.median(samples) * 1000, 2),
                            "ratio": round(ratio, 2),
                            "target": CALL_TARGET,
                            "verdict": bs.verdict(ratio, CALL_TARGET),
                        }
                    )
    kept.close()
    return out


# ----------------------------------------------------------------------------------------------- start


def _initialize(url: str, token: str) -> None:
    # the tests' raw MCP request, shared rather than written twice: benchmarks run from the checkout
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from support.mcp_raw import raw_post

    status = raw_post(url, token)
    if status != 200:
        raise RuntimeError(f"initialize answered {status}")


def measure_start(trial: Stack, net: TrialNetwork | None, tmp: Path, starts: int) -> dict[str, Any]:
    ready, answered, closed = [], [], []
    for i in range(starts + 2):
        t = time.perf_counter()
        srv = ToolServer.start(trial, trace_path=tmp / f"start-{i}.jsonl", network=net)
        t_ready = time.perf_counter()
        _initialize(srv.url, srv.token)
        t_answer = time.perf_counter()
        srv.close()
        t_closed = time.perf_counter()
        if i >= 2:  # the first two: imports, uvicorn's first config load
            ready.append(t_ready - t)
            answered.append(t_answer - t)
            closed.append(t_closed - t_answer)
    med = bs.median(ready)
    return {
        "server": "loopback + trial network" if net else "loopback",
        "start_to_ready_ms": round(med * 1000, 1),
        "p95_ms": round(bs.percentile(ready, 95) * 1000, 1),
        "to_first_answer_ms": round(bs.median(answered) * 1000, 1),
        "close_ms": round(bs.median(closed) * 1000, 1),
        "target_ms": START_TARGET_S * 1000,
        "verdict": bs.verdict(med, START_TARGET_S),
    }


# ----------------------------------------------------------------------------------------------- trace


def measure_trace(tmp: Path) -> list[dict[str, Any]]:
    rows = []
    args = {"service": "app-db", "query": QUERY}
    for label, result in (("2 KiB result", "x" * 2048), ("256 KiB result (cut at 16 KiB)", "y" * 262144)):
        per: dict[str, float] = {}
        for mode in ("buffered, once", "write per call", "write + fsync per call"):
            path = tmp / f"trace-{len(per)}-{len(result)}.jsonl"
            t = time.perf_counter()
            if mode == "buffered, once":  # the baseline: the same records, one buffered file, no durability
                from forgelib.mcp.trace import record

                with path.open("w") as f:
                    for i in range(TRACE_CALLS):
                        f.write(
                            json.dumps(record(i + 1, "sql_query", args, 1.0, 2.0, result=result, error=None))
                            + "\n"
                        )
            else:
                w = TraceWriter(path, fsync=mode.endswith("fsync per call"))
                for _ in range(TRACE_CALLS):
                    w.write("sql_query", args, 1.0, 2.0, result=result)
                w.close()
            per[mode] = time.perf_counter() - t
        base = per["buffered, once"]
        for mode, seconds in per.items():
            rows.append(
                {
                    "trace": label,
                    "mode": mode,
                    "calls": TRACE_CALLS,
                    "per_call_us": round(seconds / TRACE_CALLS * 1e6, 1),
                    "vs_buffered": round(bs.ratio(seconds, base), 2),
                }
            )
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.mcp_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=bs.env_int("FORGE_BENCH_MCP_ROUNDS", 30))
    parser.add_argument("--starts", type=int, default=bs.env_int("FORGE_BENCH_MCP_STARTS", 30))
    args = parser.parse_args(argv)
    meta = bs.start_meta(rounds=args.rounds, starts=args.starts)
    runner = SubprocessRunner(default_timeout=120)
    with tempfile.TemporaryDirectory(prefix="forge-bench-mcp-") as tmp_s:
        tmp = Path(tmp_s)
        trace_rows = measure_trace(tmp)
        trial = provision(runner, tmp)
        run_id = trial.labels.get(lab.RUN, "")
        try:
            call_rows = asyncio.run(measure_calls(trial, tmp, args.rounds))
            net = TrialNetwork.inspect(runner, str(stack_network_name(trial)))
            start_rows = [
                measure_start(trial, None, tmp, args.starts),
                measure_start(trial, net, tmp, args.starts),
            ]
        finally:
            teardown_trial(trial)
        left = bs.leftovers(run_id) if run_id else []
    meta["calls"] = call_rows
    meta["start"] = start_rows
    meta["trace"] = trace_rows
    print("\n-- server start-to-ready --\n" + bs.table(start_rows))
    print("\n-- trace writing --\n" + bs.table(trace_rows))
    worst = max(r["ratio"] for r in call_rows)
    notes = [
        f"worst call ratio {worst:.2f} (target <= {CALL_TARGET}); start-to-ready median "
        f"{start_rows[0]['start_to_ready_ms']} ms (target <= {START_TARGET_S * 1000:g})",
        f"leftovers after teardown: {left or 'none'}",
    ]
    return bs.report(NAME, call_rows, meta=meta, notes=notes)  # the call table last, under its notes


if __name__ == "__main__":
    main()
