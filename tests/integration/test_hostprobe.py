"""forgelib.docker.hostprobe against the real engine: for every recognised healthcheck form, the host's
answer and the real command's (``docker exec`` of the same argv) AGREE, before the service is ready and
after. "Before" is held, not raced: each server waits for a file the test creates (postgres's and
MariaDB's in their entrypoint's initialisation, where the temporary server listens on its unix socket
only), so both answers are taken in one known state."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from forgelib.docker import argv as dk
from forgelib.docker import hostprobe
from forgelib.docker import labels as lab
from forgelib.kinds import registry  # noqa: F401 - registers the kinds' forms
from forgelib.runner import SubprocessRunner

pytestmark = pytest.mark.integration

HOLD = "while [ ! -e /tmp/go ]; do sleep 0.1; done"  # until the test says go
# A server answering 200 on /ok and 500 elsewhere, once the test says go.
HTTP = (
    "import http.server as h\n"
    "class H(h.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        code = 200 if self.path == '/ok' else 500\n"
    "        self.send_response(code); self.send_header('Content-Length', '2'); self.end_headers()\n"
    "        self.wfile.write(b'hi')\n"
    "h.HTTPServer(('0.0.0.0', 8000), H).serve_forever()\n"
)


@pytest.fixture
def run(runner: SubprocessRunner, run_id: str) -> Iterator[Callable[..., str]]:
    """Start a labelled ``--rm`` container (its image, entrypoint, command); all removed afterwards."""
    started: list[str] = []

    def start(image: str, *command: str, entrypoint: str | None = None, env: Sequence[str] = ()) -> str:
        argv = dk.run(
            image,
            command,
            detach=True,
            rm=True,
            label=f"{lab.RUN}={run_id}",
            entrypoint=entrypoint,
            env=list(env),
        )
        cid = runner.run(argv, timeout=120).stdout.strip()
        started.append(cid)
        return cid

    yield start
    if started:
        runner.run(dk.rm(started, force=True, volumes=True), timeout=120, check=False)  # and their VOLUMEs


def _go(runner: SubprocessRunner, cid: str) -> None:
    runner.run(dk.exec(cid, ["touch", "/tmp/go"]), timeout=60)


def _real(runner: SubprocessRunner, cid: str, argv: Sequence[str]) -> bool:
    return runner.run(dk.exec(cid, list(argv)), timeout=60, check=False).rc == 0


def _host(cid: str, argv: Sequence[str]) -> bool:
    probe = hostprobe.HostProbe.of(cid, argv, 10.0)
    assert probe is not None, f"not probed from the host: {argv}"
    answer = probe.passes()
    assert answer is not None, f"the host could not answer {argv}"
    return answer


def _agree_not_ready(runner: SubprocessRunner, cid: str, argv: Sequence[str]) -> None:
    assert (_host(cid, argv), _real(runner, cid, argv)) == (False, False), argv


def _agree_ready(runner: SubprocessRunner, cid: str, argv: Sequence[str]) -> None:
    """Once the real command passes (bounded wait: a server's start on a busy engine), the host's
    answer passes too; and the host's pass is the real one's (a service never gets unready here)."""
    deadline = time.monotonic() + 180
    while not _real(runner, cid, argv):
        assert time.monotonic() < deadline, f"{argv} never passed in the container"
        time.sleep(0.2)
    assert _host(cid, argv), argv
    assert _real(runner, cid, argv), argv


def _agree_fails(runner: SubprocessRunner, cid: str, argv: Sequence[str]) -> None:
    assert (_host(cid, argv), _real(runner, cid, argv)) == (False, False), argv


def _agree_held_then_ready(
    runner: SubprocessRunner, cid: str, sock: Sequence[str], forms: Sequence[Sequence[str]]
) -> None:
    """A server held in its image entrypoint's init (its temporary server up on the unix socket ``sock``,
    which no host form reaches): every TCP form says not ready both ways; released, ready both ways."""
    assert hostprobe.recognise(sock) is None
    deadline = time.monotonic() + 180
    while not _real(runner, cid, sock):
        assert time.monotonic() < deadline, f"the temporary server never answered {sock[0]}"
        time.sleep(0.2)
    for argv in forms:
        _agree_not_ready(runner, cid, argv)
    _go(runner, cid)
    for argv in forms:
        _agree_ready(runner, cid, argv)


def test_pg_isready_agrees_during_init_and_after(runner: SubprocessRunner, run: Callable[..., str]) -> None:
    hold = (
        f"printf '%s\\n' '{HOLD}' > /docker-entrypoint-initdb.d/hold.sh && exec docker-entrypoint.sh postgres"
    )
    cid = run("forgelib/postgres:15", "-c", hold, entrypoint="sh", env=["POSTGRES_HOST_AUTH_METHOD=trust"])
    forms = [
        ["pg_isready", "-h", "127.0.0.1", "-U", "postgres"],
        ["pg_isready", "-h", "localhost", "-p", "5432", "-U", "app", "-d", "app", "-q", "-t", "3"],
    ]
    sock = ["pg_isready", "-U", "postgres"]  # the unix socket: the temporary server answers there
    _agree_held_then_ready(runner, cid, sock, forms)


def test_curl_agrees_on_refused_500_and_200(runner: SubprocessRunner, run: Callable[..., str]) -> None:
    cid = run("forgelib/python:3.11", "-c", f'{HOLD}; exec python3 -c "$0"', HTTP, entrypoint="sh")
    ok = ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8000/ok"]
    bad = ["curl", "--fail", "--silent", "http://localhost:8000/healthz"]
    lenient = ["curl", "-s", "-o", "/dev/null", "http://127.0.0.1:8000/healthz"]  # no -f: a 500 passes
    for argv in (ok, bad, lenient):
        _agree_not_ready(runner, cid, argv)  # nothing listens yet
    _go(runner, cid)
    _agree_ready(runner, cid, ok)
    _agree_fails(runner, cid, bad)
    _agree_ready(runner, cid, lenient)


def test_redis_cli_agrees(runner: SubprocessRunner, run: Callable[..., str]) -> None:
    cid = run("forgelib/redis:7.0", "-c", f"{HOLD}; exec redis-server", entrypoint="sh")
    forms = [["redis-cli", "PING"], ["redis-cli", "-h", "127.0.0.1", "-p", "6379", "ping"]]
    forms.append(["/bin/sh", "-c", "redis-cli ping | grep -q PONG"])
    for argv in forms:
        _agree_not_ready(runner, cid, argv)
    _go(runner, cid)
    for argv in forms:
        _agree_ready(runner, cid, argv)


def test_mariadb_admin_ping_agrees_during_init_and_after(
    runner: SubprocessRunner, run: Callable[..., str]
) -> None:
    hold = (
        f"printf '%s\\n' '{HOLD}' > /docker-entrypoint-initdb.d/hold.sh && exec docker-entrypoint.sh mariadbd"
    )
    env = ["MARIADB_ROOT_PASSWORD=root", "MARIADB_DATABASE=app"]
    cid = run("forgelib/mariadb:10.11", "-c", hold, entrypoint="sh", env=env)
    forms = [
        ["mariadb-admin", "ping", "-h", "127.0.0.1", "-uroot", "-proot"],
        ["mysqladmin", "ping", "-h", "127.0.0.1", "-P", "3306"],  # no login: alive all the same
    ]
    # the temporary server's unix socket (the stand-in image's name for it)
    sock = ["mariadb-admin", "ping", "--socket=/run/mysqld/forge-init.sock", "-uroot", "-proot"]
    _agree_held_then_ready(runner, cid, sock, forms)


def test_test_agrees_on_paths(runner: SubprocessRunner, run: Callable[..., str]) -> None:
    cid = run(
        "forgelib/python:3.11",
        "-c",
        "mkdir -p /work/src && ln -s /work /w && sleep infinity",
        entrypoint="sh",
    )
    _agree_ready(runner, cid, ["test", "-d", "/work/src"])
    _agree_ready(runner, cid, ["test", "-d", "/w/src"])  # an absolute link, followed in the container's root
    _agree_ready(runner, cid, ["test", "-d", "/bin"])  # a relative link (merged /usr)
    _agree_ready(runner, cid, ["test", "-f", "/etc/hostname"])
    _agree_ready(runner, cid, ["test", "-e", "/work/../work/src"])
    _agree_fails(runner, cid, ["test", "-d", "/nope"])
    _agree_fails(runner, cid, ["test", "-f", "/work/src"])
    _agree_fails(runner, cid, ["test", "-d", "/etc/hostname/x"])
