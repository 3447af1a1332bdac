"""Golden snapshots on the real engine: taken once and restored after; any change to what determines the
bytes (image, seed, init file, format version) takes a new golden and never restores the old one; a
corrupt golden is discarded and the trial passes the normal way; ls / verify / prune on real goldens;
Ctrl-C while a golden is written leaves nothing a later run would restore; two workers take it once."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.goldens import goldens_of, misstate, own_project
from support.stacks import PG, make_project, provision

from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import ProvisionError
from forgelib.kinds.postgres import seed as sql_dump
from forgelib.runner import SubprocessRunner
from forgelib.spec.models import Project, SeedKind
from forgelib.stacks import reaper as custody
from forgelib.stacks.provision import teardown_trial
from forgelib.stacks.snapshots import key, store
from forgelib.stacks.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def name(runner: SubprocessRunner) -> Iterator[str]:
    """A project name of its own; every golden taken under it is removed afterwards."""
    with own_project(runner, "gold") as n:
        yield n


def _project(
    root: Path, name: str, *, image: str = "forgelib/postgres:15", seed: str = "baseline"
) -> Project:
    root.mkdir(parents=True, exist_ok=True)
    (root / "seed.sql").write_text(f"update t set v = '{seed}';\n")
    init = root / "init.sql"
    if not init.exists():
        init.write_text(_init(name, "create table t (v text); insert into t values ('factory');"))
    db = {**PG, "image": image, "volumes": [f"{init}:/docker-entrypoint-initdb.d/init.sql:ro"]}
    return make_project(
        root, {"db": db}, seeds={"s": (root / "seed.sql", SeedKind.SQL_DUMP)}, reset={"db": "s"}, name=name
    )


def _init(name: str, sql: str) -> str:
    """An init file naming the test's project: a key is content, so without it a concurrent session of
    this test (another checkout on this engine) would have the same keys and restore or retag our goldens."""
    return f"-- {name}\n{sql}\n"


def _trial(
    project: Project, run_id: str, tmp_path: Path, runner: SubprocessRunner, idx: int
) -> tuple[dict[str, Any], str]:
    """Provision with snapshots, read the seeded row, tear down: (what the golden did, the row)."""
    t: Stack = provision(project, run_id, tmp_path, runner, idx, snapshots=True)
    try:
        row = t.compose.exec(
            "db", ["psql", "-U", "postgres", "-Atc", "select v from t"], timeout=30
        ).stdout.strip()
        return dict(t.snapshots["db"]), row
    finally:
        teardown_trial(t)


def test_taken_once_restored_after_and_every_key_change_takes_a_new_golden(
    tmp_path: Path, runner: SubprocessRunner, run_id: str, name: str
) -> None:
    root = tmp_path / "p"
    first, row = _trial(_project(root, name), run_id, tmp_path, runner, 0)
    assert (first["outcome"], row) == ("captured", "baseline")
    again, row = _trial(_project(root, name), run_id, tmp_path, runner, 1)
    assert (again, row) == ({"outcome": "restored", "golden": first["golden"]}, "baseline")
    seen = {first["golden"]}

    def changed(project: Project, idx: int, expect_row: str = "baseline") -> None:
        rec, row = _trial(project, run_id, tmp_path, runner, idx)
        assert rec["outcome"] == "captured" and rec["golden"] not in seen, rec  # never the old golden
        assert row == expect_row
        seen.add(rec["golden"])

    changed(_project(root, name, seed="other"), 2, "other")  # the seed
    (root / "init.sql").write_text(
        _init(name, "create table t (v text, w int); insert into t values ('factory', 1);")
    )
    changed(_project(root, name), 3)  # an init file's content, as the real resolved config mounts it
    # (forgelib's snapshot format, the recipe version and the options are the key's pure parts: unit tests)
    # the image: a second tag of the stand-in with one changed file
    tag = f"forgelib-test/postgres-golden:{secrets.token_hex(3)}"
    img = tmp_path / "image"
    img.mkdir()
    (img / "marker").write_text(f"changed {name}\n")  # not the build cache's image of another session
    (img / "Dockerfile").write_text("FROM forgelib/postgres:15\nCOPY marker /etc/forge-golden-test\n")
    runner.run(["docker", "build", "-q", "-t", tag, str(img)], timeout=300, env={"DOCKER_BUILDKIT": "0"})
    try:
        changed(_project(root, name, image=tag), 4)
        assert len(goldens_of(runner, name)) == 4

        # ls / verify / prune on these real goldens
        # scoped to this test's project: other sessions and users share this engine and its goldens
        ls = _forge("snapshots", "ls", "--project", name, "--json")
        mine = json.loads(ls.stdout)
        assert {r["project"] for r in mine} == {name} and {r["key"][:12] for r in mine} == seen
        assert all(r["complete"] and r["bytes"] > 0 for r in mine)
        assert {r["seed"] for r in mine} == {"s"} and {r["kind"] for r in mine} == {"sql_dump"}
        verify = json.loads(_forge("snapshots", "verify", "--project", name, "--json").stdout)
        assert {r["key"][:12]: r["action"] for r in verify} == dict.fromkeys(seen, "ok")
        older = _forge("snapshots", "prune", "--older-than", "1000", "--project", name, "--json")
        assert json.loads(older.stdout) == []
    finally:
        runner.run(["docker", "image", "rm", tag], timeout=120, check=False)
    # the second tag is gone: its golden can never be restored again, so --unused takes exactly it
    pruned = json.loads(_forge("snapshots", "prune", "--unused", "--project", name, "--json").stdout)
    assert [r["action"] for r in pruned] == ["removed"] and pruned[0]["key"][:12] in seen
    assert len(goldens_of(runner, name)) == 3


def test_captures_of_one_key_the_lock_does_not_serialise_each_stay_their_own_unvolumed_golden(
    tmp_path: Path, runner: SubprocessRunner, run_id: str, name: str
) -> None:
    """Two captures of one key in processes the key lock does not reach (another state directory, another
    host on this engine): the second runs entirely while the first is between its build and its load.
    Each golden keeps its own labels and data (none is loaded from the other's build), the key's tag
    names one of them, and a golden has no VOLUME at its path, so a container gets no volume for it."""
    path = "/var/lib/forge-golden-test"
    base_tag = f"forgelib-test/golden-base:{name}"
    ctx = tmp_path / "base"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM forgelib/debian:bookworm\nVOLUME {path}\nLABEL test={name}\n")
    runner.run(["docker", "build", "-q", "-t", base_tag, str(ctx)], timeout=300, env={"DOCKER_BUILDKIT": "0"})
    try:
        base_id = json.loads(runner.run(["docker", "image", "inspect", base_tag]).stdout)[0]["Id"]
        k = key.make_key(kind="sql_dump", recipe_version=1, image_id=base_id, seed_digest=name, options={},
                         service_config=ServiceConfig.of({}))  # fmt: skip

        def capture(who: str, r: Any) -> store.Golden:
            d = tmp_path / who
            (d / "src" / Path(path).name).mkdir(parents=True)
            (d / "src" / Path(path).name / "who").write_text(who)
            subprocess.run(
                ["tar", "-cf", str(d / "data.tar"), "-C", str(d / "src"), Path(path).name], check=True
            )
            labels = store.golden_labels(k, service="db", project=name, seed=who, path=path, state="{}",
                                         run_id=run_id, data_bytes=1, entries=2)  # fmt: skip
            return store.build(r, key=k, path=path, data_tar=d / "data.tar", labels=labels, timeout=300)

        class Interleaving:  # the other capture runs right after this one's `docker build`
            def run(self, argv: Any, **kw: Any) -> Any:
                res = runner.run(argv, **kw)
                if list(argv[:2]) == ["docker", "build"]:
                    capture("b", runner)
                return res

        a = capture("a", Interleaving())
        assert a.part("seed") == "a" and store.find(runner, k) == a  # the last load holds the tag
        mine = goldens_of(runner, name)
        assert sorted(g.part("seed") for g in mine) == ["a", "b"] and len({g.id for g in mine}) == 2
        for g in mine:  # each image holds its own capture's data, with no VOLUME at its path
            info = json.loads(runner.run(["docker", "image", "inspect", g.id]).stdout)[0]
            assert path not in (info["Config"].get("Volumes") or {})
            out = runner.run(["docker", "run", "--rm", "--entrypoint", "cat", g.id, f"{path}/who"]).stdout
            assert out == g.part("seed")
        # The golden left untagged is labelled like any capture cut short: once its owner is gone, the
        # reaper removes it; the tagged one is the user's to prune and stays.
        dead = dataclasses.replace(custody.local_facts(), pid_start_time=lambda pid: None)
        custody.reap(runner, run_id=run_id, facts=dead)
        assert [g.part("seed") for g in goldens_of(runner, name)] == ["a"]
    finally:
        runner.run(["docker", "image", "rm", base_tag], timeout=120, check=False)


def test_prune_never_removes_the_image_of_a_capture_still_running_in_another_process(
    tmp_path: Path, runner: SubprocessRunner, run_id: str, name: str
) -> None:
    """Between its `docker build` and the load that tags it, a capture's image is an untagged golden, as a
    discarded one is. `forge snapshots prune` (another process) runs right then: the image stays (its
    capturing process, this one, is alive), and the capture finishes as a complete golden."""
    path = "/var/lib/forge-golden-test"
    base_tag = f"forgelib-test/golden-base:{name}"
    ctx = tmp_path / "base"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM forgelib/debian:bookworm\nVOLUME {path}\nLABEL test={name}\n")
    runner.run(["docker", "build", "-q", "-t", base_tag, str(ctx)], timeout=300, env={"DOCKER_BUILDKIT": "0"})
    try:
        base_id = json.loads(runner.run(["docker", "image", "inspect", base_tag]).stdout)[0]["Id"]
        k = key.make_key(kind="sql_dump", recipe_version=1, image_id=base_id, seed_digest=name, options={},
                         service_config=ServiceConfig.of({}))  # fmt: skip
        (tmp_path / "src" / Path(path).name).mkdir(parents=True)
        (tmp_path / "src" / Path(path).name / "who").write_text("me")
        tar = ["tar", "-cf", str(tmp_path / "data.tar"), "-C", str(tmp_path / "src"), Path(path).name]
        subprocess.run(tar, check=True)
        pruned: list[dict[str, Any]] = []

        class PruneMidCapture:  # `forge snapshots prune` right after this capture's `docker build`
            def run(self, argv: Any, **kw: Any) -> Any:
                res = runner.run(argv, **kw)
                if list(argv[:2]) == ["docker", "build"]:
                    out = _forge("snapshots", "prune", "--all", "--project", name, "--json").stdout
                    pruned.extend(json.loads(out))
                    custody.reap(runner, run_id=run_id)  # the reaper's rule, which prune now shares
                return res

        labels = store.golden_labels(k, service="db", project=name, seed="s", path=path, state="{}",
                                     run_id=run_id, data_bytes=1, entries=2)  # fmt: skip
        g = store.build(PruneMidCapture(), key=k, path=path, data_tar=tmp_path / "data.tar", labels=labels,
                        timeout=300)  # fmt: skip
        assert [(r["action"], r["why"]) for r in pruned] == [("kept", "discarded (untagged)")], pruned
        assert "capture in flight" in pruned[0]["error"]
        assert g.complete and store.find(runner, k) == g
        out = runner.run(["docker", "run", "--rm", "--entrypoint", "cat", g.id, f"{path}/who"]).stdout
        assert out == "me"
    finally:
        runner.run(["docker", "image", "rm", base_tag], timeout=120, check=False)


def test_a_corrupt_golden_is_discarded_and_the_trial_passes_the_normal_way(
    tmp_path: Path, runner: SubprocessRunner, run_id: str, name: str
) -> None:
    root = tmp_path / "p"
    project = _project(root, name)
    first, _ = _trial(project, run_id, tmp_path, runner, 0)
    (golden,) = goldens_of(runner, name)
    path = golden.part("path")
    # Replace the golden under its own tag with one whose pg_control is truncated (the archive cut short):
    # postgres cannot start from it.
    ctx = tmp_path / "corrupt"
    ctx.mkdir()
    (ctx / "pg_control").write_bytes(b"")
    (ctx / "Dockerfile").write_text(f"FROM {golden.id}\nADD pg_control {path}/global/pg_control\n")
    runner.run(
        ["docker", "build", "-q", "-t", store.tag_of(golden.key), str(ctx)],
        timeout=300,
        env={"DOCKER_BUILDKIT": "0"},
    )
    rec, row = _trial(project, run_id, tmp_path, runner, 1)
    assert row == "baseline"  # the trial went on, seeded the normal way
    assert (
        rec["discarded"]["golden"] == first["golden"]
        and "did not start from the golden" in rec["discarded"]["reason"]
    )
    # with the log tail of the container that did not start (read like a trial's captured logs)
    assert "pg_control" in rec["discarded"]["reason"].partition("log tail:\n")[2], rec
    # A golden that starts but restores other state than it was taken from: its fingerprint says so.
    runner.run(["docker", "image", "rm", "--force", golden.id], timeout=120, check=False)
    _trial(project, run_id, tmp_path, runner, 2)  # captures afresh (the bad one went with the discard)
    (golden,) = [g for g in goldens_of(runner, name) if g.complete]
    misstate(runner, golden, ctx, seeded_rows="0" * 64)
    rec, row = _trial(project, run_id, tmp_path, runner, 3)
    assert row == "baseline" and "fingerprint parts differ: seeded_rows" in rec["discarded"]["reason"]
    assert not [g for g in goldens_of(runner, name) if g.complete]  # discarded: no trial restores it again


def test_prune_all_leaves_a_golden_a_trial_has_chosen_until_its_containers_exist(
    tmp_path: Path, runner: SubprocessRunner, run_id: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`forge snapshots prune --all` (another process) right after a trial chose its golden, before its
    containers exist (Docker would refuse then): the golden stays and the trial restores it; once the
    trial is over, the same prune removes it."""
    from forgelib.stacks.snapshots.trial import TrialGoldens

    project = _project(tmp_path / "p", name)
    first, _ = _trial(project, run_id, tmp_path, runner, 0)
    assert first["outcome"] == "captured"
    pruned: list[dict[str, Any]] = []
    plan = TrialGoldens.plan

    def plan_then_prune(self: TrialGoldens, *args: Any) -> Any:
        plans = plan(self, *args)
        out = _forge("snapshots", "prune", "--all", "--project", name, "--json").stdout
        pruned.extend(json.loads(out))
        return plans

    monkeypatch.setattr(TrialGoldens, "plan", plan_then_prune)
    rec, row = _trial(project, run_id, tmp_path, runner, 1)
    assert (rec, row) == ({"outcome": "restored", "golden": first["golden"]}, "baseline")
    assert [(r["action"], r["why"]) for r in pruned] == [("kept", "--all")], pruned
    assert "chosen it" in pruned[0]["error"]
    monkeypatch.undo()
    removed = json.loads(_forge("snapshots", "prune", "--all", "--project", name, "--json").stdout)
    assert [r["action"] for r in removed] == ["removed"], removed
    assert not goldens_of(runner, name)


def test_ctrl_c_while_a_golden_is_written_leaves_none_and_two_workers_take_it_once(
    tmp_path: Path, runner: SubprocessRunner, name: str
) -> None:
    state = Path(os.environ["XDG_STATE_HOME"]) / "forgelib" / "goldens"
    pack = tmp_path / "pack"
    subprocess.run(["cp", "-r", str(REPO / "tests/fixtures/run_project"), str(pack)], check=True)
    yaml_path = pack / "project.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("name: run_project", f"name: {name}"))
    compose = pack / "shared" / "compose.yaml"  # a key of this test's own (see _init)
    compose.write_text(
        compose.read_text().replace("POSTGRES_DB: app", f"POSTGRES_DB: app\n      GOLDEN_TEST: {name}")
    )
    cfg = pack / "run_configs" / "dev.yaml"
    before = set(state.glob("build-*")) if state.is_dir() else set()
    proc = subprocess.Popen(
        [sys.executable, "-m", "forgelib", "run", "--config", str(cfg), "--snapshots", "--repeats", "1",
         "--output", str(tmp_path / "runs")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "FORGE_LOG": str(tmp_path / "forge.log")},  # this run's log alone
    )  # fmt: skip
    try:
        # The capture's build directory appears once the seeded service is stopped for the copy.
        deadline = time.monotonic() + 240
        while not (set(state.glob("build-*")) - before) and proc.poll() is None:
            assert time.monotonic() < deadline, "the capture never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    # Ctrl-C is on record as an interruption: not a failed capture, not a provisioning stage's failure.
    log = tmp_path / "forge.log"
    (record,) = [yaml.safe_load(f.read_text()) for f in (tmp_path / "runs").glob("*/trials/*/*/trial.yaml")]
    assert record["termination_reason"] == "INTERRUPTED", record
    assert "capturing the golden failed" not in json.dumps(record)
    assert "could not capture a golden" not in err + (log.read_text() if log.exists() else "")
    assert not (set(state.glob("build-*")) - before)  # the host side of the capture is gone
    assert goldens_of(runner, name) == []  # nothing tagged, nothing labelled left behind
    # A later run takes the golden afresh, once, though two workers need it at the same moment.
    res = subprocess.run(
        [sys.executable, "-m", "forgelib", "run", "--config", str(cfg), "--snapshots", "--repeats", "2",
         "--workers", "2", "--output", str(tmp_path / "runs2")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    outcomes = sorted(_snapshot_outcomes(tmp_path / "runs2"))
    assert outcomes == ["captured", "restored"], outcomes
    assert len(goldens_of(runner, name)) == 1


def _snapshot_outcomes(runs: Path) -> list[str]:
    import yaml

    out = []
    for f in runs.glob("*/trials/*/*/trial.yaml"):
        out.append(yaml.safe_load(f.read_text())["snapshots"]["app-db"]["outcome"])
    return out


def _forge(*args: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [sys.executable, "-m", "forgelib", *args], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    return res


def test_the_seed_kinds_with_goldens_name_their_recipe_version() -> None:
    assert isinstance(sql_dump.RECIPE_VERSION, int) and sql_dump.SUPPORTS_GOLDEN


def test_custom_format_dumps_restore_and_incompatible_dumps_are_refused_before_applying(
    tmp_path: Path, runner: SubprocessRunner, run_id: str
) -> None:
    root = tmp_path / "src"
    src = _project(root, "pgdumpsrc")
    t = provision(src, run_id, tmp_path, runner, 0)
    archive = tmp_path / "seed.dump"
    try:  # a real pg_dump -Fc archive of the seeded database, from the stand-in's own pg_dump
        t.compose.run(
            ["exec", "-T", "db", "pg_dump", "-Fc", "-U", "postgres", "-d", "postgres"],
            stdout_path=archive,
            timeout=60,
        )
    finally:
        teardown_trial(t)
    assert archive.read_bytes().startswith(b"PGDMP")
    fresh = {**PG}  # no init file: the archive holds the table itself
    project = make_project(
        tmp_path / "c",
        {"db": fresh},
        seeds={"s": (archive, SeedKind.SQL_DUMP)},
        reset={"db": "s"},
        name="pgrestore",
    )
    t = provision(project, run_id, tmp_path, runner, 1)
    try:
        row = t.compose.exec(
            "db", ["psql", "-U", "postgres", "-Atc", "select v from t"], timeout=30
        ).stdout.strip()
        assert row == "baseline"
    finally:
        teardown_trial(t)
    # refused before anything is applied, naming both versions and the fix
    newer = tmp_path / "newer.sql"
    newer.write_text(
        "--\n-- Dumped from database version 17.6\n-- Dumped by pg_dump version 17.6\n--\n"
        "SET transaction_timeout = 0;\n"
    )
    future = tmp_path / "future.dump"
    head = bytearray(archive.read_bytes())
    head[5:8] = bytes([1, 99, 0])  # an archive format no pg_restore of today reads
    future.write_bytes(bytes(head))
    for seed, words in (
        (newer, "pg_dump 17.6, but the service runs PostgreSQL 15."),
        (future, "custom format 1.99"),
    ):
        bad = make_project(
            tmp_path / seed.stem,
            {"db": fresh},
            seeds={"s": (seed, SeedKind.SQL_DUMP)},
            reset={"db": "s"},
            name="pgrefuse",
        )
        with pytest.raises(ProvisionError) as err:
            provision(bad, run_id, tmp_path, runner, 2)
        assert err.value.stage == "reset_recipe" and "preflight step" in err.value.reason
        assert words in err.value.reason and "re-dump" in err.value.reason, err.value.reason
