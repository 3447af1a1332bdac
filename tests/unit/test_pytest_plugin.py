"""The pytest plugin without an engine: inert unless used, off with ``-p no:forgelib``, and a wrong marker or
project is a test error naming the fix before any Docker call. (Stacks themselves: the integration tests.)"""

from __future__ import annotations

import os
import re
import secrets
import sys
import tempfile
from pathlib import Path

import pytest

from forgelib.pytest_plugin.stacks import run_id_for


def _no_docker_path(tmp_path: Path) -> str:
    """A PATH with the interpreter's directory but no ``docker``: any Docker call would fail loudly."""
    empty = tmp_path / "bin"
    empty.mkdir()
    return os.pathsep.join([str(empty), str(Path(sys.executable).parent)])


def test_inert_when_no_test_uses_it(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # A subprocess, so "never imported" means something: nothing of forgelib's provisioning is loaded,
    # no signal handler is installed, and no Docker is needed.
    monkeypatch.setenv("PATH", _no_docker_path(pytester.path))
    pytester.makeconftest(
        """
import signal, sys

def pytest_sessionfinish(session):
    heavy = sorted(m for m in sys.modules if m.startswith("forgelib.") and m != "forgelib.pytest_plugin")
    assert not heavy, heavy
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
"""
    )
    pytester.makepyfile(
        """
import pytest, signal

def test_plain():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

@pytest.mark.forge(project="nowhere")   # a marker without the fixture provisions nothing
def test_marked_only():
    pass
"""
    )
    result = pytester.runpytest_subprocess("--strict-markers", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["plugins:*forgelib-*"])  # loaded through its entry point, and idle
    result.stdout.no_fnmatch_line("*= forgelib =*")


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.forge(project, task=None, scope='function'):*"])


def test_p_no_forgelib_turns_it_off(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(forge_stack):\n    pass\n")
    result = pytester.runpytest("-p", "no:forgelib")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'forge_stack' not found*"])


def test_wrong_marker_or_project_is_a_test_error_naming_the_fix(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", _no_docker_path(pytester.path))
    pytester.makepyfile(
        """
import pytest

def test_unmarked(forge_stack):
    pass

@pytest.mark.forge(project="p", scop="module")
def test_typo(forge_stack):
    pass

@pytest.mark.forge(project="p", scope="class")
def test_bad_scope(forge_stack):
    pass

@pytest.mark.forge("a", "b")
def test_two_positional(forge_stack):
    pass

@pytest.mark.forge(project="does/not/exist")
def test_missing_project(forge_stack):
    pass
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-rE")
    result.assert_outcomes(errors=5)
    out = result.stdout.str()
    assert "Traceback" not in out
    assert "During handling" not in out
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_unmarked*",
            "forge_stack needs a stack to provision: mark the test (or its class/module) with *",
            "*ERROR at setup of test_typo*",
            "@pytest.mark.forge: unknown argument(s) scop; known: project, task, scope",
            "*ERROR at setup of test_bad_scope*",
            "@pytest.mark.forge: scope='class': use one of function, module, session",
            "*ERROR at setup of test_two_positional*",
            "@pytest.mark.forge: takes the project as its only positional argument, got 2",
            "*ERROR at setup of test_missing_project*",
            f"*{pytester.path / 'does/not/exist'} does not exist or is not a file; pass a project directory*",
        ]
    )


def test_run_ids_name_the_xdist_worker() -> None:
    assert run_id_for("0123456789abcdef", "gw3") == "pytest-01234567-gw3"
    assert run_id_for("0123456789abcdef", None) == "pytest-01234567"


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sessions under test run in this process: when this suite itself runs under xdist (``-n 4``), they
    must not inherit its worker's identity (the recorder names its event file after it)."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


# The scoping and reporting logic, with the pool's Docker work replaced by a recorder (the real pool is
# proven on the engine in tests/integration/test_pytest_plugin.py): when stacks are provisioned, reset,
# released and torn down, and what a failed test's report carries.
RECORDER = """
import os
from pathlib import Path
import pytest
import forgelib.stacks.backends
from forgelib.errors import ProvisionError
from forgelib.pytest_plugin.stacks import ProvisionFailed, StackPool

EVENTS = []
PROCESS = os.environ.get("PYTEST_XDIST_WORKER", "main")  # under xdist: gwN, or main for the controller
REAPED = Path(__file__).parent / "reaped"
(Path(__file__).parent / f"pid-{PROCESS}").write_text(str(os.getpid()))

def heal_leftovers(runner, say):
    EVENTS.append(("reap", PROCESS))
    REAPED.touch()
    say(f"the reaper ran in {PROCESS}")

forgelib.stacks.backends.heal_leftovers = heal_leftovers

class Stack:
    def __init__(self, name):
        self.name = name
    def release(self):
        EVENTS.append(("release", self.name))
    def log_tails(self, lines):
        return {"db": f"last {lines} lines of " + self.name}

def provision(self, project, task):
    name = f"{project.name}:{task}"
    EVENTS.append(("provision", name) if REAPED.exists() else ("provision before the reaper", name))
    self.notes.append(f"{PROCESS} provisioned {name}")
    if project.name == "broken":
        raise ProvisionFailed(ProvisionError("reset_recipe", "the seed is broken"), {"db": "db's log"})
    return Stack(name)

def acquire(self, project, task, warm):
    name = f"{project.name}:{task}"
    if name in warm:
        EVENTS.append(("reset", name))
        return warm[name]
    warm[name] = provision(self, project, task)
    return warm[name]

def give_back(self, stack, warm):
    stack.release()

def close_warm(self, warm):
    EVENTS.extend(("teardown", name) for name in warm)
    warm.clear()

StackPool.provision = provision
StackPool.acquire = acquire
StackPool.give_back = give_back
StackPool.close_warm = close_warm
StackPool.teardown = lambda self, stack: EVENTS.append(("teardown", stack.name))

def pytest_sessionfinish(session):
    import json, pathlib
    (pathlib.Path(__file__).parent / f"events-{PROCESS}.json").write_text(json.dumps(EVENTS))
"""


def _events(pytester: pytest.Pytester, process: str = "main") -> list[tuple[str, str]]:
    import json

    return [tuple(e) for e in json.loads((pytester.path / f"events-{process}.json").read_text())]


def test_scopes_provision_reset_and_tear_down_when_they_should(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(RECORDER)
    mod = """
import pytest
pytestmark = pytest.mark.forge(project="{project}", task="t", scope="{scope}")
def test_1(forge_stack): pass
def test_2(forge_stack): pass
@pytest.mark.forge(project="fresh")
def test_3(forge_stack): pass
"""
    pytester.makepyfile(
        test_a=mod.format(project="m", scope="module"),
        test_b=mod.format(project="m", scope="module"),
        test_c=mod.format(project="s", scope="session"),
        test_d=mod.format(project="s", scope="session"),
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=12)
    m, s, fresh = "m:t", "s:t", "fresh:None"
    per_module = [("provision", m), ("release", m), ("reset", m), ("release", m)]
    per_module += [("provision", fresh), ("teardown", fresh)]
    assert _events(pytester) == [
        ("reap", "main"),  # once, before the first test
        *per_module, ("teardown", m),  # test_a: the module's stack goes when the module ends
        *per_module, ("teardown", m),  # test_b: a stack of its own
        ("provision", s), ("release", s), ("reset", s), ("release", s), *per_module[-2:],
        ("reset", s), ("release", s), ("reset", s), ("release", s), *per_module[-2:],
        ("teardown", s),  # test_c and test_d share one session stack, removed at the end
    ]  # fmt: skip


def test_a_failed_provision_is_an_error_for_every_test_that_shares_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(RECORDER)
    pytester.makepyfile(
        """
import pytest
pytestmark = pytest.mark.forge(project="broken", scope="module")
def test_1(forge_stack): pass
def test_2(forge_stack): pass
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    assert _events(pytester) == [("reap", "main"), ("provision", "broken:None")]  # once, not per test
    out = result.stdout.str()
    # Whole lines: the short summary repeats the reason too, cut to the terminal width unless CI is set.
    assert out.splitlines().count("provisioning failed at reset_recipe: the seed is broken") == 2
    assert out.count("forge log: db") == 2 and "db's log" in out
    assert "Traceback" not in out and "During handling" not in out


def test_a_failed_test_carries_its_stacks_log_tails_and_a_passing_one_does_not(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(RECORDER)
    pytester.makeini("[pytest]\nforge_log_tail_lines = 7\n")
    pytester.makepyfile(
        """
import pytest
pytestmark = pytest.mark.forge(project="p")
def test_passes(forge_stack): pass
def test_fails(forge_stack): assert forge_stack.name == "other"
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*_ test_fails _*", "*AssertionError*", "*- forge log: db -*", "last 7 lines of p:None"]
    )
    assert result.stdout.str().count("forge log: db") == 1


def test_under_xdist_the_controller_reaps_once_before_it_hands_out_a_test(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(RECORDER)
    mod = """
import pytest
pytestmark = pytest.mark.forge(project="{project}")
def test_1(forge_stack): pass
def test_2(forge_stack): pass
"""
    pytester.makepyfile(test_a=mod.format(project="a"), test_b=mod.format(project="b"))
    uid = secrets.token_hex(8)
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadfile", f"--testrunuid={uid}", "-p", "no:cacheprovider"
    )  # fmt: skip
    result.assert_outcomes(passed=4)
    assert _events(pytester) == [("reap", "main")]
    # Each worker provisioned after the reaper had run, and ran no reaper of its own.
    provisioned = {e for worker in ("gw0", "gw1") for e in _events(pytester, worker) if e[0] != "teardown"}
    assert provisioned == {("provision", "a:None"), ("provision", "b:None")}
    # The controller's summary carries its own notes and its workers' ones.
    out = result.stdout.str()
    assert out.count("forge: the reaper ran in main") == 1
    assert sorted(re.findall(r"forge: \[(gw\d)\] \1 provisioned", out)) == ["gw0", "gw0", "gw1", "gw1"]
    # The directory through which the workers told the controller that they use stacks is gone.
    controller = (pytester.path / "pid-main").read_text()
    assert not list(Path(tempfile.gettempdir()).glob(f"forge-pytest-{controller}-*"))
