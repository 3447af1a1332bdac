"""forgelib.mcp's pure parts: the trace writer and reader, argument validation, service kinds, the network
helpers, and the tools' error paths on a scripted stack. The server's HTTP guard is driven over a real
socket here too (no engine needed); the tools on a real stack: tests/integration/test_mcp_server.py."""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Unpack

import pytest

from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import CommandTimeout, ForgeError, Interrupted
from forgelib.grading.checks import ExecOptions
from forgelib.kinds.registry import server_kind
from forgelib.mcp import ALL_TOOLS, DEFAULT_TOOLS, read_trace
from forgelib.mcp.network import TrialNetwork, allowed_peer, stack_network_name
from forgelib.mcp.tools import (
    BODY_LIMIT,
    FILE_LIMIT,
    LIST_LIMIT,
    MAX_RESULT,
    Toolbox,
    ToolFailure,
    validate,
)
from forgelib.mcp.trace import TraceWriter, truncate_utf8
from forgelib.runner import Result
from forgelib.stacks.stack import Stack

# ------------------------------------------------------------------------------------------------ trace


def test_trace_records_in_seq_order_with_the_whole_results_digest_and_a_cut_copy(tmp_path: Path) -> None:
    path = tmp_path / "t" / "trace.jsonl"
    w = TraceWriter(path, limit=10)
    w.write("read_file", {"service": "a", "path": "/x"}, 1.0, 2.0, result="héllo wörld, long")
    w.write("sql_query", {"service": "db", "query": "x"}, 3.0, 4.0, error="boom")
    w.close()
    first, second = read_trace(path)
    whole = "héllo wörld, long".encode()
    assert first == {
        "seq": 1,
        "tool": "read_file",
        "arguments": {"service": "a", "path": "/x"},
        "started": 1.0,
        "ended": 2.0,
        "ok": True,
        "result": "héllo wö",  # 10 bytes cut back to a whole character (ö is two bytes: 9)
        "error": None,
        "result_bytes": len(whole),
        "result_sha256": hashlib.sha256(whole).hexdigest(),
        "truncated": True,
    }
    assert second["seq"] == 2 and second["ok"] is False and second["result"] is None
    assert second["error"] == "boom" and second["result_bytes"] == 0 and second["truncated"] is False
    assert second["result_sha256"] == hashlib.sha256(b"").hexdigest()


def test_each_record_is_on_disk_as_soon_as_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    w = TraceWriter(path)
    w.write("list_dir", {"service": "a", "path": "/"}, 1.0, 1.5, result="x")
    assert [r["seq"] for r in read_trace(path)] == [1]  # not closed: the OS has it already
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.write("list_dir", {}, 1.0, 1.0, result="")


def test_the_reader_skips_a_torn_last_line_and_names_a_bad_line_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    good = json.dumps({"seq": 1, "tool": "read_file"})
    path.write_text(good + "\n" + '{"seq": 2, "to')
    assert read_trace(path) == [{"seq": 1, "tool": "read_file"}]
    path.write_text('{"seq": 1, "to\n' + good + "\n")
    with pytest.raises(ValueError, match=r"trace\.jsonl:1: not a JSON trace record"):
        read_trace(path)
    assert read_trace(tmp_path / "missing.jsonl") == []


def test_truncation_never_splits_a_character() -> None:
    assert truncate_utf8("aé", 2) == ("a", True)
    assert truncate_utf8("aé", 3) == ("aé", False)


# ------------------------------------------------------------------------------------------ validation


def test_the_default_tools_are_all_but_exec() -> None:
    assert set(ALL_TOOLS) - set(DEFAULT_TOOLS) == {"exec"}


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("read_file", {"service": "a"}, "'path' is a required property"),
        ("read_file", {"service": "a", "path": "/x", "mode": "r"}, "Additional properties"),
        ("exec", {"service": "a", "argv": []}, "arguments.argv: [] should be non-empty"),
        ("exec", {"service": "a", "argv": ["x"], "timeout": 10_000}, "timeout: 10000 is greater than"),
        ("http_request", {"service": "a", "method": "BREW"}, "arguments.method: 'BREW' is not one of"),
        ("redis_command", {"service": "a", "command": ["GET", 1]}, "arguments.command[1]: 1 is not of type"),
        ("teleport", {}, "unknown tool 'teleport'; tools: http_request, read_file"),
    ],
)
def test_bad_arguments_are_a_tool_failure_naming_the_field(tool: str, args: Any, message: str) -> None:
    with pytest.raises(ToolFailure) as e:
        validate(tool, args)
    assert message in str(e.value)


def _kind(raw: dict[str, Any]) -> str | None:
    return server_kind(ServiceConfig.of(raw))


def test_service_kinds_come_from_the_image_then_the_environment_then_the_command() -> None:
    assert _kind({"image": "forgelib/postgres:15"}) == "postgres"
    assert _kind({"image": "docker.io/library/postgres@sha256:ab"}) == "postgres"
    assert _kind({"image": "redis:7-alpine"}) == "redis"
    assert _kind({"image": "corp/db", "environment": {"POSTGRES_PASSWORD": "x"}}) == "postgres"
    assert _kind({"image": "corp/cache", "command": ["redis-server", "--port", "7000"]}) == "redis"
    assert _kind({"image": "forgelib/python:3.11"}) is None


# -------------------------------------------------------------------------------------------- network


def test_peers_are_loopback_or_inside_the_trial_network() -> None:
    subnets = ("172.29.0.0/16",)
    assert allowed_peer("127.0.0.1", subnets) and allowed_peer("::1", subnets)
    assert allowed_peer("172.29.0.5", subnets) and allowed_peer("::ffff:172.29.3.4", subnets)
    assert not allowed_peer("172.30.0.5", subnets) and not allowed_peer("10.0.0.1", ())
    assert not allowed_peer(None, subnets) and not allowed_peer("not-an-ip", subnets)


def test_the_trial_network_is_the_projects_default_or_its_only_one() -> None:
    def of(config: dict[str, Any]) -> Stack:
        return Stack("p", None, None, {}, {}, Path("/t"), config=config)  # type: ignore[arg-type]

    default = {"networks": {"default": {"name": "p_default"}}, "services": {"a": {}}}
    assert stack_network_name(of(default)) == "p_default"
    only = {"networks": {"back": {}}, "services": {"a": {"networks": {"back": None}}}}
    assert stack_network_name(of(only)) == "p_back"
    two = {"networks": {"x": {}, "y": {}}, "services": {"a": {"networks": {"x": None, "y": None}}}}
    assert stack_network_name(of(two)) is None and stack_network_name(of({})) is None


def test_the_gateway_and_subnets_come_from_network_inspect() -> None:
    data = [{"IPAM": {"Config": [{"Subnet": "172.29.0.0/16", "Gateway": "172.29.0.1"}]}}]
    assert TrialNetwork.of_inspect("n", data) == TrialNetwork("n", "172.29.0.1", ("172.29.0.0/16",))
    with pytest.raises(ForgeError, match="no IPv4 gateway"):
        TrialNetwork.of_inspect("n", [{"IPAM": {"Config": []}}])


# ------------------------------------------------------------------------------------------ the tools


class ScriptedStack:
    """exec answers from a script keyed by the program; port publishes nothing."""

    def __init__(self, answers: dict[str, Result | BaseException]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, tuple[str, ...], str | None]] = []

    def exec(self, service: str, argv: Sequence[str], **options: Unpack[ExecOptions]) -> Result:
        self.calls.append((service, tuple(argv), options.get("input")))
        answer = self.answers[argv[0]]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def port(self, service: str, container_port: int) -> tuple[str, int]:
        raise ForgeError(f"no port {container_port}")


CONFIG = {"services": {"runner": {"image": "forgelib/python:3.11"}, "db": {"image": "postgres:16"}}}


def _stack(access: ScriptedStack) -> Stack:
    """A ``Stack`` of ``CONFIG`` whose commands and ports are ``access``'s."""
    return Stack("p", None, access, {}, {}, Path("/t"), config=CONFIG)  # type: ignore[arg-type]


def _result(rc: int = 0, stdout: str = "", stderr: str = "") -> Result:
    return Result(("x",), rc, stdout, stderr, 0.01)


def test_tool_errors_say_what_went_wrong_for_the_agent() -> None:
    stack = ScriptedStack(
        {
            "head": _result(1, stderr="head: cannot open '/nope' for reading: No such file or directory"),
            "sleep": CommandTimeout(["docker", "exec"], 0.5),
            "stopped": Interrupted("interrupted"),  # Ctrl-C: the stop killed (or refused) the exec
        }
    )
    box = Toolbox(_stack(stack))
    cases = [
        ("read_file", {"service": "ghost", "path": "/x"}, "no service 'ghost' in this trial's stack"),
        ("read_file", {"service": "runner", "path": "/nope"}, "No such file or directory"),
        ("exec", {"service": "runner", "argv": ["sleep", "9"]}, "timed out after 0.5s"),
        ("exec", {"service": "runner", "argv": ["stopped"]}, "forge is stopping this trial"),
        (
            "sql_query",
            {"service": "runner", "query": "x"},
            "not a postgres or mysql service; postgres or mysql services: db",
        ),
        ("redis_command", {"service": "db", "command": ["PING"]}, "redis services: (none)"),
        ("http_request", {"service": "runner"}, "publishes no port"),
        ("write_file", {"service": "runner", "path": "/a", "content": "x" * (BODY_LIMIT + 1)}, "at most"),
    ]
    for tool, args, message in cases:
        with pytest.raises(ToolFailure) as e:
            box.call(tool, args)
        assert message in str(e.value), (tool, str(e.value))
    # the oversized write never reached the stack
    assert [c[1][0] for c in stack.calls] == ["head", "sleep", "stopped"]


def test_a_file_larger_than_the_limit_is_an_error_and_a_write_passes_the_path_as_an_argument() -> None:
    stack = ScriptedStack({"head": _result(stdout="x" * (FILE_LIMIT + 1)), "sh": _result()})
    box = Toolbox(_stack(stack))
    with pytest.raises(ToolFailure, match="larger than"):
        box.call("read_file", {"service": "runner", "path": "/big"})
    assert box.call("write_file", {"service": "runner", "path": "/a b; rm -rf /", "content": "é"}) == (
        "wrote 2 bytes to /a b; rm -rf /"
    )
    assert stack.calls[-1] == ("runner", ("sh", "-c", 'cat > "$1"', "sh", "/a b; rm -rf /"), "é")


def test_no_result_is_larger_than_the_limit() -> None:
    huge = "\n".join("x" * 300 for _ in range(LIST_LIMIT))  # 10,000 entries of 300 bytes: 3 MB
    box = Toolbox(_stack(ScriptedStack({"ls": _result(stdout=huge)})))
    with pytest.raises(ToolFailure, match=f"the result is {len(huge)} bytes; at most {MAX_RESULT}"):
        box.call("list_dir", {"service": "runner", "path": "/"})


def test_a_toolbox_is_scoped_to_the_services_it_is_given() -> None:
    box = Toolbox(_stack(ScriptedStack({})), services=["runner"])
    with pytest.raises(ToolFailure, match=r"services: runner$"):
        box.call("list_dir", {"service": "db", "path": "/"})
    with pytest.raises(ForgeError, match="no service 'x'"):
        Toolbox(_stack(ScriptedStack({})), services=["x"])


# ------------------------------------------------------------------------------------ the server's guard


def _trial() -> Stack:
    return _stack(ScriptedStack({"ls": _result(stdout="a\nb/\n")}))


def _post(url: str, token: str | None) -> tuple[int, str]:
    host_port = url.split("/")[2]
    conn = http.client.HTTPConnection(host_port, timeout=10)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn.request("POST", "/mcp", body=b"{}", headers=headers)
    resp = conn.getresponse()
    out = resp.status, resp.read().decode()
    conn.close()
    return out


def test_a_request_without_the_trials_token_gets_401_and_close_frees_the_port(tmp_path: Path) -> None:
    from forgelib.mcp import ToolServer

    with ToolServer.start(_trial(), trace_path=tmp_path / "trace.jsonl") as srv:
        assert srv.stack_url is None and srv.tools == DEFAULT_TOOLS
        assert _post(srv.url, None)[0] == 401
        assert _post(srv.url, srv.token + "x")[0] == 401
        assert _post(srv.url, srv.token)[0] == 400  # past the guard: the MCP layer rejects the empty message
        port = int(srv.url.split(":")[2].split("/")[0])
        srv.close()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more
    assert read_trace(tmp_path / "trace.jsonl") == []  # rejected requests are no tool calls


def test_an_unknown_tool_name_is_refused_at_start(tmp_path: Path) -> None:
    from forgelib.mcp import ToolServer

    with pytest.raises(ForgeError, match="unknown MCP tool"):
        ToolServer.start(_trial(), tools=["read_file", "rm_rf"], trace_path=tmp_path / "t.jsonl")
    assert not (tmp_path / "t.jsonl").exists()
