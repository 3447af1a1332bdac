"""Checkpoints on the real engine: a stack of postgres, redis, a tree and an ephemeral service is changed
through its services, checkpointed, forked twice (two keeps CI's time small); each fork observes what the
source held at capture; changing one fork changes neither the other nor the source; restore brings the
source back; a changed checkpoint, an unknown id and a stack that is not forge's are refused; `forge
snapshots ls` lists the checkpoint and `prune` removes it; nothing is left afterwards, also after a
process is killed (-9) in the middle of a capture and `forge reap` runs."""

from __future__ import annotations

import contextlib
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

from forgelib import stacks
from forgelib.docker import labels as lab
from forgelib.runner import SubprocessRunner
from forgelib.spec.models import Project, SeedKind, Task
from forgelib.stacks import checkpoints
from forgelib.stacks.provision import DEFAULT_TASK
from forgelib.stacks.snapshots import checkpoints as ckstore
from forgelib.stacks.snapshots import store
from forgelib.stacks.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

PSQL = ["psql", "-U", "postgres", "-Atc"]


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


def _observe(t: Stack) -> dict[str, str]:
    """Rows, schema, roles, keys and files, as a trial would read them."""
    return {
        "rows": _sh(t, "db", "psql -U postgres -Atc 'select v from t order by v'"),
        "schema": _sh(t, "db", "psql -U postgres -Atc '\\d t'"),
        "roles": _sh(t, "db", "psql -U postgres -Atc 'select rolname from pg_roles order by 1'"),
        "keys": _sh(t, "cache", "redis-cli --raw KEYS '*' | sort; redis-cli --raw GET forge:k"),
        "files": _sh(t, "ws", "cd /workspace && find . -type f | sort | xargs -r md5sum"),
    }


def _change(t: Stack, mark: str) -> None:
    _sh(t, "db", f"psql -U postgres -c \"insert into t values ('{mark}')\"")
    _sh(t, "cache", f"redis-cli SET forge:k {mark}")
    _sh(t, "ws", f"echo {mark} > /workspace/{mark}.txt")


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


def test_checkpoint_fork_restore_and_nothing_left(
    opened: stacks.Stacks, tmp_path: Path, runner: SubprocessRunner
) -> None:
    assert opened.project is not None
    source = _source(opened, tmp_path)
    ids: list[str] = []
    forks: list[Stack] = []
    try:
        _change(source, "before")
        _sh(source, "db", "psql -U postgres -c 'create role forge_r; alter table t add column w int'")
        at_capture = _observe(source)
        ck = checkpoints.checkpoint(opened, source)
        ids.append(ck.id)
        assert set(ck.services) == {"db", "cache", "ws"}
        assert ck.manifest["source"] == source.name
        assert _observe(source) == at_capture  # the capture changed nothing, and the stack runs again
        [row] = _checkpoint_rows(opened.project.name)
        assert (row["id"], row["state"], row["source"]) == (ck.id, "complete", source.name)
        assert row["services"] == ["cache", "db", "ws"] and isinstance(row["bytes"], int) and row["bytes"] > 0

        forks = checkpoints.fork(opened, ck.id, 2, trial_dir=tmp_path / "forks")
        assert forks[0].compose.name != source.compose.name
        assert len({f.name for f in forks}) == 2
        for f in forks:
            assert _observe(f) == at_capture
            assert f.snapshots["db"]["outcome"] == "forked"
        # independent: a change to one fork reaches neither the other nor the source
        _change(forks[0], "fork0")
        assert _observe(forks[1]) == at_capture
        assert _observe(source) == at_capture
        assert _observe(forks[0]) != at_capture

        # restore: the source changed after capture comes back to it
        _change(source, "after")
        assert _observe(source) != at_capture
        source = checkpoints.restore(opened, source, ck.id)
        assert _observe(source) == at_capture

        # refused: an unknown id, a checkpoint whose image changed, a stack that is not forge's
        with pytest.raises(ckstore.CheckpointError, match="no checkpoint"):
            checkpoints.fork(opened, "ck-000000000000", 1, trial_dir=tmp_path / "x")
        with pytest.raises(ckstore.CheckpointError, match="not a checkpoint id"):
            checkpoints.fork(opened, "nonsense", 1, trial_dir=tmp_path / "x")
        runner.run(["docker", "tag", "forgelib/redis:7.0", ckstore.tag_of(ck.id, "cache")], timeout=30)
        with pytest.raises(ckstore.CheckpointError, match="changed since capture"):
            checkpoints.fork(opened, ck.id, 1, trial_dir=tmp_path / "x")
        with pytest.raises(ckstore.CheckpointError, match="changed since capture"):
            checkpoints.restore(opened, source, ck.id)

        # prune takes it whole, changed as it is, once no fork's container runs its images
        while forks:
            assert opened.live.teardown(forks.pop().name) is None
        pruned = json.loads(_forge("snapshots", "prune", "--checkpoint", ck.id, "--json"))
        assert [(r["id"], r["action"]) for r in pruned] == [(ck.id, "removed")], pruned
        assert _checkpoint_rows(opened.project.name) == []
    finally:
        for f in forks:  # a fork's container uses its checkpoint's images: it goes first
            assert opened.live.teardown(f.name) is None
        for cid in ids:
            assert ckstore.remove(runner, cid) is None
    assert not [c for c in ckstore.list_checkpoints(runner) if (c if isinstance(c, str) else c.id) in ids]


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
    no checkpoint image, container, network or volume of it is left. Its host build directory (the copied
    data) is an unscoped `forge reap`'s; here it is in this test's state dir, provably its dead owner's."""
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
        reap = subprocess.run(
            [sys.executable, "-m", "forgelib", "reap", "--run", run_id],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert reap.returncode == 0, reap.stdout + reap.stderr
        assert _of_run(runner, run_id) == {"containers": [], "networks": [], "volumes": [], "images": []}
        alive = lambda pid, start: lab.pid_start_time(int(pid)) == start  # noqa: E731
        assert [d.name.split("-")[1] for d in store.stale_build_dirs(alive)] == [str(child.pid)]
        assert not [c for c in ckstore.list_checkpoints(runner) if (c if isinstance(c, str) else c.id) == cid]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=60)
        subprocess.run(
            [sys.executable, "-m", "forgelib", "reap", "--run", run_id], capture_output=True, timeout=300
        )
