"""forgelib.docker.hostprobe without an engine: which healthchecks it recognises (and which it leaves to
``docker exec``), how it reads each protocol's answer, how it looks a path up inside a container's root,
and how readiness uses it (a host PASS is ready; a host no leaves the real healthcheck the authority).
That its answers are the real commands' on real containers: tests/integration/test_hostprobe.py."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from forgelib.docker import hostprobe, readiness
from forgelib.docker.compose import ComposeProject
from forgelib.docker.hostprobe import Target, Unanswerable, lookup, recognise
from forgelib.docker.readiness import NotReady, start
from forgelib.docker.resolved import ResolvedConfig
from forgelib.kinds import registry  # noqa: F401 - registers the kinds' forms
from forgelib.kinds.mysql import hostcheck as my
from forgelib.kinds.postgres import hostcheck as pg
from forgelib.kinds.redis import hostcheck as rd
from forgelib.spec.models import Timeouts
from forgelib.testing import ANY, FakeRunner


@pytest.mark.parametrize(
    "argv",
    [
        ["pg_isready", "-h", "127.0.0.1", "-U", "app", "-d", "app"],
        ["pg_isready", "-h", "localhost", "-p", "5433", "-q", "-t", "5"],
        ["pg_isready", "-h127.0.0.1", "-Upostgres"],
        ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8000/healthz"],
        ["curl", "--fail", "--silent", "--show-error", "http://localhost/"],
        ["curl", "-f", "-s", "http://127.0.0.1:8000/h?x=1"],
        ["redis-cli", "ping"],
        ["redis-cli", "-h", "127.0.0.1", "-p", "6380", "PING"],
        ["/bin/sh", "-c", "redis-cli ping | grep -q PONG"],
        ["mariadb-admin", "ping", "-h", "127.0.0.1", "-ushop", "-pshop"],
        ["mysqladmin", "ping", "-h", "127.0.0.1", "-P", "3307", "-u", "root", "-proot"],
        ["mysqladmin", "--host=127.0.0.1", "--port=3306", "--user=a", "--password=b", "ping"],
        ["test", "-d", "/work"],
        ["test", "-f", "/etc/hostname"],
        ["test", "-e", "/x"],
    ],
)
def test_each_recognised_form(argv: list[str]) -> None:
    assert recognise(argv) is not None


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["check"],
        ["/usr/bin/pg_isready", "-h", "127.0.0.1"],  # a path: not the name we know
        ["pg_isready"],  # the unix socket
        ["pg_isready", "-U", "app"],
        ["pg_isready", "-h", "db", "-U", "app"],  # another host
        ["pg_isready", "-h", "/var/run/postgresql"],
        ["pg_isready", "-h", "127.0.0.1", "-d", "host=other dbname=x"],  # a conninfo names its own host
        ["pg_isready", "-h", "127.0.0.1", "--username=app"],  # a flag not listed
        ["pg_isready", "-h", "127.0.0.1", "extra"],
        ["curl", "-fsS", "https://127.0.0.1:8443/healthz"],
        ["curl", "-f", "http://api:8000/healthz"],
        ["curl", "-f", "http://10.0.0.2/"],
        ["curl", "-fL", "http://127.0.0.1/"],  # follows redirects
        ["curl", "-f", "-o", "out.html", "http://127.0.0.1/"],
        ["curl", "-f", "--max-time", "3", "http://127.0.0.1/"],
        ["curl", "-f", "http://127.0.0.1/", "http://127.0.0.1/b"],
        ["curl", "-f", "http://u:p@127.0.0.1/"],
        ["curl", "-f"],
        ["redis-cli", "-h", "cache", "ping"],
        ["redis-cli", "-a", "secret", "ping"],
        ["redis-cli", "get", "k"],
        ["redis-cli"],
        ["/bin/sh", "-c", "redis-cli ping | grep PONG"],  # not the exact string listed
        ["/bin/sh", "-c", "curl -f http://127.0.0.1/ || exit 1"],
        ["/bin/sh", "-c", "redis-cli ping | grep -q PONG && touch /x"],
        ["mariadb-admin", "ping"],  # the unix socket
        ["mariadb-admin", "ping", "-h", "localhost"],  # also the socket, to these clients
        ["mariadb-admin", "ping", "-h", "127.0.0.1", "-p"],  # asks for a password
        ["mariadb-admin", "ping", "-h", "127.0.0.1", "--silent"],
        ["mariadb-admin", "status", "-h", "127.0.0.1"],
        ["test", "-x", "/bin/sh"],
        ["test", "-d", "work"],  # relative: the exec's working directory
        ["test", "-d", "/a", "-a", "-d", "/b"],
    ],
)
def test_anything_else_is_left_to_docker_exec(argv: list[str]) -> None:
    assert recognise(argv) is None


def test_off_by_the_switch_and_on_a_remote_engine() -> None:
    assert hostprobe.enabled({})
    assert not hostprobe.enabled({hostprobe.ENV: "0"})
    assert not hostprobe.enabled({"DOCKER_HOST": "tcp://node:2375"})
    assert hostprobe.HostProbe.of("no-such-container", ["test", "-d", "/w"], 3.0) is None  # no main pid


# ------------------------------------------------------------------------------------------ the protocols


def test_pg_answers_as_libpqs_ping() -> None:
    def error(sqlstate: str | None) -> bytes:
        fields = b"SFATAL\0" + (f"C{sqlstate}\0".encode() if sqlstate else b"") + b"Mno\0\0"
        return fields

    assert pg.verdict(b"R", b"\0\0\0\x05salt") is True  # a password asked: the server is up
    assert pg.verdict(b"R", b"\0\0\0\0") is True
    assert pg.verdict(b"E", error("28000")) is True  # refused our role: up all the same
    assert pg.verdict(b"E", error("3D000")) is True
    assert pg.verdict(b"E", error("57P03")) is False  # starting up / shutting down
    assert pg.verdict(b"E", error(None)) is False  # no SQLSTATE: no response
    assert pg.verdict(b"N", b"") is None
    with pytest.raises(OSError):
        pg.verdict(b"Z", b"I")


class _Local(Target):
    """A target whose sockets are this process's own (the protocol logic; the namespace part is the
    integration test's)."""

    def __init__(self) -> None:
        super().__init__("c", 1)

    def socket(self, family: int) -> socket.socket:
        return socket.socket(family, socket.SOCK_STREAM)


@pytest.fixture
def server() -> Iterator[Callable[[Callable[[socket.socket], None]], int]]:
    """Serve one connection on 127.0.0.1 with ``handle``; its port."""
    listeners: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def serve(handle: Callable[[socket.socket], None]) -> int:
        lst = socket.socket()
        lst.bind(("127.0.0.1", 0))
        lst.listen(1)
        listeners.append(lst)

        def run() -> None:
            conn, _ = lst.accept()
            with conn:
                handle(conn)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        threads.append(t)
        return int(lst.getsockname()[1])

    yield serve
    for t in threads:
        t.join(timeout=10)
    for lst in listeners:
        lst.close()


def _read_startup(conn: socket.socket) -> tuple[int, dict[str, str]]:
    (length,) = struct.unpack("!I", conn.recv(4, socket.MSG_WAITALL))
    body = conn.recv(length - 4, socket.MSG_WAITALL)
    (version,) = struct.unpack("!I", body[:4])
    words = body[4:].split(b"\0")
    return version, {words[i].decode(): words[i + 1].decode() for i in range(0, len(words) - 2, 2)}


def _pg(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


@pytest.mark.parametrize(
    ("answer", "passes"),
    [
        (_pg(b"R", b"\0\0\0\0"), True),  # trust: authenticated
        (_pg(b"R", b"\0\0\0\x05salt"), True),  # md5 asked
        (_pg(b"E", b"SFATAL\0C57P03\0\0"), False),
        (_pg(b"N", b"SNOTICE\0\0") + _pg(b"E", b"SFATAL\0C28000\0\0"), True),
        (b"", False),  # closed without a word
    ],
)
def test_pg_ping_sends_a_startup_message_and_reads_the_first_answer(
    server: Callable[[Callable[[socket.socket], None]], int], answer: bytes, passes: bool
) -> None:
    seen: list[tuple[int, dict[str, str]]] = []

    def handle(conn: socket.socket) -> None:
        seen.append(_read_startup(conn))
        conn.sendall(answer)
        conn.recv(16)  # a Terminate, or the close

    port = server(handle)
    assert pg.ping(_Local(), "127.0.0.1", port, "app", "appdb", 5.0) is passes
    assert seen == [(3 << 16, {"user": "app", "database": "appdb"})]


def test_a_refused_connection_is_no_answer() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        assert pg.ping(_Local(), "127.0.0.1", port, "u", "d", 5.0) is False
        assert hostprobe.http_get(_Local(), "127.0.0.1", port, "/", "127.0.0.1", True, 5.0) is False
        assert rd.ping(_Local(), port, 5.0) is False
        assert my.ping(_Local(), port, 5.0) is False


@pytest.mark.parametrize(
    ("head", "fail", "passes"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", True, True),
        (b"HTTP/1.1 301 Moved\r\nLocation: /x\r\n\r\n", True, True),  # not followed: curl exits 0
        (b"HTTP/1.1 404 Not Found\r\n\r\n", True, False),
        (b"HTTP/1.1 500 Internal Server Error\r\n\r\n", True, False),
        (b"HTTP/1.1 500 Internal Server Error\r\n\r\n", False, True),  # without -f any answer is exit 0
        (b"HTTP/1.0 200 OK\r\n\r\n", True, True),
        (b"HTTP/1.1 200 OK\r\ncontent-le", True, False),  # cut off
        (b"SSH-2.0-OpenSSH\r\n\r\n", False, False),
        (b"", False, False),  # an empty reply
    ],
)
def test_http_status_as_curl_exits(head: bytes, fail: bool, passes: bool) -> None:
    assert hostprobe.http_verdict(head, fail) is passes


def test_http_get_sends_the_request_curl_would(
    server: Callable[[Callable[[socket.socket], None]], int],
) -> None:
    seen: list[bytes] = []

    def handle(conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(4096)
        seen.append(data)
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")

    port = server(handle)
    assert (
        hostprobe.http_get(_Local(), "127.0.0.1", port, "/healthz?x=1", f"127.0.0.1:{port}", True, 5.0)
        is False
    )
    lines = seen[0].decode().split("\r\n")
    assert lines[0] == "GET /healthz?x=1 HTTP/1.1" and f"Host: 127.0.0.1:{port}" in lines


@pytest.mark.parametrize(
    ("reply", "passes"),
    [
        (b"+PONG\r\n", True),
        (b"-LOADING Redis is loading the dataset in memory\r\n", False),
        (b"-NOAUTH Authentication required.\r\n", False),
        (b"$4\r\nPONG\r\n", False),
        (b"", False),
    ],
)
def test_redis_pong_only(reply: bytes, passes: bool) -> None:
    assert rd.verdict(reply) is passes


def test_redis_ping_sends_a_ping(server: Callable[[Callable[[socket.socket], None]], int]) -> None:
    seen: list[bytes] = []

    def handle(conn: socket.socket) -> None:
        seen.append(conn.recv(64))
        conn.sendall(b"+PONG\r\n")

    assert rd.ping(_Local(), server(handle), 5.0) is True
    assert seen == [b"*1\r\n$4\r\nPING\r\n"]


def _handshake(version: int) -> bytes:
    payload = bytes([version]) + b"10.11.6-MariaDB\0" + b"\0" * 40
    return len(payload).to_bytes(3, "little") + b"\0" + payload


@pytest.mark.parametrize(
    ("packet", "passes"),
    [
        (_handshake(10), True),
        (_handshake(9), False),
        # "Host is not allowed to connect": an error packet first
        (b"\x1f\0\0\0\xff\x6a\x04Host '1.2.3.4' is not allowed", False),
        (b"\x05\0\0", False),  # cut off
    ],
)
def test_mysql_alive_on_the_initial_handshake(
    server: Callable[[Callable[[socket.socket], None]], int], packet: bytes, passes: bool
) -> None:
    port = server(lambda conn: conn.sendall(packet))
    assert my.ping(_Local(), port, 5.0) is passes


def test_an_unpermitted_namespace_is_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    class Denied:
        def setns(self, fd: int, kind: int) -> int:
            ctypes.set_errno(errno.EPERM)
            return -1

    monkeypatch.setattr(hostprobe, "_LIBC", [Denied()])
    monkeypatch.setattr(hostprobe, "_denied", threading.Event())
    with pytest.raises(Unanswerable):
        hostprobe.in_netns(Path("/proc/self/ns/net"), socket.AF_INET)
    assert not hostprobe.enabled({})  # not asked again in this process


# ------------------------------------------------------------------------------- paths in the container


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "work" / "src").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "hostname").write_text("c\n")
    (root / "w").symlink_to("/work")  # absolute: the container's /work, not the host's
    (root / "rel").symlink_to("work/src")
    (root / "loop").symlink_to("/loop")
    (tmp_path / "outside").mkdir()
    (root / "up").symlink_to("../../outside")  # `..` stops at the container's root
    return root


def test_lookup_follows_links_inside_the_root(tmp_path: Path) -> None:
    root = _root(tmp_path)
    found = lookup(root, "/w/src")
    assert found is not None and os.path.samestat(found, os.stat(root / "work" / "src"))
    assert lookup(root, "/rel") is not None
    assert lookup(root, "/work/../work/./src") is not None
    assert lookup(root, "/../../etc/hostname") is not None  # the container's /etc
    assert lookup(root, "/up") is None  # ../../outside from the root is its /outside: not there
    assert lookup(root, "/nope") is None
    assert lookup(root, "/etc/hostname/x") is None
    with pytest.raises(Unanswerable):
        lookup(root, "/loop")
    with pytest.raises(Unanswerable):
        lookup(root, "relative")


def test_lookup_needs_every_directory_searchable_by_anyone(tmp_path: Path) -> None:
    root = _root(tmp_path)
    (root / "work").chmod(0o750)  # the healthcheck may run as another user: the host cannot tell
    try:
        with pytest.raises(Unanswerable):
            lookup(root, "/work/src")
    finally:
        (root / "work").chmod(0o755)


def _container(tmp_path: Path, path: str = "/bin") -> Target:
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "root").symlink_to(_root(tmp_path))
    (proc / "7" / "environ").write_bytes(f"HOSTNAME=c\0PATH={path}\0".encode())
    (proc / "7" / "cgroup").write_text("0::/system.slice/docker-c0ffee.scope\n")
    return Target("c0ffee", 7, proc=proc)


def test_a_program_must_be_on_the_containers_path_and_executable(tmp_path: Path) -> None:
    target = _container(tmp_path, "/usr/local/bin:/bin")
    bin_ = tmp_path / "root" / "bin"
    bin_.mkdir()
    (bin_ / "sh").write_text("")
    (bin_ / "sh").chmod(0o755)
    (bin_ / "curl").write_text("")
    (bin_ / "curl").chmod(0o700)
    hostprobe.require_programs(target, ["sh", "/bin/sh"])
    with pytest.raises(Unanswerable):
        hostprobe.require_programs(target, ["pg_isready"])  # not there: the real one fails to start
    with pytest.raises(Unanswerable):
        hostprobe.require_programs(target, ["curl"])  # not executable by everyone


def test_test_answers_from_the_containers_root(tmp_path: Path) -> None:
    target = _container(tmp_path)
    bin_ = tmp_path / "root" / "bin"
    bin_.mkdir()
    (bin_ / "test").write_text("")
    (bin_ / "test").chmod(0o755)

    def passes(*argv: str) -> bool | None:
        check = recognise(argv)
        assert check is not None
        return hostprobe.HostProbe(target, check, 1.0).passes()

    assert passes("test", "-d", "/w/src") is True
    assert passes("test", "-f", "/etc/hostname") is True
    assert passes("test", "-e", "/rel") is True
    assert passes("test", "-d", "/etc/hostname") is False
    assert passes("test", "-d", "/nope") is False
    assert passes("test", "-d", "/loop") is None  # left to docker exec
    (tmp_path / "proc" / "7" / "cgroup").write_text("0::/system.slice/docker-other.scope\n")
    assert passes("test", "-d", "/w/src") is None  # the pid is another container's now: not from here


# ------------------------------------------------------------------------------------- readiness's use

T = Timeouts(compose_up=100, recipe=40, teardown=50, command=9)
HC = {"Test": ["CMD", "pg_isready", "-h", "127.0.0.1"], "Timeout": 3_000_000_000}


class _Answers:
    """A host probe whose answers are scripted."""

    def __init__(self, answers: list[bool | None]) -> None:
        self.answers = answers

    def passes(self) -> bool | None:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _one_db(fake: FakeRunner, monkeypatch: pytest.MonkeyPatch, answers: list[bool | None]) -> ComposeProject:
    info = {"Id": "id-db", "Name": "/p-db-1", "Config": {"Labels": {"com.docker.compose.service": "db"}}}
    info["Config"]["Healthcheck"] = HC
    fake.expect("docker", "ps", "--all", stdout="id-db")
    fake.expect("docker", "inspect", ANY, stdout=json.dumps([info]), times=1)
    fake.expect("docker", "inspect", "--format", "{{json .State}}", "id-db", stdout='{"Status": "running"}')
    fake.expect("docker", "start")
    probe = _Answers(answers)
    monkeypatch.setattr(hostprobe.HostProbe, "of", classmethod(lambda cls, cid, argv, timeout: probe))
    return ComposeProject("p", (Path("/x/compose.yaml"),), fake, T)


def _execs(fake: FakeRunner) -> int:
    return sum(1 for c in fake.calls if c.argv[1] == "exec")


def test_a_host_pass_is_ready_without_an_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRunner()
    compose = _one_db(fake, monkeypatch, [False, False, True])
    start(compose, ResolvedConfig.of({"services": {}}).services, ["db"])
    assert _execs(fake) == 0


def test_while_the_host_says_no_the_real_healthcheck_still_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readiness, "HOSTPROBE_EXEC_EVERY", 0.0)
    fake = FakeRunner()
    compose = _one_db(fake, monkeypatch, [False])  # the host never passes
    fake.expect("docker", "exec", "id-db", "pg_isready", ANY, ANY, rc=1, times=2)
    fake.expect("docker", "exec", "id-db", "pg_isready", ANY, ANY, rc=0)
    start(compose, ResolvedConfig.of({"services": {}}).services, ["db"])
    assert _execs(fake) == 3  # ready by the real one


def test_a_timeout_says_what_the_real_healthcheck_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readiness, "HOSTPROBE_EXEC_EVERY", 0.0)
    fake = FakeRunner()
    compose = _one_db(fake, monkeypatch, [False])
    said = "127.0.0.1:5432 - no response"
    fake.expect("docker", "exec", "id-db", "pg_isready", ANY, ANY, rc=2, stdout=said)
    with pytest.raises(NotReady, match=re.escape(f"its healthcheck said: {said}")):
        start(compose, ResolvedConfig.of({"services": {}}).services, ["db"], timeout=0.3)


def test_a_host_that_cannot_answer_hands_back_to_exec_every_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readiness, "HOSTPROBE_EXEC_EVERY", 1e9)  # would hold every exec back
    fake = FakeRunner()
    compose = _one_db(fake, monkeypatch, [False, None])
    fake.expect("docker", "exec", "id-db", "pg_isready", ANY, ANY, rc=1, times=2)
    fake.expect("docker", "exec", "id-db", "pg_isready", ANY, ANY, rc=0)
    start(compose, ResolvedConfig.of({"services": {}}).services, ["db"])
    assert _execs(fake) == 3
