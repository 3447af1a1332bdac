"""The per-trial MCP tool server on the real engine, driven by the SDK's own ``ClientSession`` over
Streamable HTTP: every tool on a provisioned postgres pack stack (one for the module), every kind of tool
error, the bearer token (a raw request without it, two trials with swapped tokens), the trace, reaching it
from inside the trial's network and being refused from another network, and nothing left after close."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.mcp_raw import INITIALIZE, raw_post
from support.stacks import IDLE, REDIS, make_project, provision

from forgelib.docker import labels as lab
from forgelib.errors import ForgeError
from forgelib.mcp import ALL_TOOLS, DEFAULT_TOOLS, ToolServer, read_trace
from forgelib.mcp.network import TrialNetwork, stack_network_name, trial_network
from forgelib.mcp.tools import BODY_LIMIT, Toolbox, ToolFailure
from forgelib.mcp.trace import RESULT_LIMIT
from forgelib.runner import SubprocessRunner
from forgelib.spec.loader import load_project_config
from forgelib.stacks.provision import teardown_trial
from forgelib.stacks.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

PACK = Path(__file__).resolve().parents[2] / "examples" / "multi_service_postgres_reset"


@pytest.fixture(scope="module")
def module_run_id(runner: SubprocessRunner) -> Iterator[str]:
    rid = f"it-mcp-{secrets.token_hex(4)}"
    yield rid
    left = lab.resources_with_labels(runner, {lab.RUN: rid})
    assert lab.is_empty(left), f"leaked: {left}"


@pytest.fixture(scope="module")
def pack_stack(
    runner: SubprocessRunner, module_run_id: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The postgres pack's default environment (app-db seeded, widgets-api, runner), shared by the module:
    each test leaves the database as it found it."""
    project = load_project_config(PACK)
    trial = provision(project, module_run_id, tmp_path_factory.mktemp("pack"), runner)
    try:
        yield trial
    finally:
        teardown_trial(trial)


@pytest.fixture(scope="module")
def cache_stack(
    runner: SubprocessRunner, module_run_id: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A second trial: a redis on a published port (the direct client), one without (redis-cli), a box."""
    root = tmp_path_factory.mktemp("cache")
    services = {"cache": {**REDIS, "ports": ["6379"]}, "cache-cli": REDIS, "box": IDLE}
    trial = provision(make_project(root / "p", services, name="mcpcache"), module_run_id, root, runner, idx=1)
    try:
        yield trial
    finally:
        teardown_trial(trial)


def _text(result: Any) -> str:
    return str(result.content[0].text)


async def _session(
    url: str, token: str, calls: Sequence[tuple[str, dict[str, Any]]]
) -> tuple[list[str], list[Any]]:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = [t.name for t in (await session.list_tools()).tools]
        return listed, [await session.call_tool(name, args) for name, args in calls]


def call(srv: ToolServer, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
    """The calls, in order, over one MCP session of the SDK's client."""
    return asyncio.run(_session(srv.url, srv.token, calls))[1]


def test_every_tool_works_through_the_sdk_client(
    pack_stack: Stack, cache_stack: Stack, tmp_path: Path
) -> None:
    with ToolServer.start(pack_stack, tools=ALL_TOOLS, trace_path=tmp_path / "trace.jsonl") as srv:
        listed, results = asyncio.run(
            _session(
                srv.url,
                srv.token,
                [
                    ("write_file", {"service": "runner", "path": "/work/note.txt", "content": "héllo\n"}),
                    ("read_file", {"service": "runner", "path": "/work/note.txt"}),
                    ("list_dir", {"service": "runner", "path": "/work"}),
                    ("exec", {"service": "runner", "argv": ["sh", "-c", "echo out; echo err >&2; exit 3"]}),
                    (
                        "sql_query",
                        {"service": "app-db", "query": "select id, name from widgets where id = 1"},
                    ),
                    ("http_request", {"service": "widgets-api", "path": "/widgets/1"}),
                    ("http_request", {"service": "widgets-api", "path": "/widgets/999"}),
                ],
            )
        )
    assert listed == list(ALL_TOOLS)
    assert not any(r.is_error for r in results), [_text(r) for r in results]
    wrote, read, listing, ran, sql, api, missing = map(_text, results)
    assert wrote == "wrote 7 bytes to /work/note.txt" and read == "héllo\n"
    assert "note.txt" in listing.splitlines()
    assert json.loads(ran) == {
        "exit_code": 3,
        "stdout": "out\n",
        "stderr": "err\n",
        "stdout_truncated": False,
        "stderr_truncated": False,
    }
    assert json.loads(sql)["columns"] == ["id", "name"] and json.loads(sql)["rows"] == [[1, "baseline"]]
    assert json.loads(api)["status"] == 200 and json.loads(json.loads(api)["body"]) == {
        "id": 1,
        "name": "baseline",
    }
    assert json.loads(missing)["status"] == 404  # a 4xx is the API's answer, not a tool error

    with ToolServer.start(cache_stack, tools=["redis_command"], trace_path=tmp_path / "cache.jsonl") as srv:
        results = call(
            srv,
            ("redis_command", {"service": "cache", "command": ["SET", "order:7", "processing"]}),
            ("redis_command", {"service": "cache", "command": ["GET", "order:7"]}),
            ("redis_command", {"service": "cache-cli", "command": ["SET", "k", "v"]}),
            ("redis_command", {"service": "cache-cli", "command": ["GET", "k"]}),
        )
    assert [json.loads(_text(r))["reply"] for r in results] == ["OK", "processing", "OK", "v"]


class Unpublished:
    """The stack with nothing published: the database tools fall back to psql / redis-cli in the container."""

    def __init__(self, compose: Any) -> None:
        self.compose = compose

    def exec(self, service: str, argv: Sequence[str], **options: Any) -> Any:
        return self.compose.exec(service, argv, **options)

    def port(self, service: str, container_port: int) -> tuple[str, int]:
        raise ForgeError(f"service {service!r} does not publish {container_port}")


def test_sql_query_runs_psql_in_the_container_when_the_port_is_not_published(
    pack_stack: Stack,
) -> None:
    box = Toolbox(replace(pack_stack, compose=Unpublished(pack_stack.compose)))  # type: ignore[arg-type]
    out = json.loads(box.call("sql_query", {"service": "app-db", "query": "select id, name from widgets"}))
    assert out["columns"] == ["id", "name"] and out["rows"] == [["1", "baseline"]]  # psql's text
    with pytest.raises(ToolFailure, match='relation "nope" does not exist'):
        box.call("sql_query", {"service": "app-db", "query": "select * from nope"})


def test_each_kind_of_bad_call_is_a_recorded_tool_error_and_the_server_goes_on(
    pack_stack: Stack, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    offered = ("read_file", "write_file", "exec", "sql_query")
    bad: list[tuple[tuple[str, dict[str, Any]], str]] = [
        (("read_file", {"service": "mailer", "path": "/x"}), "no service 'mailer' in this trial's stack"),
        (("read_file", {"service": "runner", "path": "/no/such"}), "No such file or directory"),
        (
            ("exec", {"service": "runner", "argv": "ls"}),
            "bad arguments for exec: arguments.argv: 'ls' is not",
        ),
        (("exec", {"service": "runner", "argv": ["sleep", "30"], "timeout": 0.5}), "timed out after 0.5s"),
        (
            ("write_file", {"service": "runner", "path": "/work/big", "content": "x" * (BODY_LIMIT + 1)}),
            f"write_file takes at most {BODY_LIMIT}",
        ),
        (
            ("sql_query", {"service": "app-db", "query": "select * from nope"}),
            'relation "nope" does not exist',
        ),
        (("sql_query", {"service": "runner", "query": "select 1"}), "not a postgres or mysql service"),
        (("list_dir", {"service": "runner", "path": "/"}), "tool 'list_dir' is not offered in this trial"),
    ]
    good = ("read_file", {"service": "runner", "path": "/etc/hostname"})
    with ToolServer.start(pack_stack, tools=offered, trace_path=trace) as srv:
        results = call(srv, *[c for c, _ in bad], good)
    for (c, message), r in zip(bad, results, strict=False):
        assert r.is_error and message in _text(r), (c[0], _text(r))
    assert not results[-1].is_error and _text(results[-1]).strip()  # still serving after every error
    records = read_trace(trace)
    assert [r["tool"] for r in records] == [c[0] for c, _ in bad] + ["read_file"]
    for rec, r in zip(records[:-1], results, strict=False):
        assert rec["ok"] is False and rec["result"] is None and rec["error"] == _text(r)
    assert records[2]["arguments"] == {"service": "runner", "argv": "ls"}  # recorded as the agent sent it


def test_a_missing_or_wrong_token_gets_401_and_swapped_tokens_never_reach_the_other_stack(
    pack_stack: Stack, cache_stack: Stack, tmp_path: Path
) -> None:
    with (
        ToolServer.start(pack_stack, trace_path=tmp_path / "a.jsonl") as a,
        ToolServer.start(cache_stack, trace_path=tmp_path / "b.jsonl") as b,
    ):
        assert a.token != b.token
        assert (
            raw_post(a.url, None) == 401
            and raw_post(a.url, "") == 401
            and raw_post(a.url, a.token[:-1]) == 401
        )
        assert raw_post(a.url, b.token) == 401 and raw_post(b.url, a.token) == 401
        assert raw_post(a.url, a.token) == 200 and raw_post(b.url, b.token) == 200
        # The SDK's client with the other trial's token: its session never opens (the SDK reports the 401
        # as an error response to its `initialize`).
        with pytest.raises(BaseExceptionGroup) as e:
            asyncio.run(_session(a.url, b.token, [("list_dir", {"service": "runner", "path": "/"})]))
        assert "Server returned an error response" in repr(e.value), repr(e.value)
    assert read_trace(tmp_path / "a.jsonl") == [] and read_trace(tmp_path / "b.jsonl") == []


def test_the_trace_holds_every_call_in_order_with_the_whole_results_digest(
    pack_stack: Stack, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    big = "".join(f"line {i:05d}\n" for i in range(4000))  # 44 KB: over the trace's 16 KiB
    with ToolServer.start(pack_stack, trace_path=trace) as srv:
        results = call(
            srv,
            ("write_file", {"service": "runner", "path": "/work/big.txt", "content": big}),
            ("read_file", {"service": "runner", "path": "/work/big.txt"}),
            ("sql_query", {"service": "app-db", "query": "select name from widgets order by id"}),
        )
        assert srv.calls == 3
    records = read_trace(trace)
    assert [r["seq"] for r in records] == [1, 2, 3]
    assert [r["tool"] for r in records] == ["write_file", "read_file", "sql_query"]
    for rec, r in zip(records, results, strict=True):
        received = _text(r).encode()
        assert rec["ok"] is True and rec["error"] is None
        assert rec["result_bytes"] == len(received)
        assert rec["result_sha256"] == hashlib.sha256(received).hexdigest()
        assert rec["started"] <= rec["ended"]
    assert [r["ended"] for r in records] == sorted(r["ended"] for r in records)
    read = records[1]
    assert _text(results[1]) == big and read["truncated"] is True
    assert read["result"] == big[:RESULT_LIMIT] and read["result_bytes"] == len(big)
    assert records[0]["arguments"]["content"] == big  # arguments are recorded whole
    assert records[2]["truncated"] is False and json.loads(records[2]["result"])["rows"][0] == ["baseline"]


def test_an_agent_in_the_trials_network_reaches_it_and_another_network_is_refused(
    pack_stack: Stack, runner: SubprocessRunner, module_run_id: str, tmp_path: Path
) -> None:
    name = stack_network_name(pack_stack)
    assert name is not None
    net = TrialNetwork.inspect(runner, name)
    with ToolServer.start(pack_stack, trace_path=tmp_path / "t.jsonl", network=net) as srv:
        assert srv.stack_url is not None and srv.stack_url.startswith(f"http://{net.gateway}:")

        def curl(token: str) -> list[str]:
            return [
                "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "20",
                "-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json",
                "-H", "Accept: application/json, text/event-stream", "--data", INITIALIZE, str(srv.stack_url),
            ]  # fmt: skip

        inside = pack_stack.compose.exec("runner", curl(srv.token), timeout=60, check=False)
        assert inside.stdout == "200", inside
        assert pack_stack.compose.exec("runner", curl("wrong"), timeout=60, check=False).stdout == "401"

        other = f"forge-it-mcp-{secrets.token_hex(4)}"
        label = f"{lab.RUN}={module_run_id}"
        runner.run(["docker", "network", "create", "--label", label, other], timeout=60)
        try:
            outside = runner.run(
                ["docker", "run", "--rm", "--label", label, "--network", other, "forgelib/python:3.11",
                 *curl(srv.token)],
                timeout=120,
                check=False,
            )  # fmt: skip
        finally:
            runner.run(["docker", "network", "rm", other], timeout=60, check=False)
        assert outside.stdout == "403", outside  # it connected (the host routes it) and was refused
    assert read_trace(tmp_path / "t.jsonl") == []


def _listening(url: str) -> bool:
    host, port = url.split("/")[2].rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(5)
        return s.connect_ex((host, int(port))) == 0


def _open_fds_to(path: Path) -> list[str]:
    fds = Path("/proc/self/fd")
    out = []
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == str(path):
                out.append(fd.name)
        except OSError:
            continue
    return out


def test_close_leaves_nothing_behind_even_on_ctrl_c(
    pack_stack: Stack, runner: SubprocessRunner, tmp_path: Path
) -> None:
    net = trial_network(runner, pack_stack)
    trace = tmp_path / "trace.jsonl"
    before = {t.name for t in threading.enumerate()}
    # Ctrl-C arrives while the agent is working: the `with` closes the server on the way out.
    with (
        pytest.raises(KeyboardInterrupt),
        ToolServer.start(pack_stack, tools=DEFAULT_TOOLS, trace_path=trace, network=net) as srv,
    ):
        assert call(srv, ("sql_query", {"service": "app-db", "query": "select 1"}))[0].is_error is False
        urls = [srv.url, str(srv.stack_url)]
        assert all(_listening(u) for u in urls) and _open_fds_to(trace)
        raise KeyboardInterrupt
    assert not any(_listening(u) for u in urls)
    assert {t.name for t in threading.enumerate()} - before == set()
    assert _open_fds_to(trace) == []
    assert len(read_trace(trace)) == 1
    srv.close()  # idempotent
