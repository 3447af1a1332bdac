"""`forge init` end to end, as the README's first project runs it: `forge init myproject`, `forge validate
myproject`, `forge run myproject/run_configs/dev.yaml --report` — the commands verbatim, in a new
directory, on the real engine — and then nothing of the run is left on the engine or in the temp dir."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from forgelib.docker.labels import RUN, is_empty, resources_with_labels
from forgelib.runner import SubprocessRunner

pytestmark = pytest.mark.e2e

RUN_TIMEOUT = 900  # bounds a hang only: the two trials take seconds


def forge(cwd: Path, *args: str, timeout: float = 120) -> tuple[int, str, str, int]:
    """``forge ARGS`` in ``cwd``: (exit code, stdout, stderr, its pid)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "forgelib", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err, proc.pid


def temp_dirs_of(pid: int) -> list[Path]:
    """What a forge process named after itself in the temp dir (``labels.owned_temp_dir``, forge-*)."""
    return sorted(Path(tempfile.gettempdir()).glob(f"forge*{pid}-*"))


def test_init_validate_run_the_new_project(
    tmp_path: Path, runner: SubprocessRunner, docker_ready: None
) -> None:
    rc, out, err, _ = forge(tmp_path, "init", "myproject")
    assert rc == 0, err
    assert "forge validate myproject" in out
    assert "forge run myproject/run_configs/dev.yaml --report" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["myproject"]  # no work directory left beside it

    rc, out, err, _ = forge(tmp_path, "validate", "myproject")
    assert rc == 0, err
    assert out.startswith("OK: project 'myproject'"), out

    rc, out, err, pid = forge(
        tmp_path, "run", "myproject/run_configs/dev.yaml", "--report", timeout=RUN_TIMEOUT
    )
    runs = tmp_path / "myproject" / "runs"
    run_ids = sorted(d.name for d in runs.iterdir()) if runs.is_dir() else []
    try:
        assert rc == 0, f"rc={rc}\n{out}\n{err}"
        assert len(run_ids) == 1, run_ids
        run_dir = runs / run_ids[0]
        assert re.search(rf"-> {re.escape(str(run_dir))}$", err, re.M), err  # it prints where results go
        summary = json.loads((run_dir / "summary.json").read_text())
        totals = summary["totals"]
        assert (totals["trials"], totals["passed"], totals["failed"]) == (2, 2, 0), summary
        assert (run_dir / "report.html").is_file()
        for index in ("0", "1"):
            grade = yaml.safe_load(
                (run_dir / "trials" / "cache_order_status" / index / "grade.yaml").read_text()
            )
            checks = {c["name"]: c for c in grade["checks"]}
            # 'shipped' is the seed's: the template's init.sql says 'pending'
            assert checks["status_cached"]["passed"] is True, grade
            assert str(checks["status_cached"]["observed"]).strip() == "shipped", grade
            assert checks["order_unchanged"]["passed"] is True, grade
    finally:
        leaked = {r: res for r in run_ids if not is_empty(res := resources_with_labels(runner, {RUN: r}))}
        assert not leaked, f"resources left behind: {leaked}"
        assert temp_dirs_of(pid) == []
    assert sorted(p.name for p in (tmp_path / "myproject").iterdir()) == [
        ".gitignore", "README.md", "assets", "project.yaml", "run_configs", "runs", "shared", "tasks",
    ]  # fmt: skip


def test_init_refuses_a_directory_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine\n")
    rc, out, err, _ = forge(tmp_path, "init", "taken")
    assert rc == 1 and out == ""
    assert err.startswith("forge: error: taken is not empty;"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["notes.txt"]
