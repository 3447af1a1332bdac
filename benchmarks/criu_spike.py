"""The CRIU spike (issue 41): can the cache pack's services be restored as processes, and what would it buy?

``python benchmarks/criu_spike.py --criu-dir DIR [--copies 4] [--rounds 2] [--kinds ...] [--stack-probe]`` as
root, on a local Linux host with ``dockerd`` installed. Not part of CI, not used by forge. Figures and the
verdict: README.md, section "Process restore (CRIU): the spike".

It never touches the machine's engine beyond ``docker save`` of the stand-in images. It starts a private
dockerd with ``--experimental`` (checkpoints need it) on its own socket, data root, exec root, pidfile, its
own bridge and address pool (``--iptables=false``, as tests/support/cluster.py does, plus one DOCKER-USER
ACCEPT for its own pool), with ``DIR`` first on its PATH so that runc finds that ``criu`` (Debian bookworm's
3.17.1 cannot run on kernels >= 6.13: README.md says why and what build works; redis and postgres, which
run as another uid, also need ``criu_spike_rlimits.patch`` where root lacks CAP_SYS_RESOURCE). Everything
it starts is stopped and removed at the end, also after a failure.

Per kind (redis, postgres, and the two uvicorn services, cache-admin and orders-api, as the pack's compose
file runs them), one source container is brought to its capture point (the HTTP services: their first
LISTEN, before any request, so that no connection is open; redis and postgres: ready, with a key or a row),
then checkpointed twice: once in place (``docker checkpoint create`` + ``docker start --checkpoint`` of the
same container, timed to ready) and once into a directory, the fork's source. Then, per round, two arms
alternated, each bringing ``--copies`` new containers up at once (each its own address on a shared network
with one redis and one postgres that the HTTP services' healthchecks need):

* **plain**: ``docker start`` of a container created from the same config;
* **criu**: the same container, the checkpoint copied into its own checkpoint directory in the data root
  (``docker start --checkpoint-dir`` is refused by Docker 20.10: "custom checkpointdir is not supported"),
  then ``docker start --checkpoint``.

A stateful kind's copies each get a copy of the source's volume taken after the checkpoint stopped it
(the files and the dumped memory are of one moment). Ready is the pack's healthcheck command run by
``docker exec`` until it succeeds. CPU of an arm: the copies' cgroups (``cpuacct.usage``), their
``containerd-shim``s with everything they ran (runc, criu, the probes' execs), the private dockerd and
containerd, and this script's children (the docker CLI).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SERVICES = REPO / "examples" / "multi_service_cache_debug" / "services"
BRIDGE, BRIDGE_ADDR = "criu-br0", "10.214.255.1/24"  # not the cluster tests' forge-br2 / 10.212-213
POOL = "10.215.0.0/16"
RULE = ["DOCKER-USER", "-s", "10.214.0.0/15", "-d", "10.214.0.0/15", "-j", "ACCEPT"]
IMAGES = ["forgelib/postgres:15", "forgelib/redis:7.0", "forgelib/python:3.11"]
TCK = os.sysconf("SC_CLK_TCK")
PG_ENV = ["-e", "POSTGRES_PASSWORD=app", "-e", "POSTGRES_USER=app", "-e", "POSTGRES_DB=app"]
REDIS_ARGS = ["redis-server", "--save", "", "--appendonly", "no", "--protected-mode", "no"]
HEALTHZ = ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8000/healthz"]


def _uvicorn(app: str, env: list[str]) -> list[str]:
    return [*env, "-e", "PYTHONDONTWRITEBYTECODE=1", "-v", f"{SERVICES}/{app}:/srv/{app}:ro",
            "forgelib/python:3.11", "python3", "-m", "uvicorn", "app:app", "--app-dir", f"/srv/{app}",
            "--host", "0.0.0.0", "--port", "8000"]  # fmt: skip


@dataclass(frozen=True)
class Kind:
    create: list[str]  # `docker create` arguments after the name and network
    ready: list[str]  # the pack's healthcheck command
    volume: str = ""  # a stateful kind's data directory (an anonymous volume in the image)
    listen: int = 0  # a stateless HTTP service: captured at its first LISTEN on this port


KINDS = {
    "cache-admin": Kind(
        _uvicorn("cache_admin", ["-e", "REDIS_URL=redis://redis:6379/0"]), HEALTHZ, listen=8000
    ),
    "orders-api": Kind(
        _uvicorn(
            "orders_api",
            [
                "-e",
                "REDIS_URL=redis://redis:6379/0",
                "-e",
                "DATABASE_URL=postgresql://app:app@app-db:5432/app",
            ],
        ),
        HEALTHZ,
        listen=8000,
    ),
    "redis": Kind(["forgelib/redis:7.0", *REDIS_ARGS], ["redis-cli", "ping"], volume="/data"),
    "postgres": Kind(
        [*PG_ENV, "forgelib/postgres:15"],
        ["pg_isready", "-q", "-h", "127.0.0.1", "-U", "app", "-d", "app"],
        volume="/var/lib/postgresql/data",
    ),
}


class Engine:
    """A private experimental dockerd; ``stop`` undoes everything ``start`` did, in reverse."""

    def __init__(self, criu_dir: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="criu-spike-", dir="/var/tmp"))
        self.host = f"unix://{self.dir}/docker.sock"
        self.env = {**os.environ, "DOCKER_HOST": self.host}
        self.criu_dir = criu_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.undo: list[list[str]] = []

    def docker(self, *args: str, check: bool = True, timeout: float = 300) -> str:
        r = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode:
            raise RuntimeError(f"docker {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout.strip()

    def start(self) -> None:
        for do, undo in (
            (["ip", "link", "add", BRIDGE, "type", "bridge"], ["ip", "link", "del", BRIDGE]),
            (["ip", "addr", "add", BRIDGE_ADDR, "dev", BRIDGE], []),
            (["ip", "link", "set", BRIDGE, "up"], []),
            (["iptables", "-w", "-I", *RULE], ["iptables", "-w", "-D", *RULE]),
        ):
            subprocess.run(do, check=True, capture_output=True)
            if undo:
                self.undo.append(undo)
        env = {**os.environ, "PATH": f"{self.criu_dir}:{os.environ['PATH']}"}
        with open(self.dir / "dockerd.log", "wb") as log:
            self.proc = subprocess.Popen(
                ["dockerd", "--experimental", "--data-root", str(self.dir / "root"),
                 "--exec-root", str(self.dir / "exec"), "--pidfile", str(self.dir / "docker.pid"),
                 "-H", self.host, "--bridge", BRIDGE, "--iptables=false", "--ip-masq=false",
                 "--default-address-pool", f"base={POOL},size=24"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 120
        while subprocess.run(["docker", "version"], env=self.env, capture_output=True).returncode:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"private dockerd did not start: see {self.dir}/dockerd.log")
            time.sleep(0.3)
        if self.docker("info", "--format", "{{.ExperimentalBuild}}") != "true":
            raise RuntimeError("private dockerd is not experimental")
        save = subprocess.Popen(["docker", "save", *IMAGES], stdout=subprocess.PIPE)
        subprocess.run(
            ["docker", "load", "-q"], env=self.env, stdin=save.stdout, check=True, capture_output=True
        )
        if save.wait() != 0:
            raise RuntimeError("docker save of the stand-in images failed")

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                ids = self.docker("ps", "-aq", timeout=60).split()
                if ids:
                    self.docker("rm", "-f", "-v", *ids, check=False, timeout=120)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
            self.proc = None
        for argv in reversed(self.undo):
            subprocess.run(argv, capture_output=True, check=False)
        self.undo.clear()
        for m in ("root/overlay2", "exec"):  # a stopped dockerd can leave mounts below its roots
            for line in Path("/proc/mounts").read_text().splitlines():
                if f"{self.dir}/{m}" in line.split()[1]:
                    subprocess.run(["umount", "-l", line.split()[1]], capture_output=True, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


def _proc_cpu(pid: int, children: bool = False) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12]) + ((int(f[13]) + int(f[14])) if children else 0)) / TCK


def _pids(eng: Engine, shim: bool) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if (
            str(eng.dir) in cmd
            and (("containerd-shim" in cmd) == shim)
            and ("dockerd" in cmd or "containerd" in cmd)
        ):
            out.append(int(p.name))
    return out


def _cg_cpu(cid: str) -> float:
    for base in ("/sys/fs/cgroup/cpuacct/docker", "/sys/fs/cgroup/docker"):
        with contextlib.suppress(OSError):
            return int(Path(f"{base}/{cid}/cpuacct.usage").read_text()) / 1e9
        with contextlib.suppress(OSError, ValueError):
            stat = Path(f"{base}/{cid}/cpu.stat").read_text().split()
            return int(stat[stat.index("usage_usec") + 1]) / 1e6
    return 0.0


def _listening(pid: int, port: int) -> bool:
    try:
        rows = [ln.split() for ln in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]]
    except OSError:
        return False
    return any(r[1].endswith(f":{port:04X}") and r[3] == "0A" for r in rows)


def _wait_ready(eng: Engine, name: str, argv: list[str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if subprocess.run(["docker", "exec", name, *argv], env=eng.env, capture_output=True).returncode == 0:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{name} not ready after {timeout:.0f}s")


def _criu_log(eng: Engine, cid: str, which: str) -> str:
    """The error lines of the container's last criu dump/restore log (runc leaves it in the exec root)."""
    for log in (eng.dir / "exec").rglob(f"criu-{which}.log"):
        if cid in str(log):
            return "\n".join(ln for ln in log.read_text(errors="replace").splitlines() if "Error" in ln)
    return ""


def source(eng: Engine, name: str, kind: Kind, ckdir: Path) -> dict[str, Any]:
    """Bring ``name`` to its capture point and checkpoint it (which stops it) into ``ckdir``: the forks'
    source, with a copy of its data directory of that moment; then time a restore of that checkpoint in
    place, and a plain start in place, each to ready."""
    eng.docker("create", "--name", name, "--network", "spike", *kind.create)
    eng.docker("start", name)
    if kind.listen:
        pid = int(eng.docker("inspect", "-f", "{{.State.Pid}}", name))
        while not _listening(pid, kind.listen):
            time.sleep(0.02)
    else:
        _wait_ready(eng, name, kind.ready)
        if kind.volume.startswith("/var/lib/postgresql"):
            eng.docker("exec", name, "psql", "-U", "app", "-d", "app", "-qc",
                       "create table t(x int); insert into t values (42)")  # fmt: skip
        else:
            eng.docker("exec", name, "redis-cli", "set", "k", "v")
    cid = eng.docker("inspect", "-f", "{{.Id}}", name)
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    argv = ["docker", "checkpoint", "create", "--checkpoint-dir", str(ckdir), name, "fork"]
    r = subprocess.run(argv, env=eng.env, capture_output=True, text=True)
    out["checkpoint_s"] = round(time.monotonic() - t0, 2)
    if r.returncode:
        out["error"] = r.stderr.strip() + "\n" + _criu_log(eng, cid, "dump")
        return out
    out["checkpoint_mb"] = round(sum(f.stat().st_size for f in (ckdir / "fork").iterdir()) / 1e6, 1)
    if kind.volume:
        vol = eng.docker("inspect", "-f", "{{range .Mounts}}{{.Name}}{{end}}", name)
        subprocess.run(["cp", "-a", f"{eng.dir}/root/volumes/{vol}/_data", str(ckdir / "data")], check=True)
    shutil.copytree(ckdir / "fork", eng.dir / "root" / "containers" / cid / "checkpoints" / "here")
    t0 = time.monotonic()
    r = subprocess.run(
        ["docker", "start", "--checkpoint", "here", name], env=eng.env, capture_output=True, text=True
    )
    if r.returncode:
        out["error"] = r.stderr.strip() + "\n" + _criu_log(eng, cid, "restore")
        return out
    _wait_ready(eng, name, kind.ready)
    out["in_place_restore_to_ready_s"] = round(time.monotonic() - t0, 2)
    eng.docker("stop", "-t", "30", name)
    t0 = time.monotonic()
    eng.docker("start", name)
    _wait_ready(eng, name, kind.ready)
    out["in_place_plain_start_to_ready_s"] = round(time.monotonic() - t0, 2)
    eng.docker("rm", "-f", "-v", name)
    return out


def arm(eng: Engine, label: str, kname: str, kind: Kind, copies: int, ckdir: Path) -> dict[str, Any]:
    root = eng.dir / "root"
    names = [f"{label}-{kname}-{i}-{time.monotonic_ns()}" for i in range(copies)]
    for n in names:
        extra: list[str] = []
        if kind.volume:
            eng.docker("volume", "create", n)
            subprocess.run(["cp", "-a", f"{ckdir}/data/.", f"{root}/volumes/{n}/_data/"], check=True)
            extra = ["-v", f"{n}:{kind.volume}"]
        eng.docker("create", "--name", n, "--network", "spike", *extra, *kind.create)
    ids = {n: eng.docker("inspect", "-f", "{{.Id}}", n) for n in names}
    t0 = time.monotonic()
    if label == "criu":
        for n in names:
            dst = root / "containers" / ids[n] / "checkpoints" / "fork"
            shutil.copytree(ckdir / "fork", dst)
            # Identical checkpoints started at once collide in containerd's content store ("commit failed:
            # content sha256:…: already exists"): one file more makes each copy's upload its own.
            (dst / "copy").write_text(n)
    copy_s = time.monotonic() - t0
    engine0 = sum(_proc_cpu(p) for p in _pids(eng, shim=False))
    shims0 = {p: _proc_cpu(p, children=True) for p in _pids(eng, shim=True)}
    me0 = os.times()
    errors: list[str] = []

    def go(n: str) -> None:
        argv = ["start", "--checkpoint", "fork", n] if label == "criu" else ["start", n]
        r = subprocess.run(["docker", *argv], env=eng.env, capture_output=True, text=True)
        if r.returncode:
            errors.append(f"{n}: {r.stderr.strip()}\n{_criu_log(eng, ids[n], 'restore')}")
            return
        _wait_ready(eng, n, kind.ready)

    t0 = time.monotonic()
    threads = [threading.Thread(target=go, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    me1 = os.times()
    cpu = {
        "containers": sum(_cg_cpu(c) for c in ids.values()),
        "shims": sum(_proc_cpu(p, children=True) - shims0.get(p, 0.0) for p in _pids(eng, shim=True)),
        "engine": sum(_proc_cpu(p) for p in _pids(eng, shim=False)) - engine0,
        "cli": (me1.children_user + me1.children_system) - (me0.children_user + me0.children_system),
    }
    addrs = {eng.docker("inspect", "-f", "{{.NetworkSettings.Networks.spike.IPAddress}}", n) for n in names}
    seen = ""
    if not errors and kind.volume.startswith("/var/lib/postgresql"):
        seen = eng.docker(
            "exec",
            names[0],
            "psql",
            "-U",
            "app",
            "-d",
            "app",
            "-Atc",
            "select string_agg(x::text, ',') from t",
        )
    elif not errors and kind.volume:
        seen = eng.docker("exec", names[0], "redis-cli", "get", "k")
    eng.docker("rm", "-f", "-v", *names)
    if kind.volume:
        eng.docker("volume", "rm", *names)
    return {"kind": kname, "arm": label, "wall_s": round(wall, 2), "cpu_s": round(sum(cpu.values()), 2),
            **{f"cpu_{k}": round(v, 2) for k, v in cpu.items()}, "copy_s": round(copy_s, 2),
            "addresses": len(addrs), "seen": seen, "errors": errors, "load": os.getloadavg()[0]}  # fmt: skip


PROBE_SQL = "select string_agg(x::text, ',') from t"
PROBE_PY = (
    "import os, psycopg, redis; c = psycopg.connect(os.environ['DATABASE_URL']); "
    f"print(c.execute(\"{PROBE_SQL}\").fetchone()[0], redis.Redis.from_url(os.environ['REDIS_URL']).get('k'))"
)
STACK = (("app-db", "postgres"), ("redis", "redis"), ("api", "orders-api"))


def stack_probe(eng: Engine, forks: int = 2) -> dict[str, str]:
    """A stack forked by CRIU alone: postgres, redis and orders-api checkpointed (the API first, before its
    first request), restored ``forks`` times, each fork on its own network under the pack's aliases with
    its own copies of the volumes; what each fork's API reads over the network after fork 0 changed a row
    and a key (the others must still read the checkpoint's)."""
    eng.docker("network", "create", "src")
    for alias, k in STACK:
        eng.docker(
            "create", "--name", f"s-{alias}", "--network", "src", "--network-alias", alias, *KINDS[k].create
        )
        eng.docker("start", f"s-{alias}")
        if k == "postgres":
            _wait_ready(eng, "s-app-db", KINDS[k].ready)
            eng.docker("exec", "s-app-db", "psql", "-U", "app", "-d", "app", "-qc",
                       "create table t(x int); insert into t values (7)")  # fmt: skip
        elif k == "redis":
            _wait_ready(eng, "s-redis", KINDS[k].ready)
            eng.docker("exec", "s-redis", "redis-cli", "set", "k", "source")
    pid = int(eng.docker("inspect", "-f", "{{.State.Pid}}", "s-api"))
    while not _listening(pid, 8000):
        time.sleep(0.02)
    ck, root = eng.dir / "ck-stack", eng.dir / "root"
    for alias in ("api", "redis", "app-db"):  # the API first: it holds no connection yet
        eng.docker("checkpoint", "create", "--checkpoint-dir", str(ck), f"s-{alias}", alias)
    vols = {
        a: eng.docker("inspect", "-f", "{{range .Mounts}}{{.Name}}{{end}}", f"s-{a}")
        for a in ("app-db", "redis")
    }
    for f in range(forks):
        eng.docker("network", "create", f"f{f}")
        for alias, k in STACK:
            name, extra = f"f{f}-{alias}", []
            if alias in vols:
                eng.docker("volume", "create", name)
                src, dst_dir = f"{root}/volumes/{vols[alias]}/_data/.", f"{root}/volumes/{name}/_data/"
                subprocess.run(["cp", "-a", src, dst_dir], check=True)
                extra = ["-v", f"{name}:{KINDS[k].volume}"]
            eng.docker(
                "create",
                "--name",
                name,
                "--network",
                f"f{f}",
                "--network-alias",
                alias,
                *extra,
                *KINDS[k].create,
            )
            dst = root / "containers" / eng.docker("inspect", "-f", "{{.Id}}", name) / "checkpoints" / "c"
            shutil.copytree(ck / alias, dst)
            (dst / "copy").write_text(name)
            eng.docker("start", "--checkpoint", "c", name)
        _wait_ready(eng, f"f{f}-api", HEALTHZ)
    eng.docker("exec", "f0-app-db", "psql", "-U", "app", "-d", "app", "-qc", "insert into t values (8)")
    eng.docker("exec", "f0-redis", "redis-cli", "set", "k", "changed-in-f0")
    return {f"f{f}": eng.docker("exec", f"f{f}-api", "python3", "-c", PROBE_PY) for f in range(forks)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--criu-dir", type=Path, required=True, help="a directory holding the criu runc should run"
    )
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--stack-probe", action="store_true", help="only fork a postgres+redis+API stack twice")
    args = ap.parse_args(argv)
    eng = Engine(args.criu_dir.resolve())
    result: dict[str, Any] = {"load_start": os.getloadavg(), "sources": {}, "rows": []}
    try:
        eng.start()
        if args.stack_probe:
            result["stack_probe"] = stack_probe(eng)
            print(json.dumps(result["stack_probe"]), flush=True)
            return 0
        eng.docker("network", "create", "spike")
        eng.docker(
            "run",
            "-d",
            "--name",
            "dep-redis",
            "--network",
            "spike",
            "--network-alias",
            "redis",
            *KINDS["redis"].create,
        )
        eng.docker(
            "run",
            "-d",
            "--name",
            "dep-pg",
            "--network",
            "spike",
            "--network-alias",
            "app-db",
            *KINDS["postgres"].create,
        )
        _wait_ready(eng, "dep-pg", KINDS["postgres"].ready)
        for kname in args.kinds.split(","):
            kind = KINDS[kname]
            ckdir = eng.dir / f"ck-{kname}"
            ckdir.mkdir()
            name = f"src-{kname}"
            src = source(eng, name, kind, ckdir)
            result["sources"][kname] = src
            print(kname, json.dumps(src), flush=True)
            if "error" in src:
                continue
            for rnd in range(args.rounds):
                for label in ("plain", "criu") if rnd % 2 == 0 else ("criu", "plain"):
                    row = arm(eng, label, kname, kind, args.copies, ckdir)
                    result["rows"].append(row)
                    print(json.dumps(row), flush=True)
    finally:
        eng.stop()
    result["load_end"] = os.getloadavg()
    out = REPO / "benchmarks" / "results" / "criu_spike.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
