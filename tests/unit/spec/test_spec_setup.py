"""task.yaml's ``setup:``: loaded like the oracle, refused without a reset service; on warm stacks too."""

from __future__ import annotations

from pathlib import Path

from forgelib.spec.loader import load_project_config
from forgelib.spec.models import Oracle
from forgelib.spec.rules import check_setup
from forgelib.spec.yamlpos import load_yaml

from ._support import edit

RT = "tasks/read_widget/task.yaml"
SETUP = "setup:\n  service: app-db\n  command: [sh, -c, 'sleep 1']\n  timeout: 90\n  env: {N: 2}\noracle:\n"


def test_a_setup_loads_with_the_oracles_fields(basic: Path) -> None:
    edit(basic / RT, "oracle:\n", SETUP)
    task = load_project_config(basic).task("read_widget")
    assert task.setup == Oracle(
        service="app-db", command=("sh", "-c", "sleep 1"), timeout=90.0, env={"N": "2"}
    )
    assert task.oracle is not None and task.oracle.service == "runner"
    assert load_project_config(basic).task("warm_cache").setup is None


def test_a_setup_on_a_stack_without_a_reset_service_names_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    path.write_text("description: d\nsetup:\n  service: app\n  command: [x]\n")
    doc, issues = load_yaml(path)
    assert not issues
    _, issues = check_setup(doc, {"app": {}}, [], tmp_path)
    [issue] = issues
    assert (issue.line, issue.json_path) == (3, "$.setup")
    assert "no reset service" in issue.message and "isolation: reset" in issue.message
    _, fine = check_setup(doc, {"app": {}}, ["db"], tmp_path)
    assert fine == []


def test_forge_run_runs_a_task_with_setup_on_fresh_and_warm_stacks(basic: Path) -> None:
    from forgelib.cli.run import RunOptions, build_plan
    from forgelib.spec.loader import load_run_config

    edit(basic / RT, "oracle:\n", SETUP)
    project = load_project_config(basic)
    cfg = load_run_config(project.run_configs[0], project)
    assert build_plan(cfg, project).tasks[0].setup is not None  # fresh
    warm = build_plan(cfg, project, RunOptions(stacks="warm"))  # warm stacks start from its checkpoint
    setup = {t.name: t.setup for t in warm.tasks}["read_widget"]
    assert warm.stacks == "warm" and setup is not None and setup.service == "app-db"
    edit(project.run_configs[0], "workers: 1", "workers: 1\nstacks: warm")
    assert load_run_config(project.run_configs[0], project).stacks == "warm"  # the run config's too


def test_a_setup_whose_every_reset_service_is_checkpointed_fresh_is_refused(basic: Path) -> None:
    from forgelib.spec.validate import validate_project

    edit(basic / RT, "oracle:\n", SETUP)
    project = basic / "project.yaml"
    for svc in ("app-db", "cache", "files"):  # each reset service of the stack, but not captured
        edit(
            project,
            f"    {svc}:\n      isolation: reset\n",
            f"    {svc}:\n      isolation: reset\n      checkpoint: fresh\n",
        )
    report = validate_project(str(basic))
    [issue] = [i for i in report.errors if i.json_path == "$.setup"]
    assert "no reset service a checkpoint captures" in issue.message and "checkpoint: fresh" in issue.message


def test_a_service_is_captured_by_default_only_when_reset_and_never_when_it_says_fresh(basic: Path) -> None:
    from forgelib.spec.models import Checkpointing

    edit(
        basic / "project.yaml",
        "    runner: {isolation: ephemeral}",
        "    runner: {isolation: ephemeral, checkpoint: fresh}",
    )
    edit(
        basic / "project.yaml",
        "      reset: {seed: cache_poisoned}\n",
        "      reset: {seed: cache_poisoned}\n      checkpoint: fresh\n",
    )
    services = load_project_config(basic).environment.services
    assert {n: (s.checkpoint, s.captured) for n, s in services.items() if n != "widgets-api"} == {
        "app-db": (None, True),
        "cache": (Checkpointing.FRESH, False),
        "files": (None, True),
        "runner": (Checkpointing.FRESH, False),
    }
