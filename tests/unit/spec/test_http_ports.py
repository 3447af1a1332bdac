"""An ``http:`` check on a port its service does not publish fails at run time (forge reaches the port from
the host), so validate refuses it: exit 1, at the check's port, with the fix. A port the compose file does
not state for certain is not guessed at."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from forgelib.spec.composefiles import load_compose_set
from forgelib.spec.models import SeedKind
from forgelib.spec.ports import service_ports
from forgelib.spec.validate import validate_project

from ._support import edit

COMPOSE = "shared/environment.compose.yaml"
CHECKS = "tasks/warm_cache/checks.yaml"
RUNNER_PORTS = '    ports: ["8000"]  # tasks/warm_cache\'s http check reaches it from the host\n'


def _runner(basic: Path, lines: str) -> None:
    """Replace the runner's ports line in the fixture's compose file with ``lines``."""
    edit(basic / COMPOSE, RUNNER_PORTS, lines)


def _check_port(basic: Path, port: int, service: str = "runner") -> None:
    edit(basic / CHECKS, "http: {service: runner, port: 8000,", f"http: {{service: {service}, port: {port},")


def _errors(basic: Path) -> list[str]:
    return [str(i) for i in validate_project(str(basic)).errors]


def test_the_fixture_checks_a_published_port(basic: Path) -> None:
    assert _errors(basic) == []


@pytest.mark.parametrize(
    ("ports", "port", "words"),
    [
        (
            RUNNER_PORTS,
            8080,
            "service 'runner' does not publish port 8080 (it publishes 8000); use one of those, "
            'or add "8080" to its ports: in ',
        ),
        (
            '    expose: ["8000"]\n',
            8000,
            "service 'runner' only exposes port 8000 (expose: lets the other services reach it, not the "
            "host); an http check connects from the host, so publish it: "
            "add ports: [\"8000\"] to service 'runner' in ",
        ),
        (
            "",
            8000,
            "service 'runner' publishes no ports, so an http check from the host cannot reach port 8000; "
            "add ports: [\"8000\"] to service 'runner' in ",
        ),
        ("    ports: [{target: 8000, protocol: udp}]\n", 8000, "publishes no ports"),
    ],
    ids=["other-port", "expose-only", "no-ports", "udp-only"],
)
def test_a_port_the_service_does_not_publish_is_refused_at_the_check(
    basic: Path, ports: str, port: int, words: str
) -> None:
    _runner(basic, ports)
    if port != 8000:
        _check_port(basic, port)
    (error,) = _errors(basic)
    assert f"{CHECKS}:5:35: $.checks[1].http.port: " in error, error
    assert words in error, error
    assert f"{COMPOSE}" in error.split(words, 1)[1]  # the file to add the port to


@pytest.mark.parametrize(
    "ports",
    [
        '    ports: ["127.0.0.1:18000:8000/tcp"]\n',
        '    ports: ["[::1]:18000:8000"]\n',
        "    ports: [8000]\n",
        '    ports: ["7990-8010"]\n',
        "    ports: [{target: 8000, published: 18000}]\n",
        '    ports: ["9000"]\n    network_mode: "service:files"\n',  # not its own ports: not checked
        '    ports: ["${API_PORT:-8000}"]\n',  # a variable: not guessed at
    ],
)
def test_published_ports_in_every_syntax_and_unknowable_ones_pass(basic: Path, ports: str) -> None:
    _runner(basic, ports)
    assert _errors(basic) == []


def test_a_reset_services_direct_port_is_published_and_others_are_not(basic: Path) -> None:
    _check_port(basic, 5432, service="app-db")  # postgres, reset from a sql dump: forge publishes 5432
    assert _errors(basic) == []
    edit(basic / CHECKS, "port: 5432,", "port: 8080,")
    (error,) = _errors(basic)
    assert "service 'app-db' does not publish port 8080 (it publishes 5432)" in error, error


def test_ports_added_by_an_override_file_count(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("services:\n  web:\n    image: x\n    expose: ['9000']\n")
    (tmp_path / "b.yaml").write_text("services:\n  web:\n    ports: ['8000']\n  db:\n    image: postgres\n")
    cset = load_compose_set([tmp_path / "a.yaml", tmp_path / "b.yaml"])
    ports = service_ports(cset, {"db": SeedKind.SQL_DUMP})
    assert ports["web"].published == {8000} and ports["web"].exposed == {9000}
    assert ports["web"].compose_file.endswith("a.yaml")  # where the service is defined
    assert ports["db"].published == {5432}


def test_the_program_exits_1_naming_the_file_line_and_fix(basic: Path, tmp_path: Path) -> None:
    _check_port(basic, 8080)
    env = {**os.environ, "FORGE_LOG": str(tmp_path / "forge.log")}
    run = [sys.executable, "-m", "forgelib", "validate", "--project", str(basic)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert (
        "checks.yaml:5:35: $.checks[1].http.port: service 'runner' does not publish port 8080" in done.stderr
    )
    assert 'or add "8080" to its ports: in ' in done.stderr
