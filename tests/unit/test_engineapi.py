"""The engine API fast path: which argv it answers, which engine it trusts, and what it prints — against a
canned engine on a unix socket (the real engine's answers are compared with the CLI's in
tests/integration/test_engineapi.py)."""

from __future__ import annotations

import json
import socketserver
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from forgelib import engineapi
from forgelib.docker import argv as dk
from forgelib.errors import CommandError, CommandTimeout
from forgelib.runner import SubprocessRunner
from forgelib.stacks.budget import parse_stats

LABEL = ["--filter", "label=io.forgelib.run=r1"]


@pytest.mark.parametrize(
    "argv",
    [
        dk.inspect(["c1", "c2"]),
        dk.inspect(["c1"], format="{{json .State}}"),
        dk.inspect(["forgelib/postgres:15", "sha256:abc"], kind="image"),
        *(dk.inspect(["i1"], kind="image", format=f) for f in engineapi.IMAGE_FORMATS),
        dk.ps(all=True, quiet=True, no_trunc=True, filters=LABEL),
        dk.ps(quiet=True, filter="label=com.docker.compose.project=p"),
        dk.ps(all=True, no_trunc=True, filters=LABEL, format='{{.ID}}\t{{.Names}}\t{{.Label "a"}}'),
        dk.ps(all=True, filters=LABEL, format="{{.Names}}"),
        dk.start(["c1", "c2"]),
        dk.pause(["c1"]),
        dk.unpause(["c1", "c2"]),
        dk.port("c1", "5432/tcp"),
        dk.rm(["c1", "c2"], force=True, volumes=True),
        dk.rm(["c1"]),
        dk.network_disconnect("n1", "c1", force=True),
        dk.network_disconnect("n1", "c1"),
        dk.stats(["c1", "c2"], no_stream=True, format=engineapi.MEMORY_FORMAT),
    ],
)
def test_the_forms_it_answers(argv: list[str]) -> None:
    assert engineapi.recognize(argv) is not None


@pytest.mark.parametrize(
    "argv",
    [
        dk.inspect(["c1"], format="{{.Id}}"),  # any other template: Go's
        dk.inspect(["n1"], kind="network"),
        dk.inspect(["i1"], kind="image", format="{{.Created}}"),
        dk.inspect([]),
        dk.ps(all=True, filters=LABEL),  # the table, or the config's psFormat
        dk.ps(all=True, quiet=True, format="{{.ID}}"),
        dk.ps(all=True, format="table {{.ID}}"),
        dk.ps(all=True, format="{{.ID}} {{.Status}}"),
        dk.ps(all=True, format="json"),
        dk.ps(all=True, quiet=True, last=1),
        dk.start(["c1"], attach=True),
        dk.port("c1", "5432"),
        [*dk.port("c1", "5432/tcp"), "more"],
        dk.exec("c1", ["true"]),
        dk.rm(["c1"], force=True, link=True),
        dk.rm(["n1"], kind="network"),
        dk.rm(["i1"], kind="image", force=True),
        [*dk.network_disconnect("n1", "c1"), "c2"],
        dk.compose("ps"),
        dk.stats(["c1"], no_stream=True, format="{{.Name}}\t{{.CPUPerc}}"),
        dk.stats(["c1"], format=engineapi.MEMORY_FORMAT),  # a stream
        dk.stats([], no_stream=True, format=engineapi.MEMORY_FORMAT),  # every running container
        ["podman", "inspect", "c1"],
    ],
)
def test_the_forms_it_leaves_to_the_cli(argv: list[str]) -> None:
    assert engineapi.recognize(argv) is None


def test_only_the_local_socket_the_cli_would_use(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path)}
    assert engineapi.local_socket(home) == engineapi.DEFAULT_SOCKET
    assert engineapi.local_socket({**home, "DOCKER_HOST": "unix:///run/e.sock"}) == "/run/e.sock"
    assert engineapi.local_socket({**home, "DOCKER_CONTEXT": "default"}) == engineapi.DEFAULT_SOCKET
    for refused in (
        {"DOCKER_HOST": "tcp://engine.example:2376"},
        {"DOCKER_HOST": "ssh://me@engine.example"},
        {"DOCKER_CONTEXT": "remote"},
        {"DOCKER_API_VERSION": "1.40"},
        {engineapi.SWITCH: "0"},
    ):
        assert engineapi.local_socket({**home, **refused}) is None, refused
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"currentContext": "remote"}))
    assert engineapi.local_socket({**home, "DOCKER_CONFIG": str(config)}) is None
    # DOCKER_HOST wins over the config's context, as in the CLI
    assert engineapi.local_socket({"DOCKER_CONFIG": str(config), "DOCKER_HOST": "unix:///e"}) == "/e"
    (config / "config.json").write_text(json.dumps({"currentContext": "default", "auths": {}}))
    assert engineapi.local_socket({**home, "DOCKER_CONFIG": str(config)}) == engineapi.DEFAULT_SOCKET
    (tmp_path / ".docker").mkdir()
    (tmp_path / ".docker" / "config.json").write_text("{not json")
    assert engineapi.local_socket(home) is None  # a config it cannot read: the CLI decides


# --------------------------------------------------------------------------------- a canned engine

Reply = tuple[int, Any]


@dataclass
class Canned:
    """A fake engine: (method, path) -> reply, or a callable of the query; every request recorded."""

    replies: dict[tuple[str, str], Reply | Callable[[dict[str, list[str]]], Reply]]
    seen: list[tuple[str, str, dict[str, list[str]]]] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)  # the JSON each request sent
    hang: threading.Event | None = None  # set: answer nothing until it is set


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[Canned, dict[str, str]]]:
    canned = Canned({("GET", "/version"): (200, {"ApiVersion": "1.41"})})
    path = tmp_path / "e.sock"

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            canned.seen.append((self.command, url.path, query))
            size = int(self.headers.get("Content-Length") or 0)
            if size:
                canned.bodies.append(json.loads(self.rfile.read(size)))
            if canned.hang is not None:
                canned.hang.wait(30)
                return
            reply = canned.replies.get((self.command, url.path.removeprefix("/v1.41")))
            if reply is None:
                status, body = 404, {"message": "page not found"}
            else:
                status, body = reply(query) if callable(reply) else reply
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def address_string(self) -> str:
            return "unix"

    class Server(socketserver.ThreadingUnixStreamServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that hung up (the docker CLI at a socket that is no engine)

    server = Server(str(path), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield canned, {"DOCKER_HOST": f"unix://{path}", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    finally:
        if canned.hang is not None:
            canned.hang.set()
        server.shutdown()
        server.server_close()
        thread.join()


CID = "a" * 64
ROW = {"Id": CID, "Names": ["/other/alias", "/p-db-1"], "Labels": {"svc": "db"}}


def test_ps_asks_with_the_cli_query_and_prints_its_rows(engine: tuple[Canned, dict[str, str]]) -> None:
    canned, env = engine
    canned.replies[("GET", "/containers/json")] = (200, [ROW, {"Id": "b" * 64, "Names": ["/q"]}])
    argv = dk.ps(all=True, quiet=True, no_trunc=True, filters=[*LABEL, "--filter", "status=exited"])
    assert engineapi.answer(argv, 5, env) == engineapi.Answer(0, f"{CID}\n{'b' * 64}\n", "")
    _, url, query = canned.seen[-1]
    assert url == "/v1.41/containers/json" and query["all"] == ["1"]
    assert json.loads(query["filters"][0]) == {
        "label": {"io.forgelib.run=r1": True},
        "status": {"exited": True},
    }
    short = engineapi.answer(dk.ps(quiet=True), 5, env)
    assert (
        short is not None and short.stdout == f"{'a' * 12}\n{'b' * 12}\n" and "all" not in canned.seen[-1][2]
    )
    fmt = '{{.ID}}\t{{.Names}}\t{{.Label "svc"}}'
    rows = engineapi.answer(dk.ps(all=True, no_trunc=True, format=fmt), 5, env)
    assert rows is not None and rows.stdout == f"{CID}\tother/alias,p-db-1\tdb\n{'b' * 64}\tq\t\n"
    cut = engineapi.answer(dk.ps(all=True, format="name={{.Names}}"), 5, env)
    assert cut is not None and cut.stdout == "name=p-db-1\nname=q\n"  # its own name, not a link's


def test_inspect_prints_records_and_states_and_leaves_a_missing_one_to_the_cli(
    engine: tuple[Canned, dict[str, str]],
) -> None:
    canned, env = engine
    state = {"Status": "exited", "Running": False, "ExitCode": 3}
    canned.replies[("GET", "/containers/c1/json")] = (200, {"Id": CID, "State": state})
    full = engineapi.answer(dk.inspect(["c1", "c1"]), 5, env)
    assert full is not None and json.loads(full.stdout) == [{"Id": CID, "State": state}] * 2 and full.rc == 0
    states = engineapi.answer(dk.inspect(["c1"], format="{{json .State}}"), 5, env)
    assert states == engineapi.Answer(0, '{"Status":"exited","Running":false,"ExitCode":3}\n', "")
    canned.replies[("GET", "/containers/gone/json")] = (404, {"message": "No such container: gone"})
    assert engineapi.answer(dk.inspect(["c1", "gone"]), 5, env) is None


def test_image_inspect_reports_each_missing_image_as_the_cli(engine: tuple[Canned, dict[str, str]]) -> None:
    canned, env = engine
    canned.replies[("GET", "/images/forgelib/postgres:15/json")] = (200, {"Id": "sha256:1"})
    canned.replies[("GET", "/images/nope:1/json")] = (404, {"message": "no such image: nope:1"})
    got = engineapi.answer(dk.inspect(["nope:1", "forgelib/postgres:15"], kind="image"), 5, env)
    assert got is not None and got.rc == 1 and json.loads(got.stdout) == [{"Id": "sha256:1"}]
    assert got.stderr == "Error response from daemon: no such image: nope:1\n"
    labels = {"z": "1", "a": "é"}
    image = {"Id": "sha256:2", "Size": 7, "RepoTags": ["a:1", "b:2"], "Config": {"Labels": labels}}
    canned.replies[("GET", "/images/i2/json")] = (200, image)
    canned.replies[("GET", "/images/bare/json")] = (200, {"Id": "sha256:3", "Config": {"Labels": None}})
    for fmt, want in (
        ("{{.Id}}", "sha256:2\n"),
        ("{{.Id}} {{.Size}}", "sha256:2 7\n"),
        ("{{.Id}} {{len .RepoTags}}", "sha256:2 2\n"),
        ("{{.Id}} {{json .Config.Labels}}", 'sha256:2 {"a":"é","z":"1"}\nsha256:3 null\n'),
    ):
        refs = ["i2", "nope:1", "bare"] if "Labels" in fmt else ["i2", "nope:1"]
        got = engineapi.answer(dk.inspect(refs, kind="image", format=fmt), 5, env)
        assert got == engineapi.Answer(1, want, "Error response from daemon: no such image: nope:1\n"), fmt
    # a record the template cannot be filled from: the CLI answers
    assert engineapi.answer(dk.inspect(["bare"], kind="image", format="{{.Id}} {{.Size}}"), 5, env) is None


def test_start_and_pause_print_what_started_and_why_the_rest_did_not(
    engine: tuple[Canned, dict[str, str]],
) -> None:
    canned, env = engine
    canned.replies[("POST", "/containers/up/start")] = (304, None)
    canned.replies[("POST", "/containers/new/start")] = (204, None)
    canned.replies[("POST", "/containers/gone/start")] = (404, {"message": "No such container: gone"})
    got = engineapi.answer(dk.start(["up", "gone", "new"]), 5, env)
    assert got == engineapi.Answer(
        1,
        "up\nnew\n",
        "Error response from daemon: No such container: gone\nError: failed to start containers: gone\n",
    )
    canned.replies[("POST", "/containers/up/pause")] = (
        409,
        {"message": f"Container {CID} is already paused"},
    )
    got = engineapi.answer(dk.pause(["up"]), 5, env)
    assert got == engineapi.Answer(1, "", f"Error response from daemon: Container {CID} is already paused\n")
    # an answer it cannot map after a start went out: never retried by the CLI, reported as a failure
    canned.replies[("POST", "/containers/odd/start")] = (200, None)
    odd = engineapi.answer(dk.start(["odd"]), 5, env)
    assert odd is not None and odd.rc == 1 and "error during connect" in odd.stderr


def test_port_prints_each_bind_and_says_what_is_not_published(engine: tuple[Canned, dict[str, str]]) -> None:
    canned, env = engine
    binds = [{"HostIp": "0.0.0.0", "HostPort": "32768"}, {"HostIp": "::", "HostPort": "32768"}]
    ports = {"5432/tcp": binds, "6000/tcp": None}
    canned.replies[("GET", "/containers/db/json")] = (200, {"NetworkSettings": {"Ports": ports}})
    assert engineapi.answer(dk.port("db", "5432/tcp"), 5, env) == engineapi.Answer(
        0, "0.0.0.0:32768\n[::]:32768\n", ""
    )
    for mapping in ("6000/tcp", "7000/tcp"):
        assert engineapi.answer(dk.port("db", mapping), 5, env) == engineapi.Answer(
            1, "", f"Error: No public port '{mapping}' published for db\n"
        )
    canned.replies[("GET", "/containers/gone/json")] = (404, {"message": "No such container: gone"})
    missing = engineapi.answer(dk.port("gone", "5432/tcp"), 5, env)
    assert missing == engineapi.Answer(1, "", "Error response from daemon: No such container: gone\n")


def test_stats_prints_each_containers_memory_as_the_cli_and_nothing_when_one_is_missing(
    engine: tuple[Canned, dict[str, str]],
) -> None:
    canned, env = engine
    v1 = {"usage": 548864, "limit": 25276203008, "stats": {"total_inactive_file": 0, "inactive_file": 0}}
    v2 = {"usage": 3 * 2**20, "limit": 2**30, "stats": {"inactive_file": 2**20}}  # no v1 key: v2's counts
    odd = {"usage": 1000, "limit": 0, "stats": {"total_inactive_file": 4000, "inactive_file": 200}}
    for name, mem in (("p-db-1", v1), ("p-cache-1", v2), ("p-odd-1", odd)):
        reply = {"name": f"/{name}", "memory_stats": mem}
        canned.replies[("GET", f"/containers/{name}/stats")] = (200, reply)
    argv = dk.stats(["p-db-1", "p-cache-1", "p-odd-1"], no_stream=True, format=engineapi.MEMORY_FORMAT)
    got = engineapi.answer(argv, 5, env)
    # the CLI's own figures for these (docker stats on this engine: 536KiB for the first)
    rows = "p-db-1\t536KiB / 23.54GiB\np-cache-1\t2MiB / 1GiB\np-odd-1\t800B / 0B\n"
    assert got == engineapi.Answer(0, rows, "")
    one_shot = {"stream": ["false"], "one-shot": ["true"]}
    assert all(query == one_shot for _, path, query in canned.seen if "stats" in path)
    assert parse_stats(got.stdout) == {"p-db-1": 536 * 1024, "p-cache-1": 2 * 2**20, "p-odd-1": 800}
    canned.replies[("GET", "/containers/gone/stats")] = (404, {"message": "No such container: gone"})
    both = dk.stats(["p-db-1", "gone"], no_stream=True, format=engineapi.MEMORY_FORMAT)
    missing = engineapi.answer(both, 5, env)
    assert missing == engineapi.Answer(1, "", "Error response from daemon: No such container: gone\n")
    canned.replies[("GET", "/version")] = (200, {"ApiVersion": "1.40"})  # no one-shot: two samples there
    engineapi._versions.clear()  # the version is asked once per socket
    assert engineapi.answer(argv, 5, env) is None


def test_surprises_and_a_missing_engine_go_to_the_cli(
    engine: tuple[Canned, dict[str, str]], tmp_path: Path
) -> None:
    canned, env = engine
    canned.replies[("GET", "/containers/json")] = (500, {"message": "boom"})
    assert engineapi.answer(dk.ps(all=True, quiet=True), 5, env) is None
    canned.replies[("GET", "/containers/c1/json")] = (200, {"Id": CID})  # no State
    assert engineapi.answer(dk.inspect(["c1"], format="{{json .State}}"), 5, env) is None
    nowhere = {**env, "DOCKER_HOST": f"unix://{tmp_path / 'none.sock'}"}
    assert engineapi.answer(dk.ps(all=True, quiet=True), 5, nowhere) is None


def test_the_runner_serves_a_form_logs_it_and_raises_as_for_the_cli(
    engine: tuple[Canned, dict[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    canned, env = engine
    canned.replies[("POST", "/containers/gone/start")] = (404, {"message": "No such container: gone"})
    caplog.set_level("DEBUG", logger="forgelib.runner")
    with pytest.raises(CommandError) as e:
        SubprocessRunner().run(dk.start(["gone"]), env=env)
    assert e.value.rc == 1 and "No such container: gone" in str(e.value)
    lines = [r.getMessage() for r in caplog.records]
    assert (
        lines[:3]
        == [
            "run docker start gone (timeout 60s)",
            "served by the engine API: docker start gone",
            lines[2],
        ]
        and lines[2].startswith("rc=1 in ")
        and lines[2].endswith("s: docker start gone")
    )
    off = SubprocessRunner().run(dk.start(["gone"]), env={**env, engineapi.SWITCH: "0"}, check=False)
    served = [r.getMessage() for r in caplog.records if r.getMessage().startswith("served by")]
    assert off.rc != 0 and len(served) == 1  # switched off: the CLI ran it


def test_a_silent_engine_is_the_runners_timeout(engine: tuple[Canned, dict[str, str]]) -> None:
    canned, env = engine
    canned.hang = threading.Event()
    with pytest.raises(CommandTimeout) as e:
        SubprocessRunner().run(dk.inspect(["c1"]), env=env, timeout=0.5)
    assert e.value.argv == ("docker", "inspect", "c1") and e.value.timeout == 0.5


def test_a_stop_during_a_served_launch_reads_as_the_cli_killed(engine: tuple[Canned, dict[str, str]]) -> None:
    canned, env = engine
    runner = SubprocessRunner()

    def killed_meanwhile(query: dict[str, list[str]]) -> Reply:
        runner.kill_tagged(["start"])
        return 204, None

    canned.replies[("POST", "/containers/c1/start")] = killed_meanwhile
    canned.replies[("POST", "/containers/c2/start")] = (204, None)
    assert runner.run(dk.start(["c1"]), env=env, tag="start", check=False).rc == -9
    assert runner.run(dk.start(["c2"]), env=env, tag="start", check=False).rc == 0  # that stop is past
    assert runner.run(dk.start(["c1"]), env=env, tag="other", check=False).rc == 0  # not a launch it stops


def test_rm_and_disconnect_send_the_cli_request_and_print_its_answer(
    engine: tuple[Canned, dict[str, str]],
) -> None:
    canned, env = engine
    canned.replies[("DELETE", "/containers/c1")] = (204, None)
    canned.replies[("DELETE", "/containers/gone")] = (404, {"message": "No such container: gone"})
    canned.replies[("DELETE", "/containers/up")] = (409, {"message": "You cannot remove a running container"})
    got = engineapi.answer(dk.rm(["c1", "gone"], force=True, volumes=True), 5, env)
    assert got == engineapi.Answer(0, "c1\n", "Error response from daemon: No such container: gone\n")
    assert canned.seen[-2][2] == {"force": ["1"], "v": ["1"]}
    got = engineapi.answer(dk.rm(["gone", "up"]), 5, env)
    assert got == engineapi.Answer(
        1,
        "",
        "Error response from daemon: No such container: gone\n"
        "Error response from daemon: You cannot remove a running container\n",
    )
    assert canned.seen[-1][2] == {"force": ["0"], "v": ["0"]}
    canned.replies[("POST", "/networks/n1/disconnect")] = (200, None)
    assert engineapi.answer(dk.network_disconnect("n1", "c1", force=True), 5, env) == engineapi.Answer(
        0, "", ""
    )
    assert canned.bodies[-1] == {"Container": "c1", "Force": True}
    canned.replies[("POST", "/networks/n2/disconnect")] = (404, {"message": "network n2 not found"})
    got = engineapi.answer(dk.network_disconnect("n2", "c1"), 5, env)
    assert got == engineapi.Answer(1, "", "Error response from daemon: network n2 not found\n")
    assert canned.bodies[-1] == {"Container": "c1", "Force": False}
