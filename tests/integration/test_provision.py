"""Provisioning on the real engine: the commands, the shared backend, non-recipe stages and Ctrl-C, each
leaving nothing behind (checked by the run's labels)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from support.stacks import IDLE, PG, REDIS, TIMEOUTS, make_project, provision

from forgelib.cli.commands import main_provision, main_teardown
from forgelib.docker import labels as lab
from forgelib.errors import ProvisionError
from forgelib.runner import SubprocessRunner
from forgelib.spec.digest import seed_digest
from forgelib.spec.models import Isolation, SeedKind
from forgelib.stacks import SharedStacks
from forgelib.stacks import reaper as custody
from forgelib.stacks.provision import OVERRIDE_FILE, StackContext, TrialSpec, provision_trial

pytestmark = pytest.mark.integration

NAME = "itprov"  # the project name, so these tests' compose projects read itprov-<run id>-...
SQL_SEED = (
    "create table widgets (id int primary key, name text);\ninsert into widgets values (1, 'baseline');\n"
)


def _write_pack(root: Path, isolation: str = "reset") -> None:
    (root / "assets").mkdir(parents=True)
    seed = root / "assets" / "baseline.sql"
    seed.write_text(SQL_SEED)
    pg = dict(PG) | {"ports": ["5432"]}
    (root / "compose.yaml").write_text(yaml.safe_dump({"services": {"app-db": pg, "runner": IDLE}}))
    project = {
        "name": "itpack",
        "description": "integration",
        "assets": {
            "seeds": {
                "baseline": {
                    "path": "assets/baseline.sql",
                    "kind": "sql_dump",
                    "digest": seed_digest(seed, SeedKind.SQL_DUMP),
                }
            }
        },
        "default_environment": {
            "compose_file": "compose.yaml",
            "services": {"app-db": {"isolation": "reset", "reset": {"seed": "baseline"}}}
            if isolation == "reset"
            else {"app-db": {"isolation": "shared"}, "runner": {"isolation": "shared"}},
        },
    }
    (root / "project.yaml").write_text(yaml.safe_dump(project))


def test_forge_provision_keep_then_teardown(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_pack(tmp_path / "pack")
    assert main_provision(str(tmp_path / "pack"), None, keep=True, as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    name = report["name"]
    try:
        assert report["teardown_command"] == f"forge teardown --name {name}"
        assert report["services"]["runner"] == []
        (published,) = report["services"]["app-db"]
        assert published.startswith("127.0.0.1:") and published.endswith("->5432/tcp")
        assert {"compose_config", "up_seeded", "recipe:app-db", "up_rest", "provision"} <= set(
            report["timings"]
        )
        live = lab.resources_with_labels(runner, {lab.COMPOSE_PROJECT: name, lab.RUN: report["run_id"]})
        assert len(live["containers"]) == 2 and len(live["networks"]) == 1
    finally:
        assert main_teardown(name) == 0
    assert lab.is_empty(lab.resources_with_labels(runner, {lab.COMPOSE_PROJECT: name}))
    assert "removed" in capsys.readouterr().out


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where tempfile puts forge's own directories during the test, so a leaked one is seen."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


@pytest.mark.parametrize("isolation", ["reset", "shared"])
def test_forge_provision_without_keep_tears_down(
    docker_ready: None,
    runner: SubprocessRunner,
    tmp_path: Path,
    private_tmp: Path,
    capsys: pytest.CaptureFixture[str],
    isolation: str,
) -> None:
    # All-shared too: `forge provision` has no run to share with, so it tears that stack down as well.
    _write_pack(tmp_path / "pack", isolation)
    assert main_provision(str(tmp_path / "pack"), None, keep=False, as_json=False) == 0
    out = capsys.readouterr().out
    name = out.splitlines()[0].removeprefix("compose project: ")
    assert (
        "app-db" in out and "->5432/tcp" in out and "teardown" in out and out.rstrip().endswith("torn down")
    )
    assert lab.is_empty(lab.resources_with_labels(runner, {lab.COMPOSE_PROJECT: name}))
    assert list(private_tmp.iterdir()) == []  # no /tmp/forge-provision-* left behind


def test_forge_provision_keep_of_an_all_shared_environment_is_labelled_kept(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_pack(tmp_path / "pack", "shared")
    assert main_provision(str(tmp_path / "pack"), None, keep=True, as_json=True) == 0
    name = json.loads(capsys.readouterr().out)["name"]
    try:
        every = lab.resources_with_labels(runner, {lab.COMPOSE_PROJECT: name})
        kept = lab.resources_with_labels(runner, {lab.COMPOSE_PROJECT: name, lab.KEPT: "true"})
        assert len(every["containers"]) == 2 and kept == every  # up, and every resource says "kept"
        # the reaper leaves a kept stack alone although its owner (this process) will exit
        (outcome,) = [o for o in custody.reap(runner, dry_run=True).outcomes if o.project == name]
        assert outcome.code == "kept"
    finally:
        assert main_teardown(name) == 0
    assert lab.is_empty(lab.resources_with_labels(runner, {lab.COMPOSE_PROJECT: name}))


def test_shared_backend_one_stack_for_the_run(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    project = make_project(tmp_path / "p", {"cache": REDIS}, isolation={"cache": Isolation.SHARED}, name=NAME)
    shared = SharedStacks()
    ctx = StackContext(project, TIMEOUTS, runner)
    first = shared.acquire(ctx, TrialSpec(None, run_id, 0, tmp_path / "trial-0"))
    first.compose.exec("cache", ["redis-cli", "SET", "k", "from-trial-0"], timeout=30)
    second = shared.acquire(ctx, TrialSpec(None, run_id, 1, tmp_path / "trial-1"))
    assert second.shared and second.name == first.name
    assert (
        second.compose.exec("cache", ["redis-cli", "GET", "k"], timeout=30).stdout.strip() == "from-trial-0"
    )
    assert shared.teardown_run(run_id) > 0


def test_missing_image_is_compose_up_stage(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    project = make_project(
        tmp_path / "p", {"x": {"image": "forgelib/does-not-exist:1"}, "idle": IDLE}, name=NAME
    )
    with pytest.raises(ProvisionError) as err:
        provision(project, run_id, tmp_path, runner)
    assert err.value.stage == "compose_up"
    assert "Error response from daemon" in err.value.reason  # the pull failed (offline: no such host)
    assert sorted(p.name for p in (tmp_path / "trial-0" / "services").iterdir()) == ["idle.log", "x.log"]


@pytest.mark.parametrize(("retries", "spaced"), [(1, None), (6, {"interval": "2s", "retries": 6})])
def test_unhealthy_service_is_readiness_stage(
    docker_ready: None,
    runner: SubprocessRunner,
    run_id: str,
    tmp_path: Path,
    retries: int,
    spaced: dict[str, object] | None,
) -> None:
    """Docker's verdict still comes, about when the compose file says: 1 s x 1 is kept as it is; 1 s x 6
    runs as 2 s x 6 (``compose.quiet_healthcheck``), unhealthy after 12 s, not at the compose_up timeout."""
    sick = dict(IDLE) | {"healthcheck": {"test": ["CMD", "false"], "interval": "1s", "retries": retries}}
    project = make_project(tmp_path / "p", {"sick": sick}, name=NAME)
    with pytest.raises(ProvisionError) as err:
        provision(project, run_id, tmp_path, runner)
    assert err.value.stage == "readiness"
    assert "unhealthy" in err.value.reason, err.value.reason
    override = yaml.safe_load(next(tmp_path.rglob(OVERRIDE_FILE)).read_text())
    health = override["services"]["sick"].get("healthcheck")
    assert health == spaced, health


def test_ctrl_c_mid_provision_leaves_nothing(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    seed = tmp_path / "seed.sql"
    seed.write_text(SQL_SEED)
    project = make_project(
        tmp_path / "p",
        {"app-db": PG, "idle": IDLE},
        seeds={"s": (seed, SeedKind.SQL_DUMP)},
        isolation={"app-db": Isolation.RESET},
        reset={"app-db": "s"},
        name=NAME,
    )

    def interrupt(phase: str, seconds: float) -> None:
        if phase == "up_seeded":  # the seeded services are up: now Ctrl-C
            assert not lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        provision_trial(
            StackContext(project, TIMEOUTS, runner),
            TrialSpec(None, run_id, 0, tmp_path / "trial-0", on_phase=interrupt),
        )
    assert "ready to accept connections" in (tmp_path / "trial-0" / "services" / "app-db.log").read_text()


def test_every_volume_a_trial_mounts_carries_its_labels(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    # postgres and redis images declare VOLUMEs; Docker would back them with unlabelled anonymous volumes,
    # which no label query (leak checks, `forge reap`) could find.
    project = make_project(tmp_path / "p", {"db": PG, "cache": REDIS}, name=NAME)
    trial = provision(project, run_id, tmp_path, runner)
    try:
        mounted = set()
        for container in lab.resources_with_labels(runner, {lab.RUN: run_id})["containers"]:
            out = runner.run(["docker", "inspect", "--format", "{{json .Mounts}}", container]).stdout
            mounted |= {m["Name"] for m in json.loads(out) if m["Type"] == "volume"}
        assert len(mounted) == 2  # /var/lib/postgresql/data and /data
        labelled = set(lab.resources_with_labels(runner, {lab.RUN: run_id})["volumes"])
        assert mounted <= labelled
    finally:
        trial.compose.down()


def test_a_kept_stack_survives_the_reaper_after_its_owner_exits(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    # `forge provision --keep` in its own process: when it returns, the stack's owner pid is gone for good,
    # which is exactly what the reaper removes — unless the stack says it was kept on purpose.
    _write_pack(tmp_path / "pack")
    argv = ["provision", "--project", str(tmp_path / "pack"), "--keep", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "forgelib", *argv], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    name, run, work_dir = report["name"], report["run_id"], Path(report["trial_dir"])
    try:
        outcomes = custody.reap(runner, run_id=run).outcomes
        assert [(o.project, o.action, o.code) for o in outcomes] == [(name, "kept", "kept")]
        live = lab.resources_with_labels(runner, {lab.RUN: run})
        assert len(live["containers"]) == 2
        # its directory (named after the dead owner) stays with the kept stack, whatever the reaper sees
        dry = custody.reap(runner, dry_run=True).outcomes
        assert work_dir.is_dir() and not [o for o in dry if any(str(work_dir) in r for r in o.removed)]
    finally:
        assert main_teardown(name) == 0
    assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run}))
    assert not work_dir.exists()  # `forge teardown` removed it with the stack


def test_depends_on_among_the_rest_still_orders_startup(
    docker_ready: None, runner: SubprocessRunner, run_id: str, tmp_path: Path
) -> None:
    # forgelib.docker.readiness starts the rest in depends_on order: `late` only once `slow` (also in the
    # rest) is healthy and the one-shot `migrate` exited 0 — `late` exits at once if it starts before either
    # marker exists — and `probe` (service_started) once `slow` started, without waiting for its health.
    seed = tmp_path / "tree"  # a cheap reset service (no postgres start-up): the first `up` is `db` alone
    seed.mkdir()
    (seed / "f").write_text("x\n")
    marker = "/shared/slow-ready"
    shared = [{"type": "volume", "source": "shared", "target": "/shared"}]
    slow = {
        **IDLE,
        "command": ["sh", "-c", f"sleep 2; touch {marker}; trap 'exit 0' TERM; sleep infinity & wait"],
        "healthcheck": {"test": ["CMD", "test", "-f", marker], "interval": "1s", "retries": 30},
        "volumes": shared,
        "depends_on": {"db": {"condition": "service_started"}},
    }
    migrated = "/shared/migrated"
    migrate = {**IDLE, "command": ["sh", "-c", f"sleep 1; touch {migrated}"], "volumes": shared}
    late = {
        **IDLE,
        "command": [
            "sh",
            "-c",
            f"test -f {marker} || exit 1; test -f {migrated} || exit 1; "
            "trap 'exit 0' TERM; sleep infinity & wait",
        ],
        "volumes": shared,
        "depends_on": {
            "slow": {"condition": "service_healthy"},
            "migrate": {"condition": "service_completed_successfully"},
        },
    }
    probe = {**IDLE, "depends_on": {"slow": {"condition": "service_started"}}}
    project = make_project(
        tmp_path / "p",
        {"db": IDLE, "slow": slow, "migrate": migrate, "late": late, "probe": probe},
        seeds={"s": (seed, SeedKind.FILESYSTEM_DIR)},
        reset={"db": ("s", {})},
        volumes={"shared": {}},
    )
    trial = provision(project, run_id, tmp_path, runner)
    try:
        states = {row["Service"]: row["State"] for row in trial.compose.ps()}
        assert states == {
            "db": "running",
            "slow": "running",
            "migrate": "exited",
            "late": "running",
            "probe": "running",
        }
        # the same states through docker ps/inspect by label (what a failed `up` checks restored services
        # with), and the healthcheck's verdict where there is one
        seen = trial.compose.service_states()
        assert {svc: [status for status, _ in found] for svc, found in seen.items()} == {
            svc: [state] for svc, state in states.items()
        }
        # slow's verdict is Docker's healthcheck's: "starting" until its first probe, which forge's spaced-out
        # healthchecks (compose.quiet_healthcheck) run one interval after start; db has no healthcheck
        assert seen["slow"] in ([("running", "starting")], [("running", "healthy")]), seen
        assert seen["db"] == [("running", "")]
        assert set(trial.compose.service_states(["db", "migrate"])) == {"db", "migrate"}
    finally:
        trial.compose.down()
