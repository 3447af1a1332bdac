"""A real one-machine Ray cluster for the cluster tests: a head and two worker nodes (separate process
trees, every Ray process bound to 127.0.0.1), one node per Docker engine — the machine's engine and a
second dockerd started here with its own socket, data root, exec root, pidfile, its own bridge (not none:
a daemon started with `--bridge none` deletes the host's docker0, breaking the machine engine's default
network until it restarts) and its own address pool, with the stand-in images moved across by
``docker save | docker load``.

The second dockerd runs with ``--iptables=false``: a daemon that manages iptables removes and recreates the
DOCKER chains at start, wiping the machine engine's rules (its published ports and network isolation stop
working). Published ports still work without iptables (docker-proxy on 127.0.0.1); only traffic between
the second engine's containers needs a rule, because bridged traffic crosses FORWARD (br_netfilter) whose
policy the machine engine sets to DROP: one ACCEPT for the second engine's own pool, in DOCKER-USER (the
chain Docker leaves to the administrator and never flushes), removed again when the engine stops.

Everything started here is stopped here, by pid, even when a test fails; the main engine is only read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT = 180.0  # seconds a daemon or node may take to answer on a loaded 2-core box
SUBNET = "10.213.0.0/16"  # scripts/engine.sh gives the main engine 10.200.0.0/17
POOL = f"base={SUBNET},size=24"
# Containers of the second engine may talk to each other (and only to each other).
FORWARD_RULE = ["DOCKER-USER", "-s", SUBNET, "-d", SUBNET, "-j", "ACCEPT"]
# The second engine's default bridge: made here, because dockerd creates only docker0 itself.
BRIDGE, BRIDGE_ADDR = "forge-br2", "10.212.255.1/24"
# The bridge, the pool and the FORWARD rule are the machine's: one second engine at a time holds this lock,
# a listening abstract Unix socket (no file to leave behind; the kernel frees the name with its process, so
# a killed session's leftovers are then safe to remove).
LOCK = "forge-second-engine"


def wait_for(
    what: str,
    ready: Callable[[], bool],
    proc: subprocess.Popen[bytes] | None = None,
    timeout: float = START_TIMEOUT,
    log: Path | None = None,
) -> None:
    """Poll ``ready`` until it holds; fail early (with the log) when ``proc`` exits instead."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what} exited (rc={proc.returncode}) before it was ready{_tail(log)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not ready after {timeout:.0f}s{_tail(log)}")
        time.sleep(0.2)


def _tail(log: Path | None) -> str:
    if log is None or not log.is_file():
        return ""
    return "\n--- " + str(log) + "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:])


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Ray's workers start their own sessions, so groups miss them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(*procs: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM each of ``procs`` and everything below them (all at once, so their graceful stops overlap),
    then SIGKILL what is left after ``grace`` seconds.

    Each process is known by its pid *and* its start time: a pid whose process ended is soon another
    process's (pids wrap quickly on a machine starting containers all day): a SIGKILL sent to the number
    alone, after the grace, can kill whatever was just given it (an engine's hook, another test's child)."""
    pids = [p for proc in procs for p in (proc.pid, *descendants(proc.pid))]
    known = [(p, start) for p in pids if (start := _started(p))]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p, start in known:
            if _started(p) == start:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _any_alive(known):
            for proc in procs:  # reap our own children so they stop counting as alive
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.2 / len(procs))
        if not _any_alive(known):
            break
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _started(pid: int) -> str | None:
    """The process's start time (field 22 of its stat), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def _any_alive(known: list[tuple[int, str]]) -> bool:
    return any(_alive(p) and _started(p) == start for p, start in known)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@dataclass
class Engine:
    host: str  # DOCKER_HOST value
    dir: Path | None = None  # a second engine's state; None: the machine's engine (never touched)
    proc: subprocess.Popen[bytes] | None = None
    forward_rule: bool = False  # FORWARD_RULE inserted for this engine
    bridge: bool = False  # BRIDGE created for this engine
    lock: socket.socket | None = None  # LOCK, while this engine holds it

    def docker(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        env = {**os.environ, "DOCKER_HOST": self.host}
        r = subprocess.run(
            ["docker", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} on {self.host}: rc={r.returncode}\n{r.stderr}")
        return r.stdout

    def answers(self) -> bool:
        env = {**os.environ, "DOCKER_HOST": self.host}
        argv = ["docker", "version", "--format", "{{.Server.Version}}"]
        return subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False).returncode == 0


def main_engine() -> Engine:
    return Engine(os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock")


def new_engine() -> Engine:
    """A second engine's address and state directory, before it runs (so Ray nodes can start meanwhile)."""
    d = Path(tempfile.mkdtemp(prefix="forge-eng-", dir="/var/tmp"))
    return Engine(f"unix://{d}/docker.sock", d)


def start_engine(images: list[str], eng: Engine | None = None) -> Engine:
    """A second dockerd beside the machine's, with ``images`` loaded from the machine's engine."""
    eng = eng or new_engine()
    assert eng.dir is not None
    d = eng.dir
    log = d / "dockerd.log"
    try:
        eng.lock = _lock(LOCK)
        _iptables("-I", *FORWARD_RULE)
        eng.forward_rule = True
        _ip("link", "del", BRIDGE, check=False)  # a killed run's
        _ip("link", "add", BRIDGE, "type", "bridge")
        eng.bridge = True
        _ip("addr", "add", BRIDGE_ADDR, "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        with open(log, "wb") as out:
            eng.proc = subprocess.Popen(
                ["dockerd", "--data-root", str(d / "root"), "--exec-root", str(d / "exec"),
                 "--pidfile", str(d / "docker.pid"), "-H", eng.host, "--bridge", BRIDGE,
                 "--iptables=false", "--ip-masq=false", "--default-address-pool", POOL],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        wait_for("second dockerd", eng.answers, eng.proc, log=log)
        save = subprocess.Popen(["docker", "save", *images], stdout=subprocess.PIPE)
        assert save.stdout is not None
        load = subprocess.run(["docker", "-H", eng.host, "load"], stdin=save.stdout, capture_output=True,
                              timeout=600, check=False)  # fmt: skip
        save.stdout.close()
        assert save.wait(timeout=600) == 0 and load.returncode == 0, load.stderr.decode()
    except BaseException:
        stop_engine(eng)
        raise
    return eng


def _lock(name: str, timeout: float = START_TIMEOUT) -> socket.socket:
    """The machine-wide lock ``name`` for this process: waits for another session's second engine to stop,
    then fails naming it rather than sharing the bridge (each would remove the other's)."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind("\0" + name)
        except OSError as e:
            sock.close()
            if e.errno != errno.EADDRINUSE:
                raise
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"another session's second engine (pid {_holder(name)}) still holds the lock {name!r} "
                    f"after {timeout:.0f}s; one cluster test session per machine"
                ) from None
            time.sleep(0.5)
            continue
        sock.listen(1)  # so that a waiting session can ask who holds it (SO_PEERCRED)
        return sock


def _holder(name: str) -> str:
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect("\0" + name)
        pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return str(pid)
    return "?"


def _host(*argv: str, check: bool = True) -> None:
    """A host networking command (ip, iptables); a failure fails the test with its stderr."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: rc={r.returncode}\n{r.stderr}")


def _ip(*args: str, check: bool = True) -> None:
    _host("ip", *args, check=check)


def _iptables(*args: str) -> None:
    _host("iptables", "-w", *args)


def stop_engine(eng: Engine) -> None:
    """Stop a second engine by its own pid and remove its state (its data root, sockets, pidfile); again
    is a no-op."""
    if eng.proc is not None:
        kill_tree(eng.proc, grace=60)
        eng.proc = None
    if eng.forward_rule:  # one -D per -I: a second engine started beside this one keeps its own
        _iptables("-D", *FORWARD_RULE)
        eng.forward_rule = False
    if eng.bridge:
        _ip("link", "del", BRIDGE, check=False)
        eng.bridge = False
    if eng.dir is not None and eng.dir.exists():
        _unmount_below(eng.dir)
        shutil.rmtree(eng.dir)
    if eng.lock is not None:  # last: the next session may now take the bridge and the pool
        eng.lock.close()
        eng.lock = None


def _unmount_below(d: Path) -> None:
    """Mounts a killed daemon left under its own directories (none after a clean stop)."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(d) + "/")), reverse=True):
        subprocess.run(["umount", "-l", m], check=False, capture_output=True)


def _has_raylet(node: RayNode) -> bool:
    try:
        node.raylet()
    except AssertionError:
        return False
    return True


@dataclass
class RayNode:
    proc: subprocess.Popen[bytes]
    log: Path
    engine: Engine | None = None

    def raylet(self) -> int:
        for p in descendants(self.proc.pid):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{p}/comm").read_text().strip() == "raylet":
                    return p
        raise AssertionError(f"no raylet below {self.proc.pid}{_tail(self.log)}")


@dataclass
class RayCluster:
    address: str
    dir: Path
    head: RayNode
    workers: list[RayNode] = field(default_factory=list)
    slots: int = 0  # forge slots per worker node
    env: dict[str, str] = field(default_factory=dict)  # the nodes' environment (before each node's own)
    common: list[str] = field(default_factory=list)  # `ray start` arguments of every node

    def revive(self, i: int) -> RayNode:
        """Worker ``i`` again (a new Ray node for the same engine) if it was killed: what is left of the old
        one's process tree is stopped first. A node that still runs is returned as it is."""
        old = self.workers[i]
        if old.proc.poll() is None and _has_raylet(old):
            return old
        assert old.engine is not None
        kill_tree(old.proc, grace=5)
        self.workers[i] = _start_worker(
            self.address, i, old.engine, self.slots, self.env, self.common, self.dir
        )
        return self.workers[i]

    def stop(self) -> None:
        # Loopback test nodes hold nothing worth a graceful drain (Ray gives one up to 30 s on SIGTERM).
        kill_tree(*(n.proc for n in [*self.workers, self.head]), grace=5)
        shutil.rmtree(self.dir, ignore_errors=True)


def _ray(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "forgelib.cluster.connect", "start", "--block", *args],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


def start_cluster(engines: list[Engine], slots: int) -> RayCluster:
    """A head (no forge slots) and one worker node per engine, each offering ``slots`` forge slots."""
    d = Path(tempfile.mkdtemp(prefix="forge-ray-", dir="/tmp"))  # Ray's socket paths must stay short
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("DOCKER_HOST", None)  # a node's engine is only what FORGE_DOCKER_HOST says
    common = ["--node-ip-address", "127.0.0.1", "--temp-dir", str(d), "--disable-usage-stats",
              "--object-store-memory", str(80 * 1024 * 1024)]  # fmt: skip
    head = RayNode(_ray(["--head", "--port", "0", "--num-cpus", "0", "--include-dashboard", "false",
                         *common], env, d / "head.log"), d / "head.log")  # fmt: skip
    cluster = RayCluster("", d, head, slots=slots, env=env, common=common)
    try:
        current = d / "ray_current_cluster"
        wait_for("ray head", lambda: current.is_file() and current.read_text().strip() != "", head.proc,
                 log=head.log)  # fmt: skip
        cluster.address = current.read_text().strip()
        # One node after the other: two `ray start` on one machine at once raced (the second one hung
        # after "Local node IP" until its start timeout).
        for i, eng in enumerate(engines):
            cluster.workers.append(_start_worker(cluster.address, i, eng, slots, env, common, d))
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start_worker(
    address: str, i: int, eng: Engine, slots: int, env: dict[str, str], common: list[str], d: Path
) -> RayNode:
    """One worker node serving ``eng``. Ray gives a raylet 30 s to register, which a loaded 2-core box
    can exceed while the node's agents import; a node that gave up is started again, once."""
    # --num-cpus 0: trials run in forge's slot actors (which need no CPU unit), so Ray has no reason to
    # keep idle task workers started for every driver that joins.
    resources = f'{{"forge_docker": {slots}}}'
    args = ["--address", address, "--num-cpus", "0", "--resources", resources, *common]
    for attempt in (1, 2):
        log = d / f"worker{i}.{attempt}.log"
        n = 1
        while log.exists():  # a revived node's: the dead one's log stays for a failed test's report
            n += 1
            log = d / f"worker{i}.{attempt}.{n}.log"
        # The node's own temp dir (its slots' forge-node-* dirs): removed with the cluster, even when the
        # node was killed before its slots could remove theirs.
        tmp = d / f"tmp{i}"
        tmp.mkdir(exist_ok=True)
        node_env = {**env, "FORGE_DOCKER_HOST": eng.host, "TMPDIR": str(tmp)}
        node = RayNode(_ray(args, node_env, log), log, eng)
        started = lambda lg=log: "Ray runtime started" in lg.read_text(errors="replace")  # noqa: E731
        try:
            wait_for(f"ray worker {i}", started, node.proc, log=log)
        except AssertionError:
            kill_tree(node.proc)
            if attempt == 2:
                raise
            continue
        return node
    raise AssertionError("unreachable")


def start_engine_and_cluster(images: list[str], slots: int) -> tuple[list[Engine], RayCluster]:
    """The machine's engine and a second one, each served by a node of a new cluster; the second engine
    boots (and loads ``images``) while the Ray nodes start, which need only its address."""
    second = new_engine()
    with ThreadPoolExecutor(1) as pool:
        booting = pool.submit(start_engine, images, second)
        try:
            cluster = start_cluster([main_engine(), second], slots)
        except BaseException:
            with contextlib.suppress(BaseException):
                booting.result()
            stop_engine(second)
            raise
        try:
            booting.result()
        except BaseException:
            cluster.stop()
            raise
    return [main_engine(), second], cluster
