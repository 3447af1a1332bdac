"""Task files the tasks glob misses: a ``task.yml`` beside where ``task.yaml`` is expected, or a task file
one level deeper than the glob reaches, is silently no task at all, and a run of "every task" then runs
without it (or runs nothing). validate names each such file and the fix instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from forgelib.errors import SpecIssue
from forgelib.spec.yamlpos import YamlDoc, display_path

# A task file's name as people write it, in any case. Only YAML: a task directory may well hold a task.py or
# a task.md of its own (the inspect examples have a task.py), and forge reads neither.
_STEM = "task"
_SUFFIXES = (".yaml", ".yml")
_WILDCARDS = frozenset("*?[")
_MAX_DEPTH = 8  # below the glob's fixed directory, for a pattern with ``**`` (deeper is not a task layout)


def stray_task_files(root: Path, pattern: str, found: Sequence[Path]) -> list[Path]:
    """Files under ``pattern``'s fixed leading directory (``tasks`` of ``tasks/**/task.yaml``) named like a
    task file that ``pattern`` did not match (``found``: what it matched, resolved), sorted."""
    parts = Path(pattern).parts
    if Path(pattern).is_absolute() or ".." in parts:
        return []  # not a pattern inside the project (already reported): nothing of the project to look at
    fixed = []
    for part in parts[:-1]:
        if _WILDCARDS & set(part):
            break
        fixed.append(part)
    base = root.joinpath(*fixed)
    # How many folders below ``base`` to look: as deep as the pattern reaches, and one more (a task folder
    # nested one level too deep is a likely slip).
    levels = _MAX_DEPTH if "**" in pattern else len(parts) - len(fixed)
    matched = set(found)
    return sorted(p for p in _task_like(base, levels) if p.resolve() not in matched)


def _task_like(base: Path, levels: int) -> Iterator[Path]:
    if not base.is_dir():
        return
    start = len(base.parts)
    for folder, dirs, files in os.walk(base):
        here = Path(folder)
        # Hidden folders (.git, .venv) hold no tasks.
        dirs[:] = [] if len(here.parts) - start >= levels else [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = here / name
            if path.stem.lower() == _STEM and path.suffix.lower() in _SUFFIXES:
                yield path


def stray_issue(path: Path, pattern: str, written: bool) -> SpecIssue:
    """The error for one missed file: what reads tasks, and the two ways to make it one."""
    expected = Path(pattern).name
    origin = "tasks.glob in project.yaml" if written else "the default tasks.glob"
    if path.name != expected and not _WILDCARDS & set(expected):
        fix = f"rename it to {expected}"
    else:
        fix = "move it to a folder the pattern reaches"
    return SpecIssue(
        display_path(path),
        1,
        1,
        "$",
        f"this looks like a task file, but forge reads tasks from {pattern!r} ({origin}), which does not "
        f"match it, so it is no task; {fix}, or set tasks: {{glob: PATTERN}} in project.yaml to match it",
    )


def empty_run_issue(doc: YamlDoc, project_name: str) -> SpecIssue:
    """A run config of every task (``tasks`` empty or absent) for a project without one would run nothing."""
    return doc.issue(
        ("project",),
        f"project {project_name!r} has no tasks (no file matches its tasks glob), and a run config without "
        "tasks: runs every task, so this run would run nothing; add a task (tasks/NAME/task.yaml) or point "
        "project: at the project that has them",
    )
