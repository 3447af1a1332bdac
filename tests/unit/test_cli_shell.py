"""forge's output in ordinary shell use (issue 38): `--output DIR` writes inside DIR with no temp file
anywhere else, and a reader that leaves (`| head -1`) ends forge quietly with EXIT_PIPE — the real program,
in a real pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from invoke.exceptions import Exit
from support.runlog import ev_started, trial_events, write_log

from forgelib.cli import exits as guard
from forgelib.errors import EXIT_PIPE, EXIT_UNEXPECTED
from forgelib.report.page import REPORT_FILE, write_report

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "examples" / "multi_service_postgres_reset"
NOT_QUIET = ("Traceback", "bug", "Exception ignored", "BrokenPipe", "Broken pipe")


def env(tmp_path: Path) -> dict[str, str]:
    return {"FORGE_LOG": str(tmp_path / "forge.log"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}


def a_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / "r1"
    write_log(run_dir, [ev_started([("a", 0)]), *trial_events("a", 0, 1_764_547_201.0, "0")])
    return run_dir


@pytest.mark.parametrize("slash", ["", "/"])
def test_report_output_a_directory_writes_the_page_inside_it(tmp_path: Path, slash: str) -> None:
    run_dir = a_run(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "forgelib", "report", str(run_dir), "--output", f"{out}{slash}"],
        capture_output=True, text=True, timeout=60, env=env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out / REPORT_FILE)
    assert "<html" in (out / REPORT_FILE).read_text()
    assert sorted(p.name for p in out.iterdir()) == [REPORT_FILE]  # no temp file beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forge.log", "out", "runs"]  # nor above it


def test_report_output_a_new_directory_with_a_slash_is_created(tmp_path: Path) -> None:
    run_dir = a_run(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "forgelib", "report", str(run_dir), "-o", f"{tmp_path}/pages/"],
        capture_output=True, text=True, timeout=60, env=env(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pages" / REPORT_FILE).is_file()


def test_a_report_that_cannot_be_moved_into_place_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = a_run(tmp_path)
    out = tmp_path / "out"

    def refuse(self: Path, target: Path) -> Path:
        raise PermissionError(13, "Permission denied", str(target))

    monkeypatch.setattr(Path, "replace", refuse)
    with pytest.raises(PermissionError):
        write_report(run_dir, output=out / "page.html")
    assert list(out.iterdir()) == []


def closed_pipe_run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """forge with stdout a pipe whose reader has already gone: every write meets EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "forgelib", *args],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=60, env=env(tmp_path),
        )  # fmt: skip
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [["validate", "--json", str(PACK)], ["--help"], ["run", "--help"]])
def test_a_closed_stdout_ends_forge_quietly_with_exit_pipe(args: list[str], tmp_path: Path) -> None:
    done = closed_pipe_run(args, tmp_path)
    assert done.returncode == EXIT_PIPE, done.stderr
    assert not any(word in done.stderr for word in NOT_QUIET), done.stderr


def test_validate_json_into_head_ends_quietly_every_time(tmp_path: Path) -> None:
    # Whether forge finished writing before head left is a race: either way, no traceback and no "bug".
    script = (
        f'"{sys.executable}" -m forgelib validate --json "{PACK}" | head -1; echo "rc=${{PIPESTATUS[0]}}" >&2'
    )
    for _ in range(5):
        done = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=60, env=env(tmp_path)
        )
        assert done.stdout.strip() == "{", done.stdout
        errors = [line for line in done.stderr.splitlines() if not line.startswith(("rc=", "forge: note:"))]
        assert not errors and not any(word in done.stderr for word in NOT_QUIET), done.stderr
        assert done.stderr.splitlines()[-1] in ("rc=0", f"rc={EXIT_PIPE}"), done.stderr


def test_a_broken_pipe_that_is_not_stdout_is_still_a_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A child that died before reading its stdin: forge's stdout is fine, so this is no reader leaving.
    monkeypatch.setenv("FORGE_LOG", str(tmp_path / "forge.log"))
    read, write = os.pipe()
    os.close(read)

    def feed_a_dead_child() -> int:
        os.write(write, b"x")
        return 0

    try:
        with pytest.raises(Exit) as info:
            guard.guarded(feed_a_dead_child)
    finally:
        os.close(write)
    assert info.value.code == EXIT_UNEXPECTED
    assert "a bug in forgelib" in capsys.readouterr().err
