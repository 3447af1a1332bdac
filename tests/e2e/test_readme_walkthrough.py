"""The README's "Your first project in ten minutes", run verbatim on the real engine.

The commands are the ``$ `` lines between ``<!-- first-project:begin -->`` and ``<!-- first-project:end -->``
in README.md, run in order in an empty temporary directory (the newcomer's cwd). Each must exit 0, and
nothing of theirs may be left on the engine afterwards.

Each line is split as a shell would split it (``shlex``; the walkthrough uses no pipes or variables), and its
leading ``forge`` is replaced by ``sys.executable -m forgelib`` with this checkout first on ``PYTHONPATH``:
that is what the installed ``forge`` script runs, and it makes the test exercise this checkout's forgelib
whatever else is installed or on ``PATH``. Nothing else in the line is changed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support.readme import first_project_commands

from forgelib.docker.labels import OWNER_PID, RUN, is_empty, resources_with_labels
from forgelib.runner import SubprocessRunner

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT = 900  # seconds for one command (a run of a few trials is well under this; bounds a hang)


def _argv(command: str) -> list[str]:
    words = shlex.split(command)
    assert words and words[0] == "forge", f"a walkthrough line that is not a forge command: {command!r}"
    return [sys.executable, "-m", "forgelib", *words[1:]]


def _images_labelled(label: str, value: str) -> list[str]:
    out = subprocess.run(
        ["docker", "image", "ls", "--quiet", "--filter", f"label={label}={value}"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return out.stdout.split()


def test_first_project_walkthrough_runs_verbatim(
    tmp_path: Path, runner: SubprocessRunner, docker_ready: None
) -> None:
    commands = first_project_commands()
    assert commands, "README.md's first-project block has no `$ ` lines"
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    pids: list[int] = []
    failures: list[str] = []
    for command in commands:
        proc = subprocess.Popen(
            _argv(command), cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        pids.append(proc.pid)
        try:
            out, err = proc.communicate(timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"$ {command}\nrc={proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}")
            break  # the next step builds on this one

    # Whatever happened above, nothing of these commands may remain: by the run ids on disk, and by the
    # owner pid forge labels everything with (which also covers a run that died before writing its dir).
    run_ids = sorted(d.name for d in tmp_path.glob("*/runs/*") if d.is_dir())
    leaked: dict[str, object] = {}
    for key, value in [*((RUN, r) for r in run_ids), *((OWNER_PID, str(p)) for p in pids)]:
        resources = resources_with_labels(runner, {key: value})
        if not is_empty(resources):
            leaked[f"{key}={value}"] = resources
        images = _images_labelled(key, value)
        if images:
            leaked[f"images {key}={value}"] = images
    assert not failures, "\n\n".join(failures)
    assert not leaked, f"the walkthrough left resources on the engine: {leaked}"
    if any(" run " in f" {c} " for c in commands):
        assert run_ids, f"`forge run` in the walkthrough left no run directory under {tmp_path}/*/runs"
        if any("--report" in c for c in commands):
            missing = [r for r in run_ids if not any(tmp_path.glob(f"*/runs/{r}/report.html"))]
            assert not missing, f"--report wrote no report.html for runs {missing}"
