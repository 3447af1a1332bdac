"""The harbor task contract (forgelib.harbor.stacks), without harbor: what a task's environment/ must
hold, and the errors that name the file and the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from forgelib.errors import SpecError
from forgelib.harbor.stacks import HarborTaskError, load_task, spec_file

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "harbor_postgres_reset" / "postgres_reset"


def test_the_example_task_loads_with_its_grading() -> None:
    task = load_task(EXAMPLE / "environment")
    assert set(task.environment.services) == {"app-db", "widgets-api", "main"}
    assert task.grading is not None
    assert [c.name for c in task.grading.checks] == ["answer_reads_baseline", "database_untouched"]


def test_a_task_without_a_forge_spec_is_told_what_to_add(tmp_path: Path) -> None:
    (tmp_path / "docker-compose.yaml").write_text("services:\n  main: {image: x}\n")
    with pytest.raises(HarborTaskError) as e:
        spec_file(tmp_path)
    msg = str(e.value)
    assert f"add {tmp_path / 'project.yaml'}" in msg
    assert "compose_file: docker-compose.yaml" in msg
    assert "--env docker" in msg


def _copy(tmp_path: Path) -> Path:
    env = tmp_path / "environment"
    shutil.copytree(EXAMPLE / "environment", env)
    return env


def test_a_stack_without_a_main_service_names_the_fix(tmp_path: Path) -> None:
    env = _copy(tmp_path)
    compose = env / "docker-compose.yaml"
    compose.write_text(compose.read_text().replace("  main:", "  agent:"))
    spec = env / "project.yaml"
    spec.write_text(spec.read_text().replace("    main:", "    agent:"))
    (env / "grading.yaml").unlink()
    with pytest.raises(HarborTaskError) as e:
        load_task(env)
    assert "no service named 'main' (its services: agent, app-db, widgets-api)" in str(e.value)


def test_main_must_be_ephemeral(tmp_path: Path) -> None:
    env = _copy(tmp_path)
    spec = env / "project.yaml"
    spec.write_text(spec.read_text().replace("isolation: ephemeral", "isolation: shared"))
    with pytest.raises(HarborTaskError) as e:
        load_task(env)
    assert "service 'main' is shared. Fix: make it `isolation: ephemeral`" in str(e.value)


def test_a_spec_that_fails_validation_reads_file_and_line(tmp_path: Path) -> None:
    env = _copy(tmp_path)
    spec = env / "project.yaml"
    spec.write_text(spec.read_text().replace("isolation: reset", "isolation: resett"))
    with pytest.raises(SpecError) as e:
        load_task(env)
    assert "project.yaml:" in str(e.value)
    assert "resett" in str(e.value)


def test_only_plain_absolute_directories_are_furnished_ahead() -> None:
    """harbor's log directories are made in a warm stack's next main before it starts; a path that does not
    plainly name one directory is left to harbor's own ``ensure_dirs``."""
    from forgelib.harbor.stacks import _plain

    assert _plain("/logs/agent") and _plain("/logs/verifier/")
    for odd in ("logs/agent", "/", "/logs/../etc", "C:\\logs"):
        assert not _plain(odd), odd
