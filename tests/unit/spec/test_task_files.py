"""Task files the tasks glob misses, and a run of every task in a project without one: each used to
validate (as "0 tasks", or one task fewer) and is now exit 1 at the file, with the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from forgelib.spec.validate import validate_project

from ._support import edit

GLOB = 'tasks:\n  glob: "tasks/**/task.yaml"\n'
WARM = "tasks/warm_cache"


def _errors(root: Path) -> list[str]:
    return [str(i) for i in validate_project(str(root)).errors]


def test_a_task_yml_beside_where_task_yaml_is_expected_is_refused(basic: Path) -> None:
    (basic / WARM / "task.yaml").rename(basic / WARM / "task.yml")
    (error,) = _errors(basic)
    assert error.startswith(f"{basic / WARM / 'task.yml'}:1:1: $: this looks like a task file"), error
    assert "forge reads tasks from 'tasks/**/task.yaml' (tasks.glob in project.yaml)" in error
    assert "rename it to task.yaml, or set tasks: {glob: PATTERN} in project.yaml to match it" in error


def test_with_the_default_glob_the_message_says_so(basic: Path) -> None:
    edit(basic / "project.yaml", GLOB, "")
    (basic / WARM / "Task.YAML").write_text("name: other\n")
    (error,) = _errors(basic)
    assert "Task.YAML:1:1: $:" in error and "(the default tasks.glob)" in error
    assert "rename it to task.yaml" in error


def test_a_task_file_deeper_than_a_shallow_glob_is_refused(basic: Path) -> None:
    edit(basic / "project.yaml", GLOB, 'tasks:\n  glob: "tasks/*/task.yaml"\n')
    nested = basic / "tasks/group/warm_cache"
    nested.parent.mkdir()
    (basic / WARM).rename(nested)
    (error,) = _errors(basic)
    assert f"{nested / 'task.yaml'}:1:1: $:" in error and "'tasks/*/task.yaml'" in error
    assert "move it to a folder the pattern reaches" in error


def test_other_files_named_task_and_hidden_folders_are_left_alone(basic: Path) -> None:
    (basic / WARM / "task.py").write_text("print('helper')\n")
    (basic / WARM / "task.md").write_text("notes\n")
    (basic / "tasks/.cache").mkdir()
    (basic / "tasks/.cache/task.yml").write_text("name: stale\n")
    (basic / "elsewhere").mkdir()
    (basic / "elsewhere/task.yml").write_text("name: not-under-tasks\n")  # outside the glob's folder
    assert _errors(basic) == []


def test_a_glob_matching_nothing_names_the_fix(basic: Path) -> None:
    edit(basic / "project.yaml", GLOB, 'tasks:\n  glob: "task/**/task.yaml"\n')
    (error,) = _errors(basic)
    assert "project.yaml:35:9: $.tasks.glob: 'task/**/task.yaml' matches no files under " in error, error
    assert "fix the pattern (relative to the project directory, e.g. tasks/**/task.yaml)" in error


def _without_tasks(basic: Path) -> None:
    edit(basic / "project.yaml", GLOB, "")
    for task in (basic / "tasks").iterdir():
        for f in task.iterdir():
            if f.is_file():
                f.unlink()


def test_a_run_of_every_task_in_a_project_without_tasks_is_refused(basic: Path) -> None:
    _without_tasks(basic)
    edit(basic / "run_configs/dev.yaml", "tasks: [read_widget]\n", "")
    (error,) = _errors(basic)
    assert f"{basic / 'run_configs/dev.yaml'}:1:10: $.project: project 'basic' has no tasks" in error, error
    assert "this run would run nothing; add a task (tasks/NAME/task.yaml)" in error


def test_a_project_without_tasks_or_run_configs_still_validates(basic: Path) -> None:
    # What a pytest-only project looks like: its stack, no tasks.
    _without_tasks(basic)
    (basic / "run_configs/dev.yaml").unlink()
    report = validate_project(str(basic))
    assert report.ok and report.tasks == 0, [str(i) for i in report.errors]


def test_the_program_exits_1_naming_the_missed_file(basic: Path, tmp_path: Path) -> None:
    (basic / WARM / "task.yaml").rename(basic / WARM / "task.yml")
    env = {**os.environ, "FORGE_LOG": str(tmp_path / "forge.log")}
    run = [sys.executable, "-m", "forgelib", "validate", "--project", str(basic)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "tasks/warm_cache/task.yml:1:1: $: this looks like a task file" in done.stderr
