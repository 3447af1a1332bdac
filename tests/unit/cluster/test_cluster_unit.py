"""forgelib.cluster without a cluster: the shipped project, a node's slot (its project cache, event buffer
and stop handling), import hygiene."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from forgelib.cluster import bundle as bundle_mod
from forgelib.cluster import slot as slot_mod
from forgelib.cluster.bundle import pack, unpack, verify_seeds
from forgelib.cluster.connect import forge_nodes, is_loopback
from forgelib.cluster.node import RelayEvents, StopWatcher, TrialOrder, node_engine
from forgelib.cluster.slot import DRIVER_SILENCE, Slot, code_digest
from forgelib.errors import ForgeError
from forgelib.spec.loader import load_project_config, load_run_config
from forgelib.spec.models import Timeouts
from forgelib.stacks.live import LiveStacks, StopState

PACK = Path(__file__).resolve().parents[3] / "examples" / "multi_service_postgres_reset"


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "pack"
    shutil.copytree(PACK, dest, ignore=shutil.ignore_patterns("runs"))
    (dest / "runs" / "old-run").mkdir(parents=True)
    (dest / "runs" / "old-run" / "events.jsonl").write_text("{}\n")
    return dest


def test_bundle_ships_the_project_and_its_seeds_verify_on_arrival(
    project_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = load_project_config(project_copy)
    bundle = pack(project, exclude=[project_copy / "runs"])
    assert bundle.seeds == {n: s.digest for n, s in project.seeds.items()} and bundle.seeds
    arrived = load_project_config(unpack(bundle, tmp_path / "node"))
    verify_seeds(arrived, bundle.seeds)
    assert [t.name for t in arrived.tasks] == [t.name for t in project.tasks]
    assert not (tmp_path / "node" / "runs").exists()  # earlier results are not shipped
    # Packed again by a later run: the same bytes, so the slots reuse what they unpacked and verified.
    monkeypatch.setattr(time, "time", lambda: 2_000_000_000.0)  # (gzip would stamp its header with it)
    assert pack(project, exclude=[project_copy / "runs"]).sha256 == bundle.sha256


def test_a_seed_changed_on_the_node_is_refused_before_any_recipe(project_copy: Path, tmp_path: Path) -> None:
    project = load_project_config(project_copy)
    bundle = pack(project)
    root = unpack(bundle, tmp_path / "node").parent
    arrived = load_project_config(root / "project.yaml")
    name, seed = next(iter(arrived.seeds.items()))
    seed.path.write_bytes(seed.path.read_bytes() + b"-- changed on the node\n")
    with pytest.raises(ForgeError, match=f"seed '{name}' hashes to sha256:[0-9a-f]+ on this node"):
        verify_seeds(arrived, bundle.seeds)


def test_corrupted_bundle_bytes_are_refused(project_copy: Path, tmp_path: Path) -> None:
    bundle = pack(load_project_config(project_copy))
    broken = type(bundle)(bundle.data[:-10] + b"0123456789", bundle.sha256, bundle.project_file, bundle.seeds)
    with pytest.raises(ForgeError, match="arrived corrupted"):
        unpack(broken, tmp_path / "node")


def test_a_compose_file_outside_the_project_cannot_be_shipped(project_copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.compose.yaml"
    shutil.copy(project_copy / "shared" / "environment.compose.yaml", outside)
    text = (project_copy / "project.yaml").read_text()
    (project_copy / "project.yaml").write_text(text.replace("shared/environment.compose.yaml", str(outside)))
    with pytest.raises(ForgeError, match=r"outside it: .*elsewhere\.compose\.yaml"):
        pack(load_project_config(project_copy))


def test_the_node_must_name_its_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORGE_DOCKER_HOST", raising=False)
    monkeypatch.setenv("DOCKER_HOST", "unix:///whatever.sock")  # not taken as the node's choice
    with pytest.raises(ForgeError, match=r"FORGE_DOCKER_HOST=unix:///var/run/docker\.sock"):
        node_engine()
    monkeypatch.setenv("FORGE_DOCKER_HOST", "unix:///srv/engine.sock")
    assert node_engine() == "unix:///srv/engine.sock"


def test_relay_events_tag_the_node() -> None:
    pushed: list[object] = []
    sink = RelayEvents(pushed.extend, {"id": "n1", "host": "h", "engine": "e"})
    sink.append("trial_state", task="t", index=0, phase="oracle")
    sink.say("t[0] oracle")
    assert pushed == [
        ("event", ("trial_state", {"task": "t", "index": 0, "phase": "oracle", "node": "n1"})),
        ("say", "t[0] oracle"),
    ]


def test_a_driver_stop_reaches_the_trial_like_a_signal() -> None:
    level = [0]
    stop, stacks = StopState(), LiveStacks()
    torn: list[bool] = []
    stacks.add("p1", torn.append)
    seen = threading.Event()
    with StopWatcher(lambda: level[0], stop, stacks):
        assert not stop.requested
        level[0] = 1
        deadline = time.monotonic() + 30
        while not stop.requested and time.monotonic() < deadline:
            seen.wait(0.05)
        assert stop.requested and stacks.closed and not torn  # the trial's own path tears down
        level[0] = 2
        while not torn and time.monotonic() < deadline:
            seen.wait(0.05)
    assert stop.hurry and torn == [False]  # a second stop: torn down without graceful waits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def slot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Slot:
    monkeypatch.setattr(slot_mod.tempfile, "tempdir", str(tmp_path))
    return Slot("node-1", clock=Clock())


def _order(run_id: str = "r1") -> TrialOrder:
    return TrialOrder(run_id, "read_widget", 0, Timeouts(), False, 0)


def test_a_slot_unpacks_and_verifies_a_bundle_once_per_digest(
    slot: Slot, project_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    verified: list[str] = []
    real = slot_mod.verify_seeds
    monkeypatch.setattr(slot_mod, "verify_seeds", lambda p, w: (verified.append(p.root.name), real(p, w)))
    first = pack(load_project_config(project_copy))
    assert slot._project(first) is slot._project(first) and len(verified) == 1  # cached after the first
    assert first.seeds and slot._project(first).seeds.keys() == first.seeds.keys()
    (project_copy / "NOTES.md").write_text("edited between runs\n")
    second = pack(load_project_config(project_copy))  # other content: another digest, verified again
    assert second.sha256 != first.sha256
    slot._project(second)
    assert len(verified) == 2
    other = {name: "sha256:" + "0" * 64 for name in second.seeds}  # not what the driver verified
    lying = bundle_mod.Bundle(second.data, second.sha256, second.project_file, other)
    slot._projects.clear()
    with pytest.raises(ForgeError, match=r"hashes to .* on this node"):
        slot._project(lying)  # a seed that is not what the driver verified is never applied
    assert not (slot.home / second.sha256[:16]).exists()


def test_a_slot_hashes_each_shipped_seed_once(
    slot: Slot, project_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import forgelib.spec.loader as loader_mod

    project = load_project_config(project_copy)
    bundle = pack(project)
    hashed: list[str] = []

    def counting(real):  # type: ignore[no-untyped-def]
        return lambda path, kind: (hashed.append(Path(path).name), real(path, kind))[1]

    monkeypatch.setattr(loader_mod, "seed_digest", counting(loader_mod.seed_digest))
    monkeypatch.setattr(bundle_mod, "seed_digest", counting(bundle_mod.seed_digest))
    slot._project(bundle)
    assert sorted(hashed) == sorted(s.path.name for s in project.seeds.values()) and hashed


def test_a_slot_refuses_trials_from_other_forgelib_code(slot: Slot, project_copy: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("FORGE_DOCKER_HOST", "unix:///srv/engine.sock")
    ret = slot.run(pack(load_project_config(project_copy)), _order(), code="0" * 16)
    assert (
        ret.error and "other forgelib code" in ret.error and ret.node["engine"] == "unix:///srv/engine.sock"
    )
    assert slot.code == code_digest() != "0" * 16


def test_a_slot_buffers_each_runs_events_and_stops_when_its_driver_goes_silent(slot: Slot) -> None:
    clock = slot._clock
    assert isinstance(clock, Clock)
    slot._push(("r1", "d1"), [("say", "a")])
    slot._push(("r2", "d2"), [("say", "b")])
    assert slot.drain("r1", "d1") == [("say", "a")] and slot.drain("r1", "d1") == []
    assert slot.drain("r2", "d2") == [("say", "b")]
    slot.stop("r2", 1, "d2")
    assert (slot._stop_level(("r1", "d1")), slot._stop_level(("r2", "d2"))) == (0, 1)
    clock.now += DRIVER_SILENCE / 2
    slot.drain("r1", "d1")  # r1's driver is alive: it keeps draining
    clock.now += DRIVER_SILENCE / 2 + 1
    assert slot._stop_level(("r1", "d1")) == 0
    clock.now += DRIVER_SILENCE
    assert slot._stop_level(("r1", "d1")) == 1  # killed driver: its trial is stopped, its stack torn down
    slot._forget_gone_runs()
    assert slot._runs == {}


def test_a_resuming_driver_takes_a_run_over_from_its_killed_driver(slot: Slot) -> None:
    # The killed driver d1's trial of r1 still runs here; d2 resumes r1 within DRIVER_SILENCE.
    slot._current = ("r1", "d1")
    slot._push(("r1", "d1"), [("say", "old")])
    slot._push(("r9", "d1"), [("say", "another run")])
    assert slot.take_over("r1", "d2", timeout=0) is False  # it still runs: not yet
    assert slot._stop_level(("r1", "d1")) == 1  # stopped like a Ctrl-C (its stack torn down)
    assert slot._stop_level(("r9", "d1")) == 0 and slot._stop_level(("r1", "d2")) == 0
    assert slot.drain("r1", "d2") == []  # the old trial's events are not the resuming driver's

    def ends() -> None:
        time.sleep(0.3)
        slot._current = None

    threading.Thread(target=ends).start()
    clock = slot._clock
    assert isinstance(clock, Clock)
    assert slot.take_over("r1", "d2", timeout=DRIVER_SILENCE)  # (the fake clock stands still)
    slot._current = ("r1", "d2")
    assert slot.take_over("r1", "d2", timeout=0)  # its own trial is not in the way


class FakeNodeRun:
    """``node.NodeRun`` without an engine: what the slot asks of a run's stacks here."""

    started: list[FakeNodeRun] = []

    def __init__(self, order: TrialOrder, workdir: Path) -> None:
        self.order, self.workdir, self.ended, self.drained = order, workdir, 0, 0
        self.trials: list[int] = []

    def no_more(self) -> None:
        self.drained += 1

    @classmethod
    def start(cls, project: object, order: TrialOrder, workdir: Path) -> FakeNodeRun:
        run = cls(order, workdir)
        cls.started.append(run)
        return run

    def end(self, run_id: str) -> None:
        assert run_id == self.order.run_id
        self.ended += 1
        shutil.rmtree(self.workdir)


@pytest.fixture
def node_runs(slot: Slot, project_copy: Path, monkeypatch: pytest.MonkeyPatch) -> list[FakeNodeRun]:
    monkeypatch.setenv("FORGE_DOCKER_HOST", "unix:///srv/engine.sock")
    monkeypatch.setattr(slot_mod, "NodeRun", FakeNodeRun)
    monkeypatch.setattr(FakeNodeRun, "started", [])

    def run_trial(
        project: object, order: TrialOrder, *, run: FakeNodeRun, **kw: object
    ) -> slot_mod.TrialReturn:
        run.trials.append(order.index)
        return slot_mod.TrialReturn({"id": "node-1"}, status="passed")

    monkeypatch.setattr(slot_mod, "run_trial", run_trial)
    return FakeNodeRun.started


def _trial(slot: Slot, project_copy: Path, run_id: str, driver: str, index: int) -> None:
    order = dataclasses.replace(_order(run_id), index=index, driver=driver, stacks="warm")
    assert slot.run(pack(load_project_config(project_copy)), order, slot.code).status == "passed"


def test_a_runs_trials_on_a_slot_share_its_stacks_until_the_driver_ends_it(
    slot: Slot, project_copy: Path, node_runs: list[FakeNodeRun]
) -> None:
    for i in range(3):
        _trial(slot, project_copy, "r1", "d1", i)
    _trial(slot, project_copy, "r2", "d2", 0)  # another run: stacks of its own
    assert [(r.order.run_id, r.trials, r.order.stacks) for r in node_runs] == [
        ("r1", [0, 1, 2], "warm"), ("r2", [0], "warm")
    ]  # fmt: skip
    assert slot.retire(0.0) is False  # a run that has not ended keeps its stacks here
    slot.end("r1", "d1")
    slot.end("r1", "d1")  # (a second end finds nothing)
    assert [r.ended for r in node_runs] == [1, 0] and not node_runs[0].workdir.exists()
    _trial(slot, project_copy, "r1", "d1", 3)  # never reused by a later run: a new one
    assert len(node_runs) == 3 and node_runs[2].trials == [3]


def test_the_drivers_no_more_reaches_its_runs_stacks_here_also_before_its_first_trial_here(
    slot: Slot, project_copy: Path, node_runs: list[FakeNodeRun]
) -> None:
    _trial(slot, project_copy, "r1", "d1", 0)
    slot.no_more("r1", "d1")
    slot.no_more("r2", "d2")  # r2's order is still on its way here
    _trial(slot, project_copy, "r2", "d2", 0)
    _trial(slot, project_copy, "r3", "d3", 0)  # told nothing
    assert [(r.order.run_id, r.drained) for r in node_runs] == [("r1", 1), ("r2", 1), ("r3", 0)]


def test_a_silent_drivers_run_is_ended_and_a_resumed_run_ends_the_killed_drivers(
    slot: Slot, project_copy: Path, node_runs: list[FakeNodeRun]
) -> None:
    clock = slot._clock
    assert isinstance(clock, Clock)
    _trial(slot, project_copy, "r1", "d1", 0)
    _trial(slot, project_copy, "r2", "d2", 0)
    clock.now += DRIVER_SILENCE / 2
    slot.drain("r2", "d2")
    clock.now += DRIVER_SILENCE / 2 + 1
    slot._forget_gone_runs()  # what the slot's silence thread does every few seconds
    assert [r.ended for r in node_runs] == [1, 0]
    _trial(slot, project_copy, "r3", "d3", 0)  # d3 is killed; d4 resumes r3
    assert slot.take_over("r3", "d4", timeout=0)
    assert [r.ended for r in node_runs] == [1, 0, 1]


def test_a_dead_slots_directory_is_removed_by_the_next_slot(tmp_path: Path, slot: Slot) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    left = tmp_path / f"forge-node-{dead}-12345-abc"
    (left / "trial-x").mkdir(parents=True)
    assert slot.home.parent == tmp_path and slot.home.name.startswith(f"forge-node-{os.getpid()}-")
    Slot("node-1")
    assert not left.exists() and slot.home.is_dir()  # a live slot's own directory stays


def test_forge_nodes_are_alive_nodes_with_slots() -> None:
    nodes = [
        {"NodeID": "a", "Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"forge_docker": 4.0}},
        {"NodeID": "b", "Alive": False, "Resources": {"forge_docker": 4.0}},
        {"NodeID": "h", "Alive": True, "Resources": {"CPU": 8.0}},
    ]
    assert [(n.node_id, n.slots) for n in forge_nodes(nodes)] == [("a", 4)]
    assert is_loopback("127.0.0.1:6379") and is_loopback("localhost:1") and not is_loopback("10.1.2.3:6379")


def test_run_config_names_a_cluster(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"project: {PACK}\ncluster: 10.0.0.5:6379\n")
    assert load_run_config(cfg).cluster == "10.0.0.5:6379"


def test_the_local_path_never_imports_ray() -> None:
    code = (
        "import sys, forgelib.cli.program, forgelib.cli.tasks, forgelib.cli.run, forgelib.run.execute, "
        "forgelib.cluster.driver, forgelib.cluster.node, forgelib.cluster.bundle, forgelib.cluster.slot\n"
        "bad = sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.'))\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr


def test_the_cluster_driver_loads_a_project_without_the_client_libraries() -> None:
    # The driver runs no trial, so psycopg/redis (≈ 0.85 s of its start-up) stay unloaded; a process that
    # runs trials loads them with clients.load(), and the deferred names resolve to the real modules.
    code = (
        "import sys, forgelib.cli.program, forgelib.cli.tasks, forgelib.cli.run, forgelib.run.execute, "
        "forgelib.cluster.driver, forgelib.cluster.connect, forgelib.stacks.connect\n"
        "from forgelib.kinds.postgres import seed as sql_dump\n"
        "from forgelib.kinds.redis import seed as redis_dump\n"
        "from forgelib.spec.loader import load_project_config\n"
        f"project = load_project_config({str(PACK)!r})\n"
        "assert project.seeds, 'the pack has seeds'\n"
        "clients = lambda: sorted(m for m in sys.modules if m.split('.')[0] in ('redis', 'psycopg'))\n"
        "assert not clients(), clients()\n"
        "from forgelib import clients as c\n"
        "c.load()\n"
        "import psycopg, psycopg.sql, redis\n"
        "assert sql_dump.psycopg.Error is psycopg.Error and sql_dump.sql.SQL is psycopg.sql.SQL\n"
        "assert redis_dump.redis_lib.RedisError is redis.RedisError\n"
        "assert sql_dump.psycopg.conninfo.make_conninfo is psycopg.conninfo.make_conninfo\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr


def test_the_driver_names_slots_of_other_forgelib_code_on_its_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from forgelib.cluster.connect import NodeInfo
    from forgelib.cluster.driver import NAMESPACE, Cluster

    fake = types.ModuleType("ray.util")
    fake.list_named_actors = lambda all_namespaces=False: [  # type: ignore[attr-defined]
        {"namespace": NAMESPACE, "name": "forge-slot-aaa-0-mine"},
        {"namespace": NAMESPACE, "name": "forge-slot-aaa-1-0ld"},
        {"namespace": NAMESPACE, "name": "forge-slot-zzz-0-0ld"},  # not this run's node
        {"namespace": "someone", "name": "forge-slot-aaa-2-0ld"},  # not ours at all
    ]
    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))
    monkeypatch.setitem(sys.modules, "ray.util", fake)
    c = object.__new__(Cluster)
    c.nodes, c.code = [NodeInfo("aaa", "127.0.0.1", 2)], "mine"
    assert c.other_code_slots() == ["forge-slot-aaa-1-0ld"]


def _forge_run_cluster(tmp_path: Path, ray_init: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``forge run --cluster`` with a stand-in ``ray`` package whose import runs ``ray_init``."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(ray_init)
    argv = [sys.executable, "-m", "forgelib", "run", "--config", str(PACK / "run_configs" / "dev.yaml"),
            "--output", str(tmp_path / "runs"), "--cluster", "127.0.0.1:6379", "--json", *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "FORGE_LOG": str(tmp_path / "forge.log")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, check=False)


def test_a_cluster_run_without_ray_says_how_to_install_it(tmp_path: Path) -> None:
    # Ray is imported on a thread while the config loads; its failure still surfaces as the one clear error.
    r = _forge_run_cluster(tmp_path, "raise ImportError('no module named ray')\n")
    assert r.returncode == 1, r.stderr
    assert "forge: error: --cluster needs Ray on this machine and on every node" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not (tmp_path / "runs").exists()


def test_an_error_while_ray_still_imports_exits_at_once_with_its_code(tmp_path: Path) -> None:
    # The join never finishes (the import blocks); a usage error found meanwhile ends the process with its
    # own exit code instead of waiting for the join (the subprocess timeout fails the test if it waited).
    agent = str(PACK / "agents" / "mcp_agent.yaml")
    r = _forge_run_cluster(tmp_path, "import threading\nthreading.Event().wait()\n", "--agent", agent)
    assert r.returncode == 2, r.stderr
    assert "forge: error: --cluster runs each task's oracle" in r.stderr and r.stdout == ""


@pytest.mark.parametrize(
    ("argv", "address"),
    [
        (["run", "--config", "c.yaml", "--cluster", "10.0.0.5:6379"], "10.0.0.5:6379"),
        (["run", "--cluster=127.0.0.1:6379", "--json"], "127.0.0.1:6379"),
        (["run", "--config", "c.yaml"], None),
        (["validate", "--cluster", "10.0.0.5:6379"], None),  # not forge run: invoke says what it thinks
        (["run", "--cluster", "--json"], None),  # no value: invoke's parse reports it
        ([], None),
    ],
)
def test_the_cluster_address_is_read_off_the_command_line(argv: list[str], address: str | None) -> None:
    from forgelib.cli.program import cluster_argument

    assert cluster_argument(argv) == address


def test_forge_run_takes_over_the_join_its_command_line_started(monkeypatch: pytest.MonkeyPatch) -> None:
    import forgelib.cli.program
    import forgelib.cli.run
    from forgelib.cluster import connect

    calls: list[str] = []
    monkeypatch.setattr(connect, "connect", lambda address: calls.append(address) or [])
    monkeypatch.setattr(connect, "_joining", None)
    forgelib.cli.program._join_early(["run", "--config", "c.yaml", "--cluster", "10.0.0.5:6379"])
    early = connect._joining
    assert early is not None
    assert forgelib.cli.run._start_joining("10.0.0.5:6379") is early  # not a second join
    other = forgelib.cli.run._start_joining("10.0.0.6:6379")  # the run config named another: its own
    assert other is not early
    early.result(), other.result()
    assert sorted(calls) == ["10.0.0.5:6379", "10.0.0.6:6379"]


def _listener(reply: bytes | None) -> tuple[socket.socket, str]:
    """A loopback server that answers each connection with ``reply`` (None: says nothing)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = srv.accept()
                conn.recv(1024)
                if reply is not None:
                    conn.sendall(reply)
                    conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, f"127.0.0.1:{srv.getsockname()[1]}"


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (b"HTTP/1.0 400 Bad Request\r\n\r\n", "it answered b'HTTP/1.0 '"),
        (b"", "it closed the connection"),
        (None, "timed out"),  # a service waiting for its own protocol's first words
    ],
)
def test_a_service_that_is_not_a_ray_head_is_refused_at_once(
    reply: bytes | None, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from forgelib.cluster import connect

    monkeypatch.setattr(connect, "ANSWER_SECONDS", 0.5)
    srv, address = _listener(reply)
    with srv, pytest.raises(ForgeError) as e:
        connect._require_answer(address)
    assert str(e.value).startswith(
        f"cannot join the Ray cluster at {address}: something listens there, but not a Ray head's GCS "
        f"(no gRPC greeting: {why}"
    ) and "`ray start --head` printed it" in str(e.value)


def test_a_grpc_server_passes_the_greeting_check() -> None:
    from forgelib.cluster import connect

    settings = b"\x00\x00\x06\x04\x00\x00\x00\x00\x00" + b"\x00\x03\x00\x00\x00\x64"  # SETTINGS, 1 entry
    srv, address = _listener(settings)
    with srv:
        connect._require_answer(address)  # no error; the real GCS: tests/integration/test_cluster.py


class _Exited(Exception):
    pass


def test_a_slot_retires_only_when_no_trial_runs_or_ran_lately(
    slot: Slot, monkeypatch: pytest.MonkeyPatch
) -> None:
    def exit_(code: int) -> None:
        raise _Exited(code)

    monkeypatch.setattr(os, "_exit", exit_)
    clock = slot._clock
    assert isinstance(clock, Clock)
    assert not slot.retire(slot_mod.RETIRE_IDLE_SECONDS)  # started just now: a driver may still send one
    clock.now += slot_mod.RETIRE_IDLE_SECONDS
    with slot._trial:  # a trial runs: it stays, whatever the clock says
        assert not slot.retire(slot_mod.RETIRE_IDLE_SECONDS)
    assert slot._trial.acquire(blocking=False)  # a refusal leaves the trial lock free
    slot._trial.release()
    assert slot.home.is_dir()
    with pytest.raises(_Exited):
        slot.retire(slot_mod.RETIRE_IDLE_SECONDS)
    assert not slot.home.exists()  # its files go with it, as when it idles out


def test_slots_that_predate_retire_are_retired_by_a_function_shipped_by_value(slot: Slot) -> None:
    # Ray pickles with cloudpickle, which ships a function by reference when it can be imported by name:
    # an old slot's forgelib has no `retirement`, so the function must not be importable that way.
    fn = slot_mod.retirement(slot_mod.RETIRE_IDLE_SECONDS)
    assert "<locals>" in fn.__qualname__
    assert not fn(object())  # not a slot as it knows them: left alone
