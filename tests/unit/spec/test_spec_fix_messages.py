"""Mistakes whose old message named the problem but not the fix: a matcher written beside its check's type
instead of inside it, and an agent file's path as a run config's ``agent:``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from forgelib.spec.validate import validate_project

from ._support import edit

GRADING = "tasks/read_widget/grading.yaml"
DB_CHECK = 'sql: {service: app-db, query: "select name from widgets where id=1", equals: baseline}'


def _errors(root: Path) -> list[str]:
    return [str(i) for i in validate_project(str(root)).errors]


@pytest.mark.parametrize(
    ("check", "line", "words"),
    [
        (
            'sql: {service: app-db, query: "select name from widgets where id=1"}\n    equals: baseline',
            9,
            "$.checks[1].equals: 'equals' belongs inside sql, not beside it; "
            "move it in: sql: {..., equals: 'baseline'}",
        ),
        (
            "file: {service: runner, path: /work/out.txt}\n    contains: base",
            9,
            "$.checks[1].contains: 'contains' belongs inside file, not beside it; "
            "move it in: file: {..., contains: 'base'}",
        ),
    ],
    ids=["equals-beside-sql", "contains-beside-file"],
)
def test_a_matcher_beside_its_check_type_says_to_move_it_inside(
    basic: Path, check: str, line: int, words: str
) -> None:
    edit(basic / GRADING, DB_CHECK, check)
    (error,) = _errors(basic)
    assert f"{GRADING}:{line}:5: {words}" in error, error


def test_an_unknown_key_no_sibling_takes_keeps_the_did_you_mean(basic: Path) -> None:
    edit(basic / GRADING, DB_CHECK, DB_CHECK + "\n    wieght: 2")
    (error,) = _errors(basic)
    assert "$.checks[1].wieght: unknown key 'wieght'; did you mean 'weight'?" in error, error


@pytest.mark.parametrize("exists", [True, False])
def test_an_agent_path_in_a_run_config_says_how_agent_files_are_used(basic: Path, exists: bool) -> None:
    if exists:
        (basic / "run_configs/agents").mkdir()
        (basic / "run_configs/agents/mine.yaml").write_text("command: [./agent.py]\n")
    edit(basic / "run_configs/dev.yaml", "repeats: 2\n", "repeats: 2\nagent: agents/mine.yaml\n")
    (error,) = _errors(basic)
    assert "run_configs/dev.yaml:4:8: $.agent: 'agents/mine.yaml' is not an agent: " in error, error
    assert (
        "a run config's agent: is `oracle` or the agent itself, written here (agent: {command: [...]" in error
    )
    what = "the agent file" if exists else "an agent file"
    assert f"to use {what} 'agents/mine.yaml', give it to `forge run` with --agent PATH" in error
    assert "or copy its keys under agent:" in error


def test_the_program_exits_1_with_both_fixes(basic: Path, tmp_path: Path) -> None:
    edit(basic / GRADING, DB_CHECK, DB_CHECK.replace(", equals: baseline}", "}\n    equals: baseline"))
    edit(basic / "run_configs/dev.yaml", "repeats: 2\n", "repeats: 2\nagent: agents/mine.yaml\n")
    env = {**os.environ, "FORGE_LOG": str(tmp_path / "forge.log")}
    run = [sys.executable, "-m", "forgelib", "validate", "--project", str(basic)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "grading.yaml:9:5: $.checks[1].equals: 'equals' belongs inside sql" in done.stderr
    assert "dev.yaml:4:8: $.agent: 'agents/mine.yaml' is not an agent" in done.stderr
