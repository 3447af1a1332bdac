"""`forge init`: the project it writes validates with its seed stamped, it writes only into a new or empty
directory, and a failure leaves nothing behind. (That the project *runs* and passes is tests/e2e/test_init.py,
on the real engine.)"""

from __future__ import annotations

from importlib.resources import files as package_files
from pathlib import Path

import pytest

from forgelib.errors import ForgeError
from forgelib.scaffold import init
from forgelib.scaffold.init import project_name, write_project
from forgelib.spec.loader import load_project_config, load_project_seeds
from forgelib.spec.stamp import compute
from forgelib.spec.validate import validate_project


def test_the_project_validates_with_its_seed_stamped(tmp_path: Path) -> None:
    project = write_project(tmp_path / "myproject")
    report = validate_project(str(project))
    assert report.ok, report.errors
    assert (report.name, report.seeds, report.tasks, report.run_configs) == ("myproject", 1, 1, 1)
    assert report.notices == []
    doc, seeds = load_project_seeds(project / "project.yaml")
    assert [s.needed for s in compute(doc, seeds)] == [False]  # `forge stamp --check` would pass


def test_the_project_is_postgres_and_redis_with_one_graded_task_and_its_oracle(tmp_path: Path) -> None:
    project = load_project_config(write_project(tmp_path / "p"))
    (task,) = project.tasks
    assert task.oracle is not None and task.grading is not None
    compose = (tmp_path / "p" / "shared" / "compose.yaml").read_text()
    for variable in ("${FORGE_IMAGE_POSTGRES:-postgres:16}", "${FORGE_IMAGE_REDIS:-redis:7-alpine}"):
        assert variable in compose  # what makes the offline stand-ins apply
    assert (tmp_path / "p" / ".gitignore").read_text() == "runs/\n"
    assert "__PROJECT_NAME__" not in "".join(
        f.read_text() for f in (tmp_path / "p").rglob("*") if f.is_file()
    )


def test_an_empty_directory_is_taken_and_one_with_anything_in_it_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert (write_project(tmp_path / "empty") / "project.yaml").is_file()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / ".keep").write_text("")
    with pytest.raises(ForgeError, match=r"full is not empty; .* give another one \(forge init .*full-2\)"):
        write_project(tmp_path / "full")
    (tmp_path / "file").write_text("")
    with pytest.raises(ForgeError, match="exists and is not a directory"):
        write_project(tmp_path / "file")
    assert [p.name for p in (tmp_path / "full").iterdir()] == [".keep"]


def test_a_failure_leaves_no_half_written_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(pfile: Path) -> list[object]:
        raise OSError("disk full")

    monkeypatch.setattr(init, "stamp_in_place", broken)
    with pytest.raises(OSError, match="disk full"):
        write_project(tmp_path / "p")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("directory", "name"),
    [("myproject", "myproject"), ("My Project!", "My_Project_"), ("-x", "x"), ("___", "forge_project")],
)
def test_the_project_is_named_after_its_directory(tmp_path: Path, directory: str, name: str) -> None:
    assert project_name(tmp_path / directory) == name


def test_the_template_is_package_data() -> None:
    template = package_files("forgelib.scaffold").joinpath("template")
    assert template.joinpath("project.yaml").is_file()
    assert template.joinpath("tasks", "cache_order_status", "solve.sh").is_file()
