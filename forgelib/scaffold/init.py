"""``forge init [DIR]``: a new, runnable project from the template in this package (``template/``, shipped
in the wheel): postgres with a stamped sql seed, redis, a workstation, one task with its oracle and
grading, and a run config. ``forge validate DIR`` accepts it and ``forge run DIR/run_configs/dev.yaml``
passes.

The project is written into a hidden directory beside DIR and renamed into place, so a failure leaves
nothing half-written and DIR is either the whole project or untouched.
"""

from __future__ import annotations

import re
import shlex
import shutil
import tempfile
from importlib.resources import files as package_files
from importlib.resources.abc import Traversable
from pathlib import Path

from forgelib.errors import EXIT_OK, ForgeError
from forgelib.spec.stamp import stamp_in_place

DEFAULT_DIR = "forge-project"
NAME_MARK = "__PROJECT_NAME__"  # replaced by the project's name in the template's text files
RENAMED = {"gitignore": ".gitignore"}  # a dotfile in the package would be easy to lose in packaging
FALLBACK_NAME = "forge_project"


def project_name(directory: Path) -> str:
    """The project's ``name:`` (schema pattern ``^[A-Za-z0-9][A-Za-z0-9_.-]*$``) from its directory."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", directory.resolve().name).lstrip("_.-")[:100]
    return name or FALLBACK_NAME


def _copy(src: Traversable, dest: Path, name: str) -> None:
    for item in src.iterdir():
        target = dest / RENAMED.get(item.name, item.name)
        if item.is_dir():
            target.mkdir()
            _copy(item, target, name)
        elif item.name != "__init__.py":
            target.write_text(item.read_text(encoding="utf-8").replace(NAME_MARK, name), encoding="utf-8")


def write_project(directory: Path) -> Path:
    """The template, named after ``directory`` and stamped, as ``directory`` (new, or an empty one)."""
    if directory.exists() and not directory.is_dir():
        raise ForgeError(f"{directory} exists and is not a directory; give forge init a new directory")
    if directory.is_dir() and any(directory.iterdir()):
        raise ForgeError(
            f"{directory} is not empty; forge init writes a new project into a new or empty directory: "
            f"give another one (forge init {shlex.quote(str(directory) + '-2')})"
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{directory.name}.forge-init-", dir=directory.parent))
    try:
        _copy(package_files("forgelib.scaffold").joinpath("template"), work, project_name(directory))
        stamp_in_place(work / "project.yaml")
        work.chmod(0o755)  # mkdtemp's 0700 is for the half-written state only
        work.replace(directory)  # onto a new path, or over the empty directory
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return directory


def main_init(directory: str) -> int:
    """``forge init``: write the project, then say what to run next."""
    target = Path(directory or DEFAULT_DIR)
    write_project(target)
    shown = shlex.quote(directory or DEFAULT_DIR)
    config = shlex.quote(f"{(directory or DEFAULT_DIR).rstrip('/')}/run_configs/dev.yaml")
    print(f"wrote a forge project in {shown}: a seeded database and a cache, one task, a run config")
    print("next:")
    print(f"  forge validate {shown}")
    print(f"  forge run {config} --report")
    print(f"  (results go under {shlex.quote(str(target / 'runs'))}/<run_id>; forge run prints the run id)")
    return EXIT_OK


__all__ = ["DEFAULT_DIR", "main_init", "project_name", "write_project"]
