"""forge's own command line (issue 38): its help shows forge's commands and options only, the main argument
is positional, typos get a "did you mean", numbers are INT and checked, and a short flag means one option
in every command. Parsed in process where the parse is the point; the real program where output is."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from invoke.program import Program

from forgelib.cli import program as cli
from forgelib.cli.args import SHORT_FLAGS, options, parse
from forgelib.cli.tasks import ns
from forgelib.errors import EXIT_USAGE, UsageError

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "examples" / "multi_service_postgres_reset"


def forge(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {"FORGE_LOG": str(tmp_path / "forge.log"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "forgelib", *args], capture_output=True, text=True, timeout=60, env=env
    )


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def program(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``program(*args)``: the forge program in this process (``cli.run``), its output captured."""
    monkeypatch.setenv("FORGE_LOG", str(tmp_path / "forge.log"))

    def go(*args: str) -> Done:
        capsys.readouterr()
        code = cli.run(list(args), ns)
        out, err = capsys.readouterr()
        return Done(code, out, err)

    return go


def kwargs(*argv: str) -> dict[str, Any]:
    line = parse(argv, ns)
    assert line.command == argv[0] and not line.help
    return line.kwargs


def usage_error(*argv: str) -> str:
    with pytest.raises(UsageError) as info:
        parse(argv, ns)
    return str(info.value)


# --------------------------------------------------------------------------------------------- the help


def invoke_core_flags() -> list[str]:
    """Every flag of invoke's own program (task-runner mode too), but those forge has as its own."""
    flags = []
    for arg in [*Program().core_args(), *Program().task_args()]:
        flags += [f"--{n}" if len(n) > 1 else f"-{n}" for n in arg.names]
    return [f for f in flags if f not in ("--help", "-h", "--version", "-V", "--list")]


def test_invoke_has_the_options_this_test_looks_for() -> None:
    flags = invoke_core_flags()
    for flag in ("--prompt-for-sudo-password", "--write-pyc", "-R", "--dry", "-w", "--warn-only", "-f"):
        assert flag in flags
    assert "--config" in flags and "--complete" in flags


@pytest.mark.parametrize("args", [["--help"], ["-h"], []])
def test_program_help_shows_none_of_invokes_program_options(args: list[str], program: Any) -> None:
    done = program(*args)
    assert done.returncode == 0, done.stderr
    assert "core-opts" not in done.stdout and "Core options" not in done.stdout
    for flag in invoke_core_flags():
        assert not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", done.stdout), flag


@pytest.mark.parametrize("args", [["run", "--help"], ["--help", "run"], ["report", "-h"], ["validate", "-h"]])
def test_a_commands_help_shows_none_of_invokes_program_options(args: list[str], program: Any) -> None:
    done = program(*args)
    assert done.returncode == 0, done.stderr
    assert "core-opts" not in done.stdout
    name = next(a for a in args if not a.startswith("-"))
    own = {o.long for o in options(ns.tasks[name])}  # `forge run --config CONFIG` is run's own
    for flag in invoke_core_flags():
        if flag.startswith("--") and flag not in own:
            assert not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", done.stdout), flag


def test_program_help_lists_every_command_and_its_own_options(program: Any) -> None:
    text = program("--help").stdout
    for name in ns.tasks:
        assert re.search(rf"^  {name} ", text, re.M), name
    assert "-h, --help" in text and "-V, --version" in text and "--list" in text


def test_a_commands_help_renders_each_option_once_with_its_own_flag(tmp_path: Path) -> None:
    text = forge("run", "--help", tmp_path=tmp_path).stdout
    assert text.startswith("Usage: forge run CONFIG [OPTIONS]\n")
    assert "--, " not in text
    assert re.search(r"^      --no-snapshots +seed every", text, re.M)
    assert re.search(r"^  -r, --repeats INT +trials per task", text, re.M)
    assert forge("--help", "run", tmp_path=tmp_path).stdout == text
    assert forge("help", "run", tmp_path=tmp_path).stdout == text


def test_numbers_show_as_int_or_number_never_string(program: Any) -> None:
    run_help = program("run", "--help").stdout
    for option in ("--repeats", "--workers", "--retries", "--memory-budget-mb"):
        assert re.search(rf"{option} INT ", run_help), option
    assert "--older-than NUMBER" in program("snapshots", "--help").stdout
    assert "STRING" not in run_help


# ------------------------------------------------------------------------------------ the main argument


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["validate", "myproj"], {"project": "myproj"}),
        (["validate", "--project", "myproj"], {"project": "myproj"}),
        (["validate", "-p", "myproj", "--json"], {"project": "myproj", "json": True}),
        (["stamp", "myproj", "--check"], {"project": "myproj", "check": True}),
        (["provision", "myproj", "-t", "t1", "-k"], {"project": "myproj", "task": "t1", "keep": True}),
        (["teardown", "forge-abc"], {"name": "forge-abc"}),
        (["run", "p/run_configs/dev.yaml", "-r", "3"], {"config": "p/run_configs/dev.yaml", "repeats": "3"}),
        (["run", "--config=c.yaml", "--report"], {"config": "c.yaml", "report": True}),
        (["report", "runs/r1", "-o", "/tmp"], {"run_dir": "runs/r1", "output": "/tmp"}),
        (["grade", "runs/r1", "-j"], {"run_dir": "runs/r1", "json": True}),
        (["snapshots", "prune", "--older-than", "1.5"], {"action": "prune", "older_than": "1.5"}),
        (["provision", "--profile", "a", "--profile", "b"], {"profile": ["a", "b"]}),
        (["validate", "-jp", "x"], {"json": True, "project": "x"}),
        (["validate", "--", "-odd-dir"], {"project": "-odd-dir"}),
        (["restore", "forge-abc", "ck1"], {"stack": "forge-abc", "id": "ck1"}),
        (["restore", "forge-abc", "--id", "ck1"], {"stack": "forge-abc", "id": "ck1"}),
    ],
)
def test_the_main_argument_is_positional_and_its_option_still_works(
    argv: list[str], expected: dict[str, Any]
) -> None:
    assert kwargs(*argv) == expected


def test_the_real_program_validates_a_directory_given_positionally(tmp_path: Path) -> None:
    for args in (["validate", str(PACK)], ["validate", "--project", str(PACK)]):
        done = forge(*args, tmp_path=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["validate", "a", "b"], "forge validate takes PROJECT only, but was also given 'b'"),
        (["restore", "s", "c", "x"], "forge restore takes STACK ID only, but was also given 'x'"),
        (["validate", "a", "--project", "b"], "PROJECT is given twice: as 'a' and as --project"),
        (["validate", "-j", "--json"], "--json is given twice"),
        (["engine", "x"], "forge engine takes no arguments, but was given 'x'"),
        (["validate", "--project"], "--project needs a value: project directory or its project.yaml"),
        (["validate", "--project", "--json"], "--project needs a value"),
        (["validate", "--json=yes"], "--json takes no value"),
        (["snapshots"], "forge snapshots needs ACTION (ls | prune | verify)"),
        (["run", "c.yaml", "--repeats", "many"], "--repeats takes a whole number, not 'many'"),
        (["run", "c.yaml", "-w", "1.5"], "--workers takes a whole number, not '1.5'"),
        (["snapshots", "ls", "--older-than", "soon"], "--older-than takes a number, not 'soon'"),
    ],
)
def test_what_forge_cannot_take_it_says_in_its_own_words(argv: list[str], message: str) -> None:
    assert message in usage_error(*argv)


def test_a_negative_number_is_a_value_that_the_command_then_refuses(tmp_path: Path) -> None:
    assert kwargs("run", "c.yaml", "--retries", "-1") == {"config": "c.yaml", "retries": "-1"}
    done = forge("run", "c.yaml", "--retries", "-1", tmp_path=tmp_path)
    assert done.returncode == EXIT_USAGE
    assert done.stderr.strip() == "forge: error: --retries must be between 0 and 100"


# ---------------------------------------------------------------------------------------- did you mean


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["validat"], "forge: error: no command 'validat'; did you mean 'validate'?"),
        (["valdiate", "."], "did you mean 'validate'?"),
        (["validate", "--jsn"], "forge: error: forge validate has no option --jsn; did you mean --json?"),
        (["run", "c.yaml", "--repeat", "2"], "did you mean --repeats?"),
        (
            ["validate", "--config", "x"],
            "forge validate has no option --config (--config is an option of forge run)",
        ),
        (["--config", "run_configs/dev.yaml", "validate"], "forge has no option --config before a command"),
        (["--verison"], "did you mean --version?"),
        (["validate", "--project"], "forge: error: --project needs a value"),
        (["validate", "myproj", "extra"], "forge: error: forge validate takes PROJECT only"),
    ],
)
def test_the_program_says_what_is_wrong_and_what_was_meant(
    args: list[str], message: str, program: Any
) -> None:
    done = program(*args)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert message in done.stderr
    assert done.stderr.startswith("forge: error: ") and done.stderr.count("\n") == 1
    for invoke_words in ("No idea what", "needed value", "<Argument", "Traceback"):
        assert invoke_words not in done.stderr


def test_a_run_config_before_the_command_is_refused_not_loaded(tmp_path: Path) -> None:
    config = tmp_path / "dev.yaml"
    config.write_text("run: {echo: true}\n")  # as invoke config, this would turn on command echo
    done = forge("--config", str(config), "validate", str(PACK), tmp_path=tmp_path)
    assert done.returncode == EXIT_USAGE
    assert done.stdout == ""


# ----------------------------------------------------------------------------------------- short flags


def test_a_short_flag_means_one_option_in_every_command() -> None:
    meaning: dict[str, set[str]] = {}
    for name in ns.tasks:
        for o in options(ns.tasks[name]):
            if o.short:
                meaning.setdefault(o.short, set()).add(o.long)
                assert SHORT_FLAGS[o.param] == o.short[1:], (name, o)
    assert meaning, "no command has a short flag"
    several = {short: longs for short, longs in meaning.items() if len(longs) > 1}
    assert not several, f"short flags with more than one meaning: {several}"
    assert "-h" not in meaning and "-V" not in meaning  # forge's own
    assert len(set(SHORT_FLAGS.values())) == len(SHORT_FLAGS)


def test_invoke_sees_the_same_short_flags_as_forge() -> None:
    for name in ns.tasks:
        for arg in ns.tasks[name].get_arguments():
            param = arg.attr_name or arg.names[0]
            assert arg.nicknames == ((SHORT_FLAGS[param],) if param in SHORT_FLAGS else ()), (name, param)
            assert arg.help is not None or not ns.tasks[name].help, (name, param)


def test_the_short_flags_that_meant_something_else_are_gone() -> None:
    assert "forge run has no option -p" in usage_error("run", "c.yaml", "-p")  # -p is --project only
    assert kwargs("report", "r", "--open") == {"run_dir": "r", "open": True}
    assert "no option -a" in usage_error("snapshots", "-a", "ls")
    assert "no option -o" in usage_error("snapshots", "prune", "-o", "3")
