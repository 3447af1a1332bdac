"""Sessions: `nox -l` lists them. The README's test command is `nox -s lint tests integration e2e harbor`."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests"]  # the fast ones; integration/e2e need a real engine
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
# uv builds a session venv in seconds; plain virtualenv where uv is not installed.
nox.options.default_venv_backend = "uv|virtualenv"

PYTEST = ["pytest", "--strict-markers", "--strict-config", "--durations=15"]  # the slowest tests, in CI's log


def _install(session: nox.Session) -> None:
    session.install("-e", ".[dev]")


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """Unit tests: no Docker needed (commands go through the fake runner). One worker per core (xdist):
    the suite is CPU-bound, and its tests share nothing."""
    _install(session)
    session.run(*PYTEST, "-n", "auto", "tests/unit", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff and mypy over forgelib, tasks.py and noxfile.py."""
    _install(session)
    session.run("ruff", "check", "forgelib", "tasks.py", "noxfile.py", "tests", "benchmarks")
    session.run("ruff", "format", "--check", "forgelib", "tasks.py", "noxfile.py")
    session.run("mypy")
    session.run("python", "-m", "forgelib.docsgen", "--check")  # docs/ as the code generates it


@nox.session(python="3.11")
def integration(session: nox.Session) -> None:
    """Integration tests on a real Docker engine (started and imaged by the tests if needed); Ray for the
    cluster tests (tests/integration/test_cluster.py starts its own nodes and second engine)."""
    _install(session)
    session.install("-e", ".[ray]")
    session.install("-e", ".[inspect]")  # tests/integration/test_inspect_sandbox.py
    # `nox -s integration -- tests/integration/test_x.py -k y` runs just that file: a path among the
    # arguments replaces the folder instead of being added to it.
    paths = [a for a in session.posargs if a.startswith("tests/")]
    if paths:
        session.run(*PYTEST, "-m", "integration", *session.posargs)
        return
    # The tests mostly wait on the engine, so three files run at a time (a file stays on one worker: its
    # module-scoped stacks are shared); on CI's 2 cores that keeps them busy (benchmarks/README.md, "CI").
    # Tests marked engine_alone follow, alone (docs/development.md).
    folder = "tests/integration"
    parallel = ["-n", "3", "--dist", "loadfile"]
    session.run(*PYTEST, *parallel, "-m", "integration and not engine_alone", folder, *session.posargs)
    session.run(*PYTEST, "-m", "integration and engine_alone", folder, *session.posargs)


@nox.session(python="3.11")
def e2e(session: nox.Session) -> None:
    """End to end on a real engine: each reference pack through the forge CLI (tests/e2e, a file per pack),
    then a suite written only against the pytest plugin (examples/pytest_suite: its own pytest.ini, so its
    own rootdir). `nox -s e2e -- tests/e2e/test_cache_debug.py` runs one of them."""
    _install(session)
    paths = [a for a in session.posargs if a.startswith(("tests/", "examples/"))]
    if paths:
        session.run(*PYTEST, *(["-m", "e2e"] if paths[0].startswith("tests/") else []), *session.posargs)
        return
    # Two pack files at a time, as the integration files run (each run's resources are its own).
    session.run(*PYTEST, "-n", "2", "--dist", "loadfile", "-m", "e2e", "tests/e2e", *session.posargs)
    session.run(*PYTEST, "examples/pytest_suite", *session.posargs)


@nox.session(python=False)
def harbor(session: nox.Session) -> None:
    """forge as a harbor environment (tests/harbor) in a Python 3.12+ venv made from the machine's pyenv:
    harbor needs 3.12, forgelib's own suites run on 3.11. Skipped, saying so, where there is none."""
    session.run("bash", "scripts/harbor-tests.sh", external=True)


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks (opt-in): ratios against baselines measured in the same run; writes benchmarks/results/."""
    _install(session)
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Regenerate docs/lifecycle.md, commands.md and spec.md from the code (lint fails when they differ)."""
    _install(session)
    session.run("python", "-m", "forgelib.docsgen")
