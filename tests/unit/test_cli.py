"""The forge program's contract with shell scripts: exit codes 0/1/2/3/130 and never a traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from invoke.exceptions import Exit

from forgelib.cli.exits import guarded
from forgelib.errors import EXIT_INTERRUPTED, EXIT_UNEXPECTED, EXIT_USAGE, EXIT_USER, ForgeError, UsageError

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its forgelib and tasks.py are what run


def python(*argv: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """This Python, importing forgelib from the checkout (PYTHONPATH), not whichever one is installed;
    run from tmp_path, so that the working directory cannot be what finds it."""
    env = {"FORGE_LOG": str(tmp_path / "forge.log"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )


def forge(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return python("-m", "forgelib", *args, tmp_path=tmp_path)


def test_the_program_under_test_is_the_checkouts(tmp_path: Path) -> None:
    done = python("-c", "import forgelib; print(forgelib.__file__)", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == ROOT / "forgelib" / "__init__.py"


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--bogus"], EXIT_USAGE),
        (["validate", "--no-such-option"], EXIT_USAGE),
        (["no-such-command"], EXIT_USAGE),
        (["--help", "no-such-command"], EXIT_USAGE),
        (["run", "--config", "x.yaml", "--repeats", "many"], EXIT_USAGE),
        (["run", "--config", "x.yaml", "--repeats", "0"], EXIT_USAGE),
        (["run", "--config", "x.yaml", "--retries", "-1"], EXIT_USAGE),
        (["validate", "--project", "/nonexistent/project"], EXIT_USER),
    ],
)
def test_exit_codes_from_the_real_program(args: list[str], code: int, tmp_path: Path) -> None:
    done = forge(*args, tmp_path=tmp_path)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.startswith("forge: ")


def test_list_shows_every_command(tmp_path: Path) -> None:
    done = forge("--list", tmp_path=tmp_path)
    assert done.returncode == 0
    for name in ("validate", "stamp", "engine", "images", "provision", "teardown", "run", "reap"):
        assert f"  {name} " in done.stdout


@pytest.fixture
def target(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The debug log in tmp."""
    monkeypatch.setenv("FORGE_LOG", str(tmp_path / "forge.log"))


def _code(fn: Callable[[], int | None], _: None) -> int:
    with pytest.raises(Exit) as info:
        guarded(fn)
    return int(info.value.code)


def _raise(e: BaseException) -> Callable[[], int | None]:
    def cmd() -> int:
        raise e

    return cmd


def test_guarded_maps_each_failure_to_its_exit_code(
    target: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _code(_raise(ForgeError("spec.yaml:3:1: $.name: bad")), target) == EXIT_USER
    assert "forge: error: spec.yaml:3:1: $.name: bad" in capsys.readouterr().err
    assert _code(_raise(UsageError("--a and --b conflict")), target) == EXIT_USAGE
    assert _code(_raise(KeyboardInterrupt()), target) == EXIT_INTERRUPTED
    assert _code(lambda: 1, target) == EXIT_USER
    capsys.readouterr()
    assert _code(_raise(RuntimeError("boom")), target) == EXIT_UNEXPECTED
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"the full traceback is in {tmp_path / 'forge.log'}" in err
    assert "RuntimeError: boom" in (tmp_path / "forge.log").read_text()  # the traceback went to the log


def test_guarded_returns_quietly_on_success(target: None) -> None:
    guarded(lambda: 0)  # no Exit raised


@pytest.mark.parametrize("args", [["run", "--help"], ["teardown", "--help"], ["--help", "run"]])
def test_help_of_commands_with_required_options(args: list[str], tmp_path: Path) -> None:
    done = forge(*args, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: forge")


@pytest.mark.parametrize(("args", "option"), [(["run"], "--config"), (["teardown"], "--name")])
def test_a_missing_required_option_is_a_usage_error(args: list[str], option: str, tmp_path: Path) -> None:
    done = forge(*args, tmp_path=tmp_path)
    assert done.returncode == EXIT_USAGE
    assert f"{option} is required" in done.stderr


def invoke(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return python("-m", "invoke", "-r", str(ROOT), *args, tmp_path=tmp_path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--config", "x.yaml", "--repeats", "x"], "--repeats takes a whole number, not 'x'"),
        (["run", "--config", "x.yaml", "--workers", "1.5"], "--workers takes a whole number, not '1.5'"),
        (["run", "--config", "x.yaml", "--repeats", "0"], "--repeats must be at least 1"),
        (["snapshots", "ls", "--older-than", "soon"], "--older-than takes a number, not 'soon'"),
    ],
)
def test_forge_and_invoke_say_the_same_about_a_bad_option(
    args: list[str], message: str, tmp_path: Path
) -> None:
    for done in (forge(*args, tmp_path=tmp_path), invoke(*args, tmp_path=tmp_path)):
        assert done.returncode == EXIT_USAGE, done.stderr
        assert done.stderr.strip() == f"forge: error: {message}"  # one line, no traceback


def test_a_command_line_invoke_cannot_parse_exits_1_under_invoke_and_2_under_forge(tmp_path: Path) -> None:
    # invoke's own parser exits 1 before any forge code runs (docs/ci.md, "Exit codes"); forge maps it to 2.
    assert forge("run", "--no-such-option", tmp_path=tmp_path).returncode == EXIT_USAGE
    done = invoke("run", "--no-such-option", tmp_path=tmp_path)
    assert done.returncode == 1 and "No idea what '--no-such-option' is" in done.stderr
    assert "Traceback" not in done.stderr
