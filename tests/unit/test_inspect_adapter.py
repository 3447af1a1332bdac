"""forgelib.inspect without an engine: forge never loads inspect_ai unless asked, and the parts of the
sandbox that decide things (default service, config, concurrency, the grade's explanation) decide right.
The sandbox itself is proven on the real engine by tests/integration/test_inspect_sandbox.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from forgelib.grading.score import CheckOutcome, grade
from forgelib.inspect.stacks import SandboxConfigError, default_concurrency, default_service
from forgelib.spec import models as m

ROOT = Path(__file__).resolve().parents[2]


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print('\\n'.join(sys.modules))"],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=120,
    ).stdout  # fmt: skip
    return set(out.split())


def test_import_forgelib_and_the_cli_never_load_inspect() -> None:
    loaded = _modules_after("import forgelib, forgelib.cli.program, forgelib.cli.run, forgelib.pytest_plugin")
    assert not {n for n in loaded if n.split(".")[0] == "inspect_ai"}
    assert "forgelib.inspect" not in loaded
    help_run = subprocess.run(
        [sys.executable, "-c",
         "import runpy, sys; sys.argv = ['forge', '--help']\n"
         "try:\n    runpy.run_module('forgelib', run_name='__main__')\nexcept SystemExit:\n    pass\n"
         "print('LOADED', sorted(n for n in sys.modules if n.split('.')[0] == 'inspect_ai'))"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert "LOADED []" in help_run.stdout, help_run.stdout + help_run.stderr
    assert "run" in help_run.stdout  # the help was printed


def test_the_package_imports_inspect_only_for_its_public_names() -> None:
    # forgelib.inspect itself is cheap; stacks and grade never touch inspect, even where it is installed
    loaded = _modules_after("import forgelib.inspect, forgelib.inspect.stacks, forgelib.inspect.grade")
    assert not {n for n in loaded if n.split(".")[0] == "inspect_ai"}
    # and the stdlib's inspect is still the stdlib's inside the package
    out = _modules_after("import forgelib.inspect.stacks, inspect; assert hasattr(inspect, 'signature')")
    assert "inspect" in out


def _env(services: dict[str, dict[str, object]]) -> m.EnvironmentManifest:
    svc = {n: m.Service(n, m.Isolation.EPHEMERAL) for n in services}
    return m.EnvironmentManifest((Path("/p/compose.yaml"),), svc, {"services": services})


def test_default_service_rules() -> None:
    assert default_service(_env({"db": {}, "default": {}}), None, "here") == "default"
    assert default_service(_env({"db": {}, "box": {"x-default": True}}), None, "here") == "box"
    assert default_service(_env({"db": {}, "box": {}}), "db", "here") == "db"
    with pytest.raises(SandboxConfigError, match=r"default service 'nope' is not a service .* box, db"):
        default_service(_env({"db": {}, "box": {}}), "nope", "here")
    with pytest.raises(SandboxConfigError, match=r"here: no default service .*services: box, db.*x-default"):
        default_service(_env({"db": {}, "box": {}}), None, "here")
    with pytest.raises(SandboxConfigError, match="all marked x-default"):
        default_service(_env({"a": {"x-default": True}, "b": {"x-default": True}}), None, "here")


def test_default_concurrency_fits_the_machine() -> None:
    import os

    n = default_concurrency()
    assert 1 <= n <= 2 * len(os.sched_getaffinity(0))


def test_config_forms() -> None:
    pytest.importorskip("pydantic")
    from forgelib.inspect.config import ForgeConfig, key, parse, settings

    assert parse("pack/project.yaml") == ForgeConfig(project="pack/project.yaml")
    cfg = parse({"project": "pack", "stacks": "warm", "default": "runner"})
    assert cfg.stacks == "warm" and cfg.default == "runner"
    assert settings(cfg, Path("/tasks")).project == Path("/tasks/pack")
    assert key(cfg) == key(ForgeConfig(project="pack", stacks="warm", default="runner"))
    with pytest.raises(SandboxConfigError, match="stacks"):
        parse({"project": "pack", "stacks": "tepid"})
    with pytest.raises(SandboxConfigError, match="needs a project"):
        parse(None)


def test_explanation_carries_every_checks_reason() -> None:
    from forgelib.inspect.grade import explain

    ok = CheckOutcome("db", "sql", 1.0, False, True, "baseline", "equals 'baseline'")
    bad = CheckOutcome("file", "file", 1.0, True, False, "x", "equals 'y'")
    text = explain(grade([ok, bad], 1.0))
    assert "check db: passed (observed 'baseline')" in text
    assert "gate 'file' failed: expected equals 'y', observed 'x'" in text
    assert text.startswith("forge grade: fail, score 0.500")


def test_explanation_says_undecided_never_failed() -> None:
    from forgelib.inspect.grade import explain

    ok = CheckOutcome("db", "sql", 1.0, False, True, "baseline", "equals 'baseline'")
    why = "cannot be decided: an inspect sample's tool calls are not a forge trace"
    trace = CheckOutcome("called", "trace", 1.0, True, False, None, "a call", why, decided=False)
    text = explain(grade([ok, trace], 1.0))
    assert f"- gate called: undecided: {why}" in text.splitlines()
    assert "failed" not in text and text.startswith("forge grade: pass, score 1.000")


def test_a_grade_observes_its_read_only_checks_at_once_and_keeps_their_order(tmp_path: Path) -> None:
    """Two file checks in two services: each one's ``docker exec`` waits at a barrier only the other can
    pass, so the grade completes only if both are under way at once; the outcomes keep the file's order."""
    import threading

    from forgelib.docker.compose import ComposeProject
    from forgelib.inspect.grade import grade_stack
    from forgelib.spec.loader import load_grading
    from forgelib.stacks.stack import Stack
    from forgelib.testing import FakeRunner

    (tmp_path / "grading.yaml").write_text(
        "checks:\n"
        "  - {name: a, file: {service: main, path: /a.txt, equals: one}}\n"
        "  - {name: b, file: {service: db, path: /b.txt, equals: two}}\n"
    )
    grading = load_grading(tmp_path / "grading.yaml", {"main": {}, "db": {}})
    env = _env({"main": {}, "db": {}})
    task = m.Task("t", tmp_path / "task.yaml", "", env, grading=grading)
    both = threading.Barrier(2, timeout=30)
    fake = FakeRunner()
    fake.expect("docker", "exec", "p-main-1", stdout="one\n", side_effect=lambda _: both.wait())
    fake.expect("docker", "exec", "p-db-1", stdout="two\n", side_effect=lambda _: both.wait())
    compose = ComposeProject("p", (), fake, direct=True)
    stack = Stack("p", env, compose, {}, {}, tmp_path)
    g = grade_stack(stack, task, fake, env={}, timeouts=m.Timeouts())
    assert [(o.name, o.passed, o.observed) for o in g.checks] == [("a", True, "one"), ("b", True, "two")]
