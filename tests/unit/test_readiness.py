"""forgelib.docker.readiness without an engine: the healthcheck argv, the order containers are started in for
each ``depends_on`` condition, and how a container that exits or that Docker finds unhealthy fails. (That it
brings real stacks up: tests/integration/test_provision.py and every provisioning test on the engine.)"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from forgelib.docker import hostprobe, listening, readiness
from forgelib.docker.compose import ComposeProject
from forgelib.docker.readiness import NotReady, health_argv, start
from forgelib.docker.resolved import ResolvedConfig, ServiceConfig
from forgelib.errors import CommandError
from forgelib.spec.models import Timeouts
from forgelib.testing import ANY, FakeRunner

T = Timeouts(compose_up=100, recipe=40, teardown=50, command=9)
HC = {"Test": ["CMD", "check"], "Timeout": 3_000_000_000}


def test_health_argv_is_what_docker_would_run() -> None:
    assert health_argv({"Config": {"Healthcheck": {**HC, "Test": ["CMD", "test", "-d", "/w"]}}}) == (
        ["test", "-d", "/w"],
        3.0,
    )
    shell = health_argv({"Config": {"Healthcheck": {"Test": ["CMD-SHELL", "curl -f x || exit 1"]}}})
    assert shell == (["/bin/sh", "-c", "curl -f x || exit 1"], 30.0)
    assert health_argv({"Config": {"Healthcheck": {"Test": ["NONE"]}}})[0] is None
    assert health_argv({"Config": {}})[0] is None


def _stack(fake: FakeRunner, services: dict[str, dict[str, Any] | None]) -> ComposeProject:
    """``services``: name -> its healthcheck (None: none); one container each, id ``id-<name>``."""
    infos = [
        {
            "Id": f"id-{n}",
            "Name": f"/p-{n}-1",
            "Config": {"Labels": {"com.docker.compose.service": n}, **({"Healthcheck": hc} if hc else {})},
        }
        for n, hc in services.items()
    ]
    fake.expect("docker", "ps", "--all", stdout="\n".join(f"id-{n}" for n in services))
    fake.expect("docker", "inspect", ANY, stdout=json.dumps(infos), times=1)  # containers(), first
    return ComposeProject("p", (Path("/x/compose.yaml"),), fake, T)


def _state(fake: FakeRunner, cid: str, times: int | None = None, **state: Any) -> None:
    fake.expect(
        "docker", "inspect", "--format", "{{json .State}}", cid, stdout=json.dumps(state), times=times
    )


def _order(fake: FakeRunner) -> list[str]:
    """What was started and probed, in order: ``start <svc>`` / ``probe <svc>``."""
    out = []
    for c in fake.calls:
        if c.argv[:2] == ("docker", "start"):
            out.append("start " + c.argv[2].removeprefix("id-"))
        elif c.argv[:2] == ("docker", "exec"):
            out.append("probe " + c.argv[2].removeprefix("id-"))
    return out


def _services(raw: dict[str, Any]) -> Mapping[str, ServiceConfig]:
    """The resolved config's services, typed, as ``start`` takes them."""
    return ResolvedConfig.of({"services": raw}).services


def test_a_dependent_starts_once_the_dependency_is_healthy_by_its_own_check() -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"db": HC, "api": None})
    _state(fake, "id-db", Status="running", Health={"Status": "starting"})  # Docker's tick is not there yet
    _state(fake, "id-api", Status="running")
    fake.expect("docker", "exec", "id-db", "check", rc=1, times=2)  # not yet, not yet...
    fake.expect("docker", "exec", "id-db", "check", rc=0)  # ...ready
    fake.expect("docker", "start")
    deps = {"api": {"depends_on": {"db": {"condition": "service_healthy"}}}}
    start(compose, _services(deps), ["db", "api"])
    assert _order(fake) == ["start db", "probe db", "probe db", "probe db", "start api"]
    assert {c.tag for c in fake.calls if c.argv[1] in ("start", "exec")} == {"start", "exec"}


def test_service_started_does_not_wait_for_health_and_completed_waits_for_exit_0() -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"db": HC, "migrate": None, "api": None, "side": None})
    _state(fake, "id-db", Status="running")
    _state(fake, "id-migrate", times=1, Status="running")
    _state(fake, "id-migrate", Status="exited", ExitCode=0)
    _state(fake, "id-api", Status="running")
    _state(fake, "id-side", Status="running")
    fake.expect("docker", "exec", "id-db", "check", rc=0)
    fake.expect("docker", "start")
    deps = {
        "side": {"depends_on": {"db": {"condition": "service_started"}}},
        "api": {"depends_on": {"migrate": {"condition": "service_completed_successfully"}}},
    }
    start(compose, _services(deps), ["db", "migrate", "api", "side"])
    order = _order(fake)
    assert order.index("start side") > order.index("start db")
    # api only after migrate was seen exited (its second state read), never while it still ran
    reads = [i for i, c in enumerate(fake.calls) if c.argv[2] == "--format" and c.argv[-1] == "id-migrate"]
    api_start = next(i for i, c in enumerate(fake.calls) if c.argv[:3] == ("docker", "start", "id-api"))
    assert len(reads) == 2 and reads[1] < api_start


@pytest.mark.parametrize(
    "implicit",
    [{"network_mode": "service:db"}, {"volumes_from": ["db:ro"]}, {"links": ["db:database"]}],
)
def test_what_compose_orders_by_implicitly_starts_first(implicit: dict[str, Any]) -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"db": None, "api": None})
    _state(fake, "id-db", Status="running")
    _state(fake, "id-api", Status="running")
    fake.expect("docker", "start")
    start(compose, _services({"api": implicit}), ["api", "db"])
    assert _order(fake) == ["start db", "start api"]


@pytest.mark.parametrize(
    ("state", "said"),
    [
        (
            {"Status": "running", "Health": {"Status": "unhealthy"}},
            "service 'db' container p-db-1 is unhealthy",
        ),
        ({"Status": "exited", "ExitCode": 3}, "service 'db' container p-db-1 exited (3)"),
    ],
)
def test_a_failing_dependency_fails_fast_and_its_dependents_never_start(
    state: dict[str, Any], said: str
) -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"db": HC, "api": None})
    _state(fake, "id-db", **state)
    fake.expect("docker", "exec", "id-db", "check", rc=1)
    fake.expect("docker", "start")
    with pytest.raises(NotReady) as err:
        start(
            compose,
            _services({"api": {"depends_on": {"db": {"condition": "service_healthy"}}}}),
            ["db", "api"],
        )
    assert err.value.service == "db"
    assert str(err.value).startswith(said)
    assert "start api" not in _order(fake)


def test_on_ready_runs_as_each_service_is_ready_beside_its_dependents_start() -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"db": HC, "api": None})
    _state(fake, "id-db", Status="running")
    _state(fake, "id-api", Status="running")
    fake.expect("docker", "exec", "id-db", "check", rc=0)
    fake.expect("docker", "start")
    seen: list[tuple[str, int]] = []  # (service, how many calls the runner had made by then)
    deps = {"api": {"depends_on": {"db": {"condition": "service_healthy"}}}}
    start(compose, _services(deps), ["db", "api"], on_ready=lambda svc: seen.append((svc, len(fake.calls))))
    assert sorted(s for s, _ in seen) == ["api", "db"]
    db_ready = dict(seen)["db"]
    probe_db = next(i for i, c in enumerate(fake.calls) if c.argv[:3] == ("docker", "exec", "id-db"))
    assert db_ready > probe_db  # only once its own check passed


def test_what_on_ready_raises_is_what_the_start_raises() -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"db": None, "api": None})
    _state(fake, "id-db", Status="running")
    _state(fake, "id-api", Status="running")
    fake.expect("docker", "start")

    def check(svc: str) -> None:
        if svc == "db":
            raise RuntimeError("db is not at its golden")

    deps = {"api": {"depends_on": {"db": {"condition": "service_healthy"}}}}
    with pytest.raises(RuntimeError, match="not at its golden"):
        start(compose, _services(deps), ["db", "api"], on_ready=check)


def test_what_others_wait_for_starts_before_what_nothing_waits_for() -> None:
    # runner waits for nothing and nothing waits for it: its start waits until db's (which api waits
    # for) returned, so that db's start has the engine alone; api still waits for db's health.
    fake = FakeRunner()
    compose = _stack(fake, {"runner": None, "db": HC, "api": None})
    for svc in ("runner", "db", "api"):
        _state(fake, f"id-{svc}", Status="running")
    fake.expect("docker", "exec", "id-db", "check", rc=0)
    runner_started = threading.Event()
    starts: list[str] = []  # each start as it returns (the fake's side effect runs right before)

    def db_start(_call: Any) -> None:
        runner_started.wait(0.2)  # were runner started beside db, it would be seen before db returned
        starts.append("db")

    def runner_start(_call: Any) -> None:
        runner_started.set()
        starts.append("runner")

    fake.expect("docker", "start", "id-db", side_effect=db_start)
    fake.expect("docker", "start", "id-runner", side_effect=runner_start)
    fake.expect("docker", "start", "id-api", side_effect=lambda _: starts.append("api"))
    deps = {"api": {"depends_on": {"db": {"condition": "service_healthy"}}}}
    start(compose, _services(deps), ["runner", "db", "api"])
    assert starts.index("db") < starts.index("runner")
    order = _order(fake)
    assert order.index("probe db") < order.index("start api")


def test_services_nobody_waits_for_start_together() -> None:
    # api's dependency is up already (not among the services started): both are started at once, as
    # in a fresh stack's second phase; api's start returns only once runner's was called beside it.
    fake = FakeRunner()
    compose = _stack(fake, {"api": None, "runner": None})
    _state(fake, "id-api", Status="running")
    _state(fake, "id-runner", Status="running")
    runner_started = threading.Event()
    beside: list[bool] = []
    fake.expect("docker", "start", "id-api", side_effect=lambda _: beside.append(runner_started.wait(30)))
    fake.expect("docker", "start", "id-runner", side_effect=lambda _: runner_started.set())
    deps = {"api": {"depends_on": {"db": {"condition": "service_healthy"}}}}
    start(compose, _services(deps), ["api", "runner"])
    assert beside == [True]


def test_what_nothing_waits_for_is_not_started_when_a_head_cannot_start() -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"runner": None, "db": HC, "api": None})
    fake.expect("docker", "start", "id-db", rc=1, stderr="Error response from daemon: no such image")
    deps = {"api": {"depends_on": {"db": {"condition": "service_healthy"}}}}
    with pytest.raises(CommandError, match="no such image"):
        start(compose, _services(deps), ["runner", "db", "api"])
    assert _order(fake) == ["start db"]


# -- the gate before the healthcheck: whether the container listens yet (forgelib.docker.listening) --------

TCP_HEAD = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
)
DNS = "   0: 0B00007F:AB87 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0  0 27966605 1\n"
CONNECTED = "   1: 0100007F:9526 0100007F:18EB 01 00000000:00000000 00:00000000 00000000  0  0 27966606 1\n"
SERVER = "   2: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0  0 27966607 1\n"
UNIX_HEAD = "Num       RefCount Protocol Flags    Type St Inode Path\n"
UNIX_PEER = "00000000946a612d: 00000003 00000000 00000000 0001 03 27671452\n"
UNIX_SERVER = "00000000db6d1fff: 00000002 00000000 00010000 0001 01 27671440 /run/s.sock\n"
PID, CID = 4242, "id-db"


def _proc(root: Path, *, cgroup: str = f"12:cpu:/docker/{CID}\n", tcp: str = DNS + CONNECTED) -> Path:
    """A host /proc with process PID in container CID's cgroup, listening on nothing of its own yet."""
    net = root / str(PID) / "net"
    net.mkdir(parents=True)
    (root / str(PID) / "cgroup").write_text(cgroup)
    _tables(net, tcp=TCP_HEAD + tcp, tcp6=TCP_HEAD)
    (net / "unix").write_text(UNIX_HEAD + UNIX_PEER)
    return net


def _tables(net: Path, *, tcp: str, tcp6: str) -> None:
    """The TCP tables and, as the kernel keeps them, the namespace's counts of their sockets."""
    (net / "tcp").write_text(tcp)
    (net / "tcp6").write_text(tcp6)
    n, n6 = len(tcp.splitlines()) - 1, len(tcp6.splitlines()) - 1
    (net / "sockstat").write_text(
        f"sockets: used 9\nTCP: inuse {n} orphan 0 tw 0 alloc 9 mem 0\nUDP: inuse 1\n"
    )
    (net / "sockstat6").write_text(f"TCP6: inuse {n6}\nUDP6: inuse 0\n")


def test_listening_counts_tcp_and_unix_servers_but_not_dockers_resolver(tmp_path: Path) -> None:
    net = _proc(tmp_path)
    sockets = listening.Sockets(net)
    assert sockets.listening() is False  # 127.0.0.11's resolver and a connection: nothing of its own
    _tables(net, tcp=TCP_HEAD + DNS + CONNECTED, tcp6=TCP_HEAD + SERVER)
    assert sockets.listening() is True
    _tables(net, tcp=TCP_HEAD + DNS + CONNECTED, tcp6=TCP_HEAD)
    assert sockets.listening() is False
    (net / "unix").write_text(UNIX_HEAD + UNIX_PEER + UNIX_SERVER)
    assert sockets.listening() is True
    (net / "unix").write_text(UNIX_HEAD + UNIX_PEER)
    (net / "tcp").write_text(TCP_HEAD + DNS + SERVER)  # the counts as they were: the table is not read
    assert sockets.listening() is False
    (net / "sockstat").unlink()  # without the counters, the table every time
    assert sockets.listening() is True
    (net / "tcp6").unlink()  # a kernel without IPv6: the rest still counts
    (net / "sockstat6").unlink()
    assert sockets.listening() is True
    shutil.rmtree(tmp_path / str(PID))  # the process ended
    assert sockets.listening() is None


@pytest.mark.parametrize(
    ("env", "cgroup", "pid"),
    [
        ({"DOCKER_HOST": "tcp://engine.example:2376"}, None, PID),  # a remote engine's pid is not ours
        ({"DOCKER_CONTEXT": "remote"}, None, PID),
        ({}, None, PID + 1),  # no such process here: another pid namespace
        ({}, "12:cpu:/docker/someone-else\n", PID),  # a process, but not the container's
        ({}, None, 0),  # not running
    ],
)
def test_sockets_are_read_only_from_the_containers_own_local_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], cgroup: str | None, pid: int
) -> None:
    _proc(tmp_path, **({"cgroup": cgroup} if cgroup else {}))
    for k in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        monkeypatch.delenv(k, raising=False)
    if cgroup is None:
        assert listening.Sockets.of(PID, CID, proc=tmp_path) is not None  # the same tree, locally: readable
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if env or cgroup or pid != PID:
        assert listening.Sockets.of(pid, CID, proc=tmp_path) is None
    assert listening.local_engine({"DOCKER_HOST": "unix:///var/run/docker.sock"})
    config = tmp_path / "docker-config"  # the CLI's own context choice: another engine, not this host's
    config.mkdir()
    (config / "config.json").write_text('{"currentContext": "remote"}')
    assert not listening.local_engine({"DOCKER_CONFIG": str(config)})


def _gated(fake: FakeRunner, monkeypatch: pytest.MonkeyPatch, root: Path, on_read: Any) -> None:
    """db's state (running, Docker's own check not there yet, main process PID), read every tick;
    ``on_read(n)`` runs at the n-th read. Between two healthcheck runs without a listener: forever."""
    monkeypatch.setattr(listening, "PROC", root)
    monkeypatch.setattr(readiness, "UNHEARD_EVERY", 1e9)
    monkeypatch.setattr(readiness, "GATED_STATE_EVERY", 0.0)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    reads = iter(range(1, 1000))
    state = {"Status": "running", "Pid": PID, "Health": {"Status": "starting"}}
    fake.expect(
        "docker", "inspect", "--format", "{{json .State}}", CID,
        stdout=json.dumps(state), side_effect=lambda _call: on_read(next(reads)),
    )  # fmt: skip


def _execs_and_reads(fake: FakeRunner) -> list[str]:
    return [
        "exec" if c.argv[1] == "exec" else "read"
        for c in fake.calls
        if c.argv[1] == "exec" or (c.argv[-1] == CID and c.argv[2] == "--format")
    ]


def _listening_at_the_third_look(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    """``start`` of one gated service whose server listens from the third look at its sockets on, its
    healthcheck failing once, then passing: the calls made."""
    net = _proc(tmp_path)

    def on_read(n: int) -> None:
        if n == 3:  # the server is up at the third look
            _tables(net, tcp=TCP_HEAD + DNS + CONNECTED + SERVER, tcp6=TCP_HEAD)

    fake = FakeRunner()
    compose = _stack(fake, {"db": HC})
    _gated(fake, monkeypatch, tmp_path, on_read)
    fake.expect("docker", "exec", CID, "check", rc=1, times=1)  # the first run, at once: not yet
    fake.expect("docker", "exec", CID, "check", rc=0)
    fake.expect("docker", "start")
    start(compose, _services({}), ["db"])
    return fake


def test_the_healthcheck_waits_for_a_listener_then_runs_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _listening_at_the_third_look(tmp_path, monkeypatch)
    # the first run; the state (its pid); no run while nothing listens (reads 2, 3: the server is up at
    # the third, after that tick's look at the sockets); the run at the next tick
    assert _execs_and_reads(fake) == ["exec", "read", "read", "read", "read", "exec"]


def test_without_the_containers_sockets_every_tick_runs_the_healthcheck(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _proc(tmp_path, cgroup="12:cpu:/docker/another-container\n")  # the pid is not the container's
    fake = FakeRunner()
    compose = _stack(fake, {"db": HC})
    _gated(fake, monkeypatch, tmp_path, lambda n: None)
    fake.expect("docker", "exec", CID, "check", rc=1, times=3)
    fake.expect("docker", "exec", CID, "check", rc=0)
    fake.expect("docker", "start")
    start(compose, _services({}), ["db"])
    assert _execs_and_reads(fake).count("exec") == 4  # as before the gate: no wait between runs


def test_a_gone_main_process_drops_the_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _proc(tmp_path)

    def on_read(n: int) -> None:
        if n == 2:  # restarted under another pid, say: what was read is gone
            shutil.rmtree(tmp_path / str(PID))

    fake = FakeRunner()
    compose = _stack(fake, {"db": HC})
    _gated(fake, monkeypatch, tmp_path, on_read)
    fake.expect("docker", "exec", CID, "check", rc=1, times=1)
    fake.expect("docker", "exec", CID, "check", rc=0)
    fake.expect("docker", "start")
    start(compose, _services({}), ["db"])
    # the first run; pid; gone (the state read at once, the gate dropped); the run, every tick again
    assert _execs_and_reads(fake) == ["exec", "read", "read", "read", "exec"]


def test_a_servers_first_run_waits_for_its_listener_without_dockers_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    net = _proc(tmp_path)
    (tmp_path / str(PID) / "status").write_text(f"Name:\tdb\nNSpid:\t{PID}\t1\n")
    procs = tmp_path / "cgroup" / "pids" / "docker" / CID
    procs.mkdir(parents=True)
    (procs / "cgroup.procs").write_text(f"{PID}\n")
    monkeypatch.setattr(listening, "CGROUP", tmp_path / "cgroup")
    _gated(fake := FakeRunner(), monkeypatch, tmp_path, lambda n: None)
    monkeypatch.setattr(readiness, "GATED_STATE_EVERY", 1e9)
    looks = iter(range(1, 1000))
    listens = listening.Sockets.listening

    def look(self: listening.Sockets) -> bool | None:
        if next(looks) == 3:  # the server is up at the third look at its sockets
            _tables(net, tcp=TCP_HEAD + DNS + CONNECTED + SERVER, tcp6=TCP_HEAD)
        return listens(self)

    monkeypatch.setattr(listening.Sockets, "listening", look)
    seen: list[int] = []
    fake.expect("docker", "exec", CID, "check", side_effect=lambda _call: seen.append(next(looks)))
    # a server: it exposes a port (its image or its compose service)
    info = {"Id": CID, "Name": "/p-db-1", "Config": {"Healthcheck": HC, "ExposedPorts": {"5432/tcp": {}}}}
    info["Config"]["Labels"] = {"com.docker.compose.service": "db"}
    fake.expect("docker", "ps", "--all", stdout=CID)
    fake.expect("docker", "inspect", ANY, stdout=json.dumps([info]), times=1)
    fake.expect("docker", "start")
    start(ComposeProject("p", (Path("/x/compose.yaml"),), fake, T), _services({}), ["db"])
    # one run, once something listened; Docker's state never read (the main process from the cgroup)
    assert _execs_and_reads(fake) == ["exec"] and seen[0] > 3


def test_a_container_that_listens_on_nothing_is_probed_every_so_often() -> None:
    every = readiness.UNHEARD_EVERY
    assert readiness.unheard_pause(0.0) == every
    assert readiness.unheard_pause(every + 1) == every + 1  # a run that took long waits as long again


def test_while_the_host_probe_says_no_the_real_run_waits_longer_for_a_listener(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Never:  # a host probe that never passes: the real healthcheck decides
        def passes(self) -> bool:
            return False

    monkeypatch.setattr(hostprobe.HostProbe, "of", classmethod(lambda cls, cid, argv, timeout: Never()))
    monkeypatch.setattr(readiness, "HOSTPROBE_EXEC_EVERY", 0.0)
    monkeypatch.setattr(readiness, "HOSTPROBE_DEAF_EVERY", 1e9)
    fake = _listening_at_the_third_look(tmp_path, monkeypatch)
    # the first run; no run while nothing listens (the deaf pause); the run once the server is up
    assert _execs_and_reads(fake) == ["exec", "read", "read", "read", "read", "exec"]
