"""``forge validate``: one-line OK, every error otherwise, a JSON report; exit 0/1, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forgelib.errors import SpecError
from forgelib.spec.validate import main_validate

from ._support import FIXTURES, edit


def test_ok_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_validate(str(FIXTURES / "basic"), as_json=False) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith("OK: project 'basic'") and "4 seeds (digests verified), 2 tasks, 1 run config" in out
    )
    assert len(out.splitlines()) == 1


def test_errors_raise_one_spec_error_listing_all(basic: Path) -> None:
    edit(basic / "project.yaml", "description:", "descripton:")
    edit(basic / "run_configs/dev.yaml", "repeats: 2", "repeats: -1")
    with pytest.raises(SpecError) as info:
        main_validate(str(basic), as_json=False)
    assert len(info.value.issues) == 2
    assert str(info.value).startswith("2 problems in the spec:")


def test_json_report(basic: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_validate(str(basic / "project.yaml"), as_json=True) == 0
    ok = json.loads(capsys.readouterr().out)
    assert ok["ok"] is True and ok["name"] == "basic" and ok["errors"] == [] and ok["tasks"] == 2
    edit(basic / "project.yaml", "kind: sql_dump", "kind: sql_dum")
    assert main_validate(str(basic), as_json=True) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    (error,) = report["errors"]
    assert error["file"].endswith("project.yaml") and error["line"] == 8 and error["col"] == 13
    assert error["path"] == "$.assets.seeds.postgres_baseline.kind" and "did you mean" in error["message"]


def _forge(*args: str, log: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FORGE_LOG": str(log)}
    argv = [sys.executable, "-m", "forgelib", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=False, env=env)


def test_cli_exit_codes_and_no_tracebacks(basic: Path, tmp_path: Path) -> None:
    log = tmp_path / "forge.log"
    ok = _forge("validate", "--project", str(basic), log=log)
    assert ok.returncode == 0, ok.stderr
    (basic / "project.yaml").write_text("name: [unclosed\n")
    bad = _forge("validate", "--project", str(basic), log=log)
    assert bad.returncode == 1
    assert "project.yaml:2:1: $: invalid YAML" in bad.stderr and "Traceback" not in bad.stderr
    missing = _forge("validate", "--project", str(tmp_path / "nope"), log=log)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    check = _forge("stamp", "--project", str(FIXTURES / "basic"), "--check", log=log)
    assert check.returncode == 0, check.stderr
