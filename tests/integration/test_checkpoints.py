"""Checkpoints on the real engine. The cache pack (postgres, redis, two HTTP services, a workspace) is
changed through its services, checkpointed and forked 4 times; each fork observes what the source held at
capture (rows, schema, roles, keys, files, the services' answers); changing one fork changes no other and
not the source; restore brings a fork and the source back in place; a changed checkpoint and an unknown
id are refused; `forge snapshots ls` lists the checkpoint and `prune` removes it; nothing is left
afterwards. A stack that is not forge's is refused. A process killed (-9) in the middle of a capture or
of a fork leaves nothing after `forge reap --run` (a complete checkpoint stays: it is pruned, not reaped).
One source stack serves the whole cache-pack proof: CI's time."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.stacks import IDLE, PG, REDIS, TIMEOUTS, make_project

from benchmarks.checkpoint_pack import checkpointable_cache_pack
from forgelib import stacks
from forgelib.docker import labels as lab
from forgelib.docker.compose import ComposeProject
from forgelib.docker.configmemo import ConfigMemo
from forgelib.runner import SubprocessRunner
from forgelib.spec.models import Checkpointing, Project, SeedKind, Task
from forgelib.stacks import checkpoints
from forgelib.stacks.provision import DEFAULT_TASK
from forgelib.stacks.snapshots import checkpoints as ckstore
from forgelib.stacks.snapshots import store
from forgelib.stacks.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]


def _project(tmp: Path, name: str) -> Project:
    (tmp / "seed.sql").write_text("create table t (v text); insert into t values ('seeded');\n")
    tree = tmp / "tree"
    tree.mkdir()
    (tree / "a.txt").write_text("a")
    rdb = Path(__file__).resolve().parents[2] / "examples/multi_service_cache_debug/assets/cache_poisoned.rdb"
    return make_project(
        tmp / "p",
        {
            "db": PG,
            "cache": {**REDIS, "command": ["redis-server", "--save", "", "--appendonly", "no"]},
            "ws": {**IDLE, "volumes": ["work:/workspace"]},
            "app": IDLE,
        },
        seeds={
            "sql": (tmp / "seed.sql", SeedKind.SQL_DUMP),
            "rdb": (rdb, SeedKind.REDIS_DUMP),
            "tree": (tree, SeedKind.FILESYSTEM_DIR),
        },
        reset={"db": "sql", "cache": "rdb", "ws": "tree"},
        volumes={"work": {}},
        name=name,
    )


def _sh(t: Stack, svc: str, cmd: str) -> str:
    return t.compose.exec(svc, ["sh", "-c", cmd], timeout=30).stdout.strip()


def _service_log(runner: SubprocessRunner, t: Stack, svc: str) -> str:
    [info] = t.compose.served([svc])[svc]
    res = runner.run(["docker", "logs", str(info["Id"])], timeout=30)
    return res.stdout + res.stderr


def _forge(*args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "forgelib", *args], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def _checkpoint_rows(project: str) -> list[dict[str, object]]:
    rows = json.loads(_forge("snapshots", "ls", "--project", project, "--json"))
    return [r for r in rows if r["type"] == "checkpoint"]


def _source(opened: stacks.Stacks, tmp_path: Path) -> Stack:
    """A stack of the project's environment, torn down when ``opened`` closes."""
    assert opened.project is not None
    task = Task(DEFAULT_TASK, opened.project.path, "", opened.project.environment)
    trial = opened.backend.provision(
        task, run_id=f"ck-{secrets.token_hex(3)}", trial_index=0, trial_dir=tmp_path
    )
    opened.live.add(trial.name, lambda graceful: opened.backend.teardown(trial, graceful=graceful))
    return trial


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[stacks.Stacks]:
    name = f"ck{secrets.token_hex(3)}"
    with stacks.open(_project(tmp_path, name), scope="stack", timeouts=TIMEOUTS, signals=False) as s:
        yield s
    assert not s.left
    left = lab.resources_with_labels(SubprocessRunner(), {lab.MANAGED: "true"})
    assert not [n for kind in left.values() for n in kind if name in n], left


APP_SQL = "psql -U app -d app -Atc"
# the agent's workstation's reads and writes through the two HTTP services (cache-admin's ttl counts down:
# left out)
HTTP_GET = """python3 -c '
import json, sys, urllib.request
d = json.load(urllib.request.urlopen(sys.argv[1], timeout=20))
d.pop("ttl", None)
print(json.dumps(d, sort_keys=True))' """
HTTP_POST = """python3 -c '
import json, sys, urllib.request
h = {"Content-Type": "application/json"}
r = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), headers=h)
print(urllib.request.urlopen(r, timeout=20).read().decode())' """


def _observe_pack(t: Stack) -> dict[str, str]:
    """Rows, schema, roles, keys and files of the cache pack, and what its two services answer."""
    return {
        "rows": _sh(t, "app-db", f"{APP_SQL} 'select * from orders order by id' "
                                 f"-c 'select * from order_status_updates order by id'"),
        "schema": _sh(t, "app-db", f"{APP_SQL} '\\d orders' -c '\\dt'"),
        "roles": _sh(t, "app-db", f"{APP_SQL} 'select rolname from pg_roles order by 1'"),
        "keys": _sh(t, "redis", "for k in $(redis-cli --raw KEYS '*' | sort); do echo \"$k\"; "
                                "redis-cli --raw GET \"$k\"; done"),
        "files": _sh(t, "runner", "cd /work/notes && find . -type f | sort | xargs -r md5sum"),
        "api": _sh(t, "runner", f"{HTTP_GET} http://orders-api:8000/orders/4022/source"),
        "admin": _sh(t, "runner", f"{HTTP_GET} http://cache-admin:8000/cache/order:4021"),
    }  # fmt: skip


def _change_pack(t: Stack, order: int, status: str, note: str) -> None:
    """A status update through orders-api (a row and its audit row), its read (the cache fills), a note."""
    _sh(t, "runner", f'{HTTP_POST} http://orders-api:8000/orders/{order} \'{{"status": "{status}"}}\'')
    _sh(t, "runner", f"{HTTP_GET} http://orders-api:8000/orders/{order}")
    _sh(t, "runner", f"echo {note} > /work/notes/{note}.md")


def _containers(t: Stack) -> dict[str, str]:
    """service -> the ID of its running container."""
    return {svc: str(found[0]["Id"]) for svc, found in t.compose.served().items() if found}


def _ours_left(runner: SubprocessRunner, names: set[str], run_ids: set[str], ids: list[str]) -> list[str]:
    """Containers, networks and volumes (anonymous ones too: by their compose project) of stacks ``names``,
    checkpoint images of ``ids``, and host build directories of runs ``run_ids``."""
    left = []
    for kind, fmt in (("container", "{{.Names}}"), ("network", "{{.Name}}"), ("volume", "{{.Name}}")):
        argv = ["docker", kind, "ls", "--format", fmt + ' {{.Label "com.docker.compose.project"}}']
        if kind == "container":
            argv.insert(3, "-a")
        for line in runner.run(argv, timeout=60).stdout.splitlines():
            name, _, project = line.partition(" ")
            if project.strip() in names or any(n in name for n in names):
                left.append(f"{kind} {name}")
    for cid in ids:
        flt = ["--filter", f"label={ckstore.CHECKPOINT}={cid}"]
        found = runner.run(["docker", "image", "ls", "-q", *flt], timeout=60).stdout.split()
        left += [f"image {i}" for i in found]
    base = store.state_dir()
    builds = sorted(base.glob(store.BUILD_DIR + "*")) if base.is_dir() else []
    return left + [f"build dir {d}" for d in builds if store.build_run(d) in run_ids]


def test_the_cache_pack_checkpointed_forked_4_times_and_restored_leaves_nothing(
    tmp_path: Path, runner: SubprocessRunner
) -> None:
    """The proof on the cache pack (postgres, redis, two HTTP services, a workspace), one shared source."""
    name = f"ckpack{secrets.token_hex(3)}"
    project = checkpointable_cache_pack(tmp_path / "pack", name)
    ids: list[str] = []
    names: set[str] = set()
    run_ids: set[str] = set()
    removed: list[str | None] = []
    try:
        with stacks.open(project, scope="stack", timeouts=TIMEOUTS, signals=False) as opened:
            source = _source(opened, tmp_path)
            names.add(source.name)
            run_ids.add(source.labels[lab.RUN])
            seeded = _observe_pack(source)
            _change_pack(source, 4022, "shipped", "diagnosis")
            ddl = "'create role analyst' -c 'alter table orders add column note text'"
            _sh(source, "app-db", f"{APP_SQL} {ddl}")
            at_capture = _observe_pack(source)
            assert at_capture != seeded and "order:4022" in at_capture["keys"]
            assert "diagnosis.md" in at_capture["files"]
            assert "analyst" in at_capture["roles"] and "note" in at_capture["schema"]

            ck = checkpoints.checkpoint(opened, source)
            ids.append(ck.id)
            # the reset services; the two HTTP services are not captured: a fork starts them fresh
            assert set(ck.services) == {"app-db", "redis", "runner"}
            assert ck.manifest["source"] == source.name
            # the capture changed nothing, and the stack runs again
            assert _observe_pack(source) == at_capture
            [row] = _checkpoint_rows(name)
            assert (row["id"], row["state"], row["source"]) == (ck.id, "complete", source.name)
            assert row["services"] == ["app-db", "redis", "runner"]
            assert isinstance(row["bytes"], int) and row["bytes"] > 0

            fork_run = f"fork-{secrets.token_hex(3)}"
            run_ids.add(fork_run)
            forks = checkpoints.fork(opened, ck.id, 4, trial_dir=tmp_path / "forks", run_id=fork_run)
            names |= {f.name for f in forks}
            assert len(names) == 5
            for f in forks:
                assert _observe_pack(f) == at_capture
                assert {f.snapshots[s]["outcome"] for s in ck.services} == {"forked"}
                # settled at capture: a fork's postgres starts from a cleanly shut-down directory
                log = _service_log(runner, f, "app-db")
                assert "database system is ready to accept connections" in log, log
                assert "database system was interrupted" not in log and "redo starts" not in log, log
            # independent: a change to one fork reaches no other fork and not the source
            _change_pack(forks[0], 4017, "returned", "fork0")
            changed = _observe_pack(forks[0])
            assert changed != at_capture and "fork0.md" in changed["files"]
            for other in [*forks[1:], source]:
                assert _observe_pack(other) == at_capture

            # restore in place, each kind's own way in its running container (postgres restarted by the
            # supervisor loop, redis's keys put back by its commands, the tree unpacked): a fork
            before = _containers(forks[0])
            forks[0] = checkpoints.restore(opened, forks[0], ck.id)
            assert _observe_pack(forks[0]) == at_capture
            assert {f"restore:{s}" for s in ck.services} <= set(forks[0].timings)
            assert _containers(forks[0]) == before
            # and the source
            _change_pack(source, 4021, "lost", "after")
            _sh(source, "app-db", f"{APP_SQL} 'drop role analyst' -c 'alter table orders drop column note'")
            assert _observe_pack(source) != at_capture
            before = _containers(source)
            source = checkpoints.restore(opened, source, ck.id)
            assert _observe_pack(source) == at_capture
            _change_pack(source, 4021, "lost", "again")  # a second restore: what changed since the first
            source = checkpoints.restore(opened, source, ck.id)
            assert _observe_pack(source) == at_capture
            assert _containers(source) == before
            # what redis's in-place restore leaves alone (its configuration) changed: restarted from the image
            _sh(source, "redis", "redis-cli CONFIG SET maxmemory-policy allkeys-lru && redis-cli SET extra 1")
            source = checkpoints.restore(opened, source, ck.id)
            assert _observe_pack(source) == at_capture
            assert _sh(source, "redis", "redis-cli CONFIG GET maxmemory-policy").split()[-1] == "noeviction"
            assert _containers(source)["app-db"] == before["app-db"]
            for f in forks[1:]:
                assert _observe_pack(f) == at_capture

            # refused: an unknown id, a checkpoint whose image changed, a stack that is not forge's
            with pytest.raises(ckstore.CheckpointError, match="no checkpoint"):
                checkpoints.fork(opened, "ck-000000000000", 1, trial_dir=tmp_path / "x")
            with pytest.raises(ckstore.CheckpointError, match="not a checkpoint id"):
                checkpoints.fork(opened, "nonsense", 1, trial_dir=tmp_path / "x")
            runner.run(["docker", "tag", "forgelib/redis:7.0", ckstore.tag_of(ck.id, "redis")], timeout=30)
            with pytest.raises(ckstore.CheckpointError, match="changed since capture"):
                checkpoints.fork(opened, ck.id, 1, trial_dir=tmp_path / "x")
            with pytest.raises(ckstore.CheckpointError, match="changed since capture"):
                checkpoints.restore(opened, source, ck.id)

            # prune takes it whole, changed as it is, once no container runs its images (the forks')
            for t in [*forks, source]:
                assert opened.live.teardown(t.name) is None
            pruned = json.loads(_forge("snapshots", "prune", "--checkpoint", ck.id, "--json"))
            assert [(r["id"], r["action"]) for r in pruned] == [(ck.id, "removed")], pruned
            assert _checkpoint_rows(name) == []
        assert not opened.left
    finally:  # after the stacks: a container of theirs may run its images
        removed = [ckstore.remove(runner, cid) for cid in ids]  # pruned already, unless an assertion failed
    assert removed == [None] * len(ids)
    assert _ours_left(runner, names, run_ids, ids) == []


def test_a_stack_that_is_not_forges_is_refused(
    opened: stacks.Stacks, tmp_path: Path, runner: SubprocessRunner
) -> None:
    assert opened.project is not None
    source = _source(opened, tmp_path)
    # the same project's containers as compose sees them, but one without forge's labels
    infos = source.compose.inspect()
    labels = dict(lab.of_inspect(infos[0]))
    assert labels[lab.MANAGED] == "true"
    fake = [{**infos[0], "Config": {**infos[0]["Config"], "Labels": {**labels, lab.MANAGED: "false"}}}]
    with pytest.raises(ckstore.CheckpointError, match="not forge's"):
        checkpoints._owned(source, fake)
    other = {**labels, lab.OWNER_PID: "1", lab.OWNER_START_TIME: lab.pid_start_time(1) or "?"}
    with pytest.raises(ckstore.CheckpointError, match="another running forge process"):
        checkpoints._owned(source, [{**infos[0], "Config": {**infos[0]["Config"], "Labels": other}}])


def test_a_reset_service_marked_fresh_is_not_captured_and_a_fork_seeds_it_anew(
    tmp_path: Path, runner: SubprocessRunner
) -> None:
    name = f"ck{secrets.token_hex(3)}"
    project = _project(tmp_path, name)
    env = project.environment
    services = {
        **env.services,
        "cache": dataclasses.replace(env.services["cache"], checkpoint=Checkpointing.FRESH),
    }
    project = dataclasses.replace(project, environment=dataclasses.replace(env, services=services))
    with stacks.open(project, scope="stack", timeouts=TIMEOUTS, signals=False) as opened:
        source = _source(opened, tmp_path)
        seeded_keys = _sh(source, "cache", "redis-cli --scan | sort")
        _sh(source, "db", "psql -U postgres -Atc \"insert into t values ('changed')\"")
        _sh(source, "cache", "redis-cli SET changed yes")
        _sh(source, "ws", "echo changed > /workspace/changed.txt")
        ck = checkpoints.checkpoint(opened, source)
        try:
            assert sorted(ck.services) == ["db", "ws"]  # cache said fresh, app is ephemeral
            assert ck.manifest["fresh"] == ["app", "cache"]
            [fork] = checkpoints.fork(opened, ck.id, 1, trial_dir=tmp_path / "forks")
            assert fork.snapshots == {
                "db": {"outcome": "forked", "checkpoint": ck.id},
                "ws": {"outcome": "forked", "checkpoint": ck.id},
            }
            # the captured services at the source's state, the fresh one at its seed
            assert _sh(fork, "db", "psql -U postgres -Atc 'select v from t order by v'") == "changed\nseeded"
            assert _sh(fork, "ws", "cat /workspace/changed.txt") == "changed"
            assert seeded_keys and "changed" in _sh(source, "cache", "redis-cli --scan").split()
            assert _sh(fork, "cache", "redis-cli --scan | sort") == seeded_keys
        finally:
            ckstore.remove(runner, ck.id, 120)
    assert not opened.left
    left = lab.resources_with_labels(runner, {lab.MANAGED: "true"})
    assert not [n for kind in left.values() for n in kind if name in n], left


# A process that provisions the stack of `_project` and checkpoints it; its capture holds once the first
# service image is built (so the kill lands mid-capture, never after the manifest), saying so in a file.
CAPTURE_THEN_HOLD = """
import signal, sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/integration"]
from support.stacks import TIMEOUTS
from test_checkpoints import _project
from forgelib import stacks
from forgelib.spec.models import Task
from forgelib.stacks import checkpoints
from forgelib.stacks.provision import DEFAULT_TASK
from forgelib.stacks.snapshots import checkpoints as ckstore

tmp, name, run_id = Path(sys.argv[2]), sys.argv[3], sys.argv[4]
build = ckstore.build_service_image

def build_then_hold(runner, **kw):
    image = build(runner, **kw)
    (tmp / "held").write_text(kw["checkpoint_id"])
    signal.pause()

ckstore.build_service_image = build_then_hold
with stacks.open(_project(tmp, name), scope="stack", timeouts=TIMEOUTS, signals=False) as opened:
    task = Task(DEFAULT_TASK, opened.project.path, "", opened.project.environment)
    trial = opened.backend.provision(task, run_id=run_id, trial_index=0, trial_dir=tmp)
    checkpoints.checkpoint(opened, trial)
"""


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _reap(run_id: str, *, check: bool = True) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "forgelib", "reap", "--run", run_id],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0 or not check, res.stdout + res.stderr


def _of_run(runner: SubprocessRunner, run_id: str) -> dict[str, list[str]]:
    """Containers, networks, volumes and checkpoint images of ``run_id``."""
    left = lab.resources_with_labels(runner, {lab.RUN: run_id})
    flt = ["--filter", f"label={lab.RUN}={run_id}", "--filter", f"label={ckstore.CHECKPOINT}"]
    images = runner.run(["docker", "image", "ls", "-q", "--no-trunc", *flt], timeout=60).stdout.split()
    return {**left, "images": images}


def test_kill_9_mid_checkpoint_then_reap_leaves_nothing(
    tmp_path: Path, runner: SubprocessRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 of a process mid-capture (one service image built, no manifest), then `forge reap --run`:
    no checkpoint image, container, network or volume of it is left, nor its host build directory (the
    copied data, in this test's state dir: provably its dead owner's, and of that run)."""
    name, run_id = f"ck{secrets.token_hex(3)}", f"ckkill-{secrets.token_hex(3)}"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the child inherits it
    tests = str(Path(__file__).resolve().parents[1])
    argv = [sys.executable, "-c", CAPTURE_THEN_HOLD, tests, str(tmp_path), name, run_id]
    err = tmp_path / "child.stderr"
    with err.open("w") as out:
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out, text=True)
    try:
        # the observable event: the first service image of the checkpoint is on the engine
        held, images = tmp_path / "held", []
        for _ in range(1200):
            if held.exists():
                images = _of_run(runner, run_id)["images"]
            if images or child.poll() is not None:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=0.5)
        assert images, f"the capture ended early (rc {child.poll()}): {err.read_text()[-2000:]}"
        cid = held.read_text()
        for pid in [child.pid, *_children(child.pid)]:
            os.kill(pid, signal.SIGKILL)
        child.wait(timeout=60)
        before = _of_run(runner, run_id)
        assert before["containers"] and before["images"], before  # the kill left the stack and the image
        # never a complete checkpoint: no fork or restore can take what the kill left
        assert not [
            c for c in ckstore.list_checkpoints(runner) if isinstance(c, ckstore.Checkpoint) and c.id == cid
        ]
        alive = lambda pid, start: lab.pid_start_time(int(pid)) == start  # noqa: E731
        assert [d.name.split("-")[1] for d in store.stale_build_dirs(alive, run_id)] == [str(child.pid)]
        _reap(run_id)
        assert _of_run(runner, run_id) == {"containers": [], "networks": [], "volumes": [], "images": []}
        assert store.stale_build_dirs(alive) == []  # the copied data went with the run
        assert not [c for c in ckstore.list_checkpoints(runner) if (c if isinstance(c, str) else c.id) == cid]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=60)
        _reap(run_id, check=False)


# A process that provisions the stack of `_project`, checkpoints it and forks it twice; the first fork holds
# once its services are up and verified (the kill lands mid-fork), saying so in a file.
FORK_THEN_HOLD = """
import signal, sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/integration"]
from support.stacks import TIMEOUTS
from test_checkpoints import _project
from forgelib import stacks
from forgelib.spec.models import Task
from forgelib.stacks import checkpoints
from forgelib.stacks.provision import DEFAULT_TASK

tmp, name, run_id, fork_run = Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
started = checkpoints.CheckpointSteps.started

def started_then_hold(self, *args):
    started(self, *args)
    (tmp / "held").write_text(self.checkpoint.id)
    signal.pause()

checkpoints.CheckpointSteps.started = started_then_hold
with stacks.open(_project(tmp, name), scope="stack", timeouts=TIMEOUTS, signals=False) as opened:
    task = Task(DEFAULT_TASK, opened.project.path, "", opened.project.environment)
    trial = opened.backend.provision(task, run_id=run_id, trial_index=0, trial_dir=tmp)
    ck = checkpoints.checkpoint(opened, trial)
    checkpoints.fork(opened, ck.id, 2, trial_dir=tmp / "forks", run_id=fork_run)
"""


def test_kill_9_mid_fork_then_reap_leaves_nothing_and_the_checkpoint_whole(
    tmp_path: Path, runner: SubprocessRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 of a process in the middle of a fork (its first stack up), then `forge reap --run` of the
    fork's run and of the source's: no container, network or volume of either is left, and the complete
    checkpoint is not the reaper's (it still forks) until it is pruned."""
    name, token = f"ck{secrets.token_hex(3)}", secrets.token_hex(3)
    run_id, fork_run = f"ckfk-{token}", f"ckfk-fork-{token}"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the child inherits it
    tests = str(Path(__file__).resolve().parents[1])
    argv = [sys.executable, "-c", FORK_THEN_HOLD, tests, str(tmp_path), name, run_id, fork_run]
    err = tmp_path / "child.stderr"
    with err.open("w") as out:
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out, text=True)
    held, cid = tmp_path / "held", ""
    try:
        for _ in range(1200):  # the observable event: the first fork is up
            if held.exists() or child.poll() is not None:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=0.5)
        assert held.exists(), f"the fork ended early (rc {child.poll()}): {err.read_text()[-2000:]}"
        cid = held.read_text()
        for pid in [child.pid, *_children(child.pid)]:
            os.kill(pid, signal.SIGKILL)
        child.wait(timeout=60)
        assert _of_run(runner, fork_run)["containers"], "the kill left no fork to reap"
        for run in (fork_run, run_id):
            _reap(run)
        nothing: dict[str, list[str]] = {"containers": [], "networks": [], "volumes": []}
        assert {k: v for k, v in _of_run(runner, fork_run).items() if k != "images"} == nothing
        assert {k: v for k, v in _of_run(runner, run_id).items() if k != "images"} == nothing
        assert set(ckstore.load(runner, cid).services) == {"db", "cache", "ws"}  # complete: kept
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=60)
        if cid:
            assert ckstore.remove(runner, cid) is None
        for run in (fork_run, run_id):
            _reap(run, check=False)
    assert _of_run(runner, run_id)["images"] == []


def test_the_forks_one_resolved_config_is_what_compose_resolves_for_each(tmp_path: Path) -> None:
    """The compose config a fork call resolves once (``ConfigMemo``, the run's) is, renamed, exactly what
    ``docker compose config`` prints for each fork's own project name: its network, a named volume, and
    ``${COMPOSE_PROJECT_NAME}`` interpolated in a service's environment."""
    project = checkpointable_cache_pack(tmp_path / "pack", f"ckcfg{secrets.token_hex(2)}")
    written = project.environment.compose_files[0]
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        "services:\n  runner:\n    environment:\n      STACK: ${COMPOSE_PROJECT_NAME}-x\n"
        "    volumes: [data:/data]\nvolumes:\n  data: {}\n"
    )
    runner = SubprocessRunner()
    configs = ConfigMemo()
    for name in (f"{project.name}-fork-1", f"{project.name}-fork-10"):
        compose = ComposeProject(name, (written, extra), runner, TIMEOUTS)
        resolved = configs.config(compose)
        assert resolved == compose.config()
        assert resolved["services"]["runner"]["environment"]["STACK"] == f"{name}-x"
