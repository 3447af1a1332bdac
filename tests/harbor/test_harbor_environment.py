"""harbor's ``forge`` environment on the real engine: the BaseEnvironment contract on one fresh stack of
the example task (exec's cwd/env/user/timeout, files and directories both ways, per-service operations),
then harbor's own CLI running the vandal task with warm stacks and the example with goldens.

One stack for the contract checks (module scope), one ``harbor run`` per mode proof: this file is the
whole harbor suite and runs in .ci/run's Python 3.12 venv.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from forgelib.harbor import ForgeEnvironment
from forgelib.runner import SubprocessRunner
from forgelib.stacks.snapshots import store

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "harbor_postgres_reset"
HARBOR = Path(sys.executable).with_name("harbor")
PROJECT = "harbor_postgres_reset"  # the example's project.yaml name: its goldens carry it

pytestmark = pytest.mark.integration


class Env:
    """A ForgeEnvironment driven on one event loop (the loop's end tears the stacks down, as harbor's)."""

    def __init__(self, env: ForgeEnvironment, loop: asyncio.AbstractEventLoop) -> None:
        self.env = env
        self.loop = loop

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.loop.run_until_complete(getattr(self.env, method)(*args, **kwargs))


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    trial_dir = tmp_path_factory.mktemp("trial")
    paths = TrialPaths(trial_dir)
    paths.mkdir()
    loop = asyncio.new_event_loop()
    e = ForgeEnvironment(
        environment_dir=EXAMPLE / "postgres_reset" / "environment",
        environment_name="postgres_reset",
        session_id="postgres_reset__test__env",
        trial_paths=paths,
        task_env_config=EnvironmentConfig(workdir="/work"),
    )
    driver = Env(e, loop)
    driver("start", force_build=False)
    assert e._stacks is not None
    run_id = e._stacks.run_id
    try:
        yield driver
    finally:
        try:
            driver("stop", delete=True)
        finally:
            pending = asyncio.all_tasks(loop)
            for t in pending:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()
        assert _ours(run_id) == [], "the stack outlived stop()"


def _ours(run_id: str, kind: str = "container") -> list[str]:
    """The run's containers (or volumes, networks) still on the engine, by forge's run label."""
    argv = ["docker", "ps", "-a", "--format", "{{.Names}}"] if kind == "container" else ["docker", kind, "ls"]
    if kind != "container":
        argv += ["--format", "{{.Name}}"]
    out = subprocess.run(
        [*argv, "--filter", f"label=io.forgelib.run={run_id}"], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def _harbor_run(task: Path, jobs: Path, job: str, *args: str) -> list[Path]:
    """``harbor run`` of ``task`` with the oracle agent on the forge environment; its trial directories."""
    run = subprocess.run(
        [str(HARBOR), "run", "-p", str(task), "--env", "forgelib.harbor:ForgeEnvironment", *args,
         "-a", "oracle", "-n", "1", "-o", str(jobs), "--job-name", job, "-y"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},  # offline: no model price list fetch
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return sorted(d for d in (jobs / job).iterdir() if d.is_dir())


def test_exec_honours_cwd_env_user_and_the_task_workdir(env: Env) -> None:
    r = env("exec", "pwd; echo $GREETING; id -un", env={"GREETING": "hi"})
    assert r.return_code == 0
    assert r.stdout.split() == ["/work", "hi", "root"]
    r = env("exec", "pwd; id -u", cwd="/tmp", user="nobody")
    assert r.stdout.split() == ["/tmp", "65534"]
    r = env("exec", "echo out; echo err >&2; exit 3")
    assert (r.return_code, r.stdout, r.stderr) == (3, "out\n", "err\n")


def test_a_timed_out_command_raises_as_harbors_docker_does(env: Env) -> None:
    with pytest.raises(RuntimeError, match="Command timed out after 1 seconds"):
        env("exec", "sleep 30", timeout_sec=1)
    assert env("exec", "pgrep -f 'sleep 30' || echo gone").stdout.strip() == "gone"


def test_files_and_directories_go_both_ways(env: Env, tmp_path: Path) -> None:
    src = tmp_path / "up"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "sub" / "b.txt").write_text("B")
    env("upload_dir", src, "/work/in/deep")
    env("upload_file", src / "a.txt", "/work/single/a.txt")
    assert env("exec", "cat /work/in/deep/a.txt /work/in/deep/sub/b.txt /work/single/a.txt").stdout == "ABA"
    env("download_dir", "/work/in", tmp_path / "down")
    assert (tmp_path / "down" / "deep" / "sub" / "b.txt").read_text() == "B"
    env("download_file", "/work/single/a.txt", tmp_path / "one" / "a.txt")
    assert (tmp_path / "one" / "a.txt").read_text() == "A"


def test_service_operations_reach_the_other_services(env: Env, tmp_path: Path) -> None:
    query = "psql -U app -d app -tAc 'SELECT name FROM widgets WHERE id = 1'"
    r = env("service_exec", query, service="app-db")
    assert (r.return_code, r.stdout.strip()) == (0, "baseline")  # the seed, applied
    env("service_download_file", "/srv/widgets_api/app.py", tmp_path / "app.py", service="widgets-api")
    assert "FastAPI" in (tmp_path / "app.py").read_text()
    assert env("service_is_dir", "/srv/widgets_api", service="widgets-api") is True


def test_an_unknown_service_is_named_with_the_services_there_are(env: Env) -> None:
    with pytest.raises(ValueError, match=r"'nope' is not a service .* services: app-db, main, widgets-api"):
        env("service_exec", "true", service="nope")


def test_the_stack_carries_forges_labels(env: Env) -> None:
    trial = env.env._trial
    assert trial is not None
    out = subprocess.run(
        ["docker", "inspect", "--format", "{{json .Config.Labels}}", trial.compose.container("main")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    labels = json.loads(out.stdout)
    assert labels["io.forgelib.owner.pid"] == str(os.getpid())
    assert labels["io.forgelib.run"].startswith("harbor-")


def test_harbor_run_warm_resets_the_vandals_damage_between_attempts(tmp_path: Path) -> None:
    """harbor's CLI, oracle agent, -k 3 warm: one stack for every attempt, and each attempt's first
    observation (rewarded by the task's verifier) is a fresh stack's, though the one before wrecked it."""
    trials = _harbor_run(EXAMPLE / "vandal", tmp_path, "v", "--ek", "stacks=warm", "-k", "3")
    assert len(trials) == 3
    expected = (EXAMPLE / "vandal" / "tests" / "expected_first_seen.txt").read_text()
    stacks = set()
    for t in trials:
        assert (t / "verifier" / "reward.txt").read_text().strip() == "1", t
        assert (t / "agent" / "first_seen.txt").read_text() == expected
        record = json.loads((t / "forge_stack.json").read_text())
        stacks.add(record["stack"])
        assert record["mode"] == "warm"
        # A reused attempt's main came with harbor's log directories (made before it started, off the
        # trial's path); first_seen.txt above shows them as the first attempt's ensure_dirs made them.
        assert record["furnished"] is (record["reuse"] > 0), record
        grade = json.loads((t / "verifier" / "forge_grade.json").read_text())
        assert grade["pass"] is False  # forge's grading.yaml saw the damage before the reset
    assert len(stacks) == 1
    left = subprocess.run(
        ["docker", "ps", "-a", "--filter", "label=io.forgelib.managed", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert str(next(iter(stacks))) not in left


def test_harbor_run_with_goldens_captures_one_golden_and_restores_it(tmp_path: Path) -> None:
    """harbor's CLI, oracle agent, -k 3 with goldens: every reward 1.0; the first trial captures app-db's
    golden and the others start app-db from that same golden (forge's records, the golden's labels); the
    golden stays on the engine as docs/harbor.md says (a cache for later runs, `forge snapshots prune`),
    and nothing else of the run does."""
    # A copy of the example whose app-db config differs in one environment variable: a golden key of its
    # own, so its first trial captures (another run's golden of the example would be restored instead).
    task = tmp_path / "task"
    shutil.copytree(EXAMPLE / "postgres_reset", task)
    compose = task / "environment" / "docker-compose.yaml"
    marker = f"FORGE_TEST_RUN: {uuid.uuid4().hex}"
    db = "      POSTGRES_DB: app\n"
    text = compose.read_text()
    assert db in text, f"{compose}: app-db's environment changed; update this test"
    compose.write_text(text.replace(db, f"{db}      {marker}\n", 1))
    runner = SubprocessRunner()
    before = {g.id for g in store.list_goldens(runner, project=PROJECT)}
    ours: list[store.Golden] = []
    try:
        trials = _harbor_run(task, tmp_path / "jobs", "g", "--ek", "goldens=true", "-k", "3")
        ours = [g for g in store.list_goldens(runner, project=PROJECT) if g.id not in before]
        assert len(trials) == 3
        records = [json.loads((t / "forge_stack.json").read_text()) for t in trials]
        for t in trials:
            assert (t / "verifier" / "reward.txt").read_text().strip() == "1", t
            assert json.loads((t / "verifier" / "forge_grade.json").read_text())["pass"] is True, t
        assert {r["mode"] for r in records} == {"fresh"}
        assert len({r["stack"] for r in records}) == 3  # a stack of its own per trial
        outcomes = sorted(r["goldens"]["app-db"]["outcome"] for r in records)
        assert outcomes == ["captured", "restored", "restored"], records
        keys = {r["goldens"]["app-db"]["golden"] for r in records}
        assert len(keys) == 1, records  # every trial's golden is the one the first captured
        # Kept, as the docs say: one golden image of this project, labelled with that key and service.
        assert len(ours) == 1, ours
        assert ours[0].key.startswith(keys.pop())
        assert ours[0].labels[store.SERVICE] == "app-db"
        run_ids = {r["run_id"] for r in records}
        assert len(run_ids) == 1
        run_id = run_ids.pop()
        for kind in ("container", "volume", "network"):
            assert _ours(run_id, kind) == [], f"{kind}s of {run_id} left"
    finally:
        for g in ours or [g for g in store.list_goldens(runner, project=PROJECT) if g.id not in before]:
            assert store.remove(runner, g) is None
            store.forget(g.key)
    assert [g for g in store.list_goldens(runner, project=PROJECT) if g.id not in before] == []


def test_harbor_run_warm_with_goldens_starts_its_stack_from_an_earlier_jobs_golden(tmp_path: Path) -> None:
    """harbor's CLI, oracle agent: a one-trial goldens job takes the vandal task's golden, then a -k 3 warm
    job with goldens starts its one stack's app-db from that golden (no recipe), and every attempt's first
    observation is still a fresh stack's, though the one before wrecked it. Its goldens are removed."""
    task = tmp_path / "task"  # a copy of the vandal task with a golden key of its own (see the test above)
    shutil.copytree(EXAMPLE / "vandal", task)
    compose = task / "environment" / "docker-compose.yaml"
    db = "      POSTGRES_DB: app\n"
    text = compose.read_text()
    assert db in text, f"{compose}: app-db's environment changed; update this test"
    compose.write_text(text.replace(db, f"{db}      FORGE_TEST_RUN: {uuid.uuid4().hex}\n", 1))
    runner = SubprocessRunner()
    before = {g.id for g in store.list_goldens(runner, project=PROJECT)}
    try:
        (first,) = _harbor_run(task, tmp_path / "jobs", "take", "--ek", "goldens=true", "-k", "1")
        taken = json.loads((first / "forge_stack.json").read_text())["goldens"]["app-db"]
        assert taken["outcome"] == "captured", taken
        trials = _harbor_run(
            task, tmp_path / "jobs", "warm", "--ek", "stacks=warm", "--ek", "goldens=true", "-k", "3"
        )
        assert len(trials) == 3
        expected = (task / "tests" / "expected_first_seen.txt").read_text()
        records = [json.loads((t / "forge_stack.json").read_text()) for t in trials]
        for t in trials:
            assert (t / "verifier" / "reward.txt").read_text().strip() == "1", t
            assert (t / "agent" / "first_seen.txt").read_text() == expected, t
        assert {r["mode"] for r in records} == {"warm"} and len({r["stack"] for r in records}) == 1
        provisioned = next(r for r in records if r["reuse"] == 0)
        assert provisioned["goldens"]["app-db"] == {"outcome": "restored", "golden": taken["golden"]}
        assert not [p for p in provisioned["timings"] if p.startswith("recipe:")], provisioned["timings"]
        assert "warm_prepare" in provisioned["timings"]
        assert sorted(r["reuse"] for r in records) == [0, 1, 2] and not any(r["replaced"] for r in records)
    finally:
        for g in [g for g in store.list_goldens(runner, project=PROJECT) if g.id not in before]:
            assert store.remove(runner, g) is None
            store.forget(g.key)
    assert [g for g in store.list_goldens(runner, project=PROJECT) if g.id not in before] == []
