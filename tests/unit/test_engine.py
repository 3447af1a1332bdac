"""ensure_engine: probe first, bootstrap through scripts/engine.sh only when needed, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from forgelib.docker import engine
from forgelib.docker.engine import BOOTSTRAP_TIMEOUT, PROBE_TIMEOUT, EngineError, ensure_engine
from forgelib.errors import ProgramNotFound
from forgelib.resources import data_dir
from forgelib.testing import FakeRunner

INFO = ("docker", "info", "--format", "{{.ServerVersion}}")
COMPOSE = ("docker", "compose", "version", "--short")
SCRIPT = ("bash", str(data_dir("scripts") / "engine.sh"))


@pytest.fixture
def root_on_debian(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    marker = tmp_path / "debian_version"
    marker.write_text("12.11\n")
    monkeypatch.setattr(engine, "DEBIAN_MARKER", marker)
    monkeypatch.setattr(engine.os, "geteuid", lambda: 0)


def test_ready_engine_is_left_alone() -> None:
    fake = FakeRunner()
    fake.expect(*INFO, exact=True, stdout="20.10.24+dfsg1\n")
    fake.expect(*COMPOSE, exact=True, stdout="2.40.3\n")

    status = ensure_engine(fake)

    assert status.ready and status.server == "20.10.24+dfsg1" and status.compose == "2.40.3"
    assert fake.argvs() == [INFO, COMPOSE]
    assert all(c.timeout == PROBE_TIMEOUT for c in fake.calls)


def test_bootstraps_through_the_script_then_checks_again(root_on_debian: None) -> None:
    fake = FakeRunner()
    fake.expect(*INFO, exact=True, rc=1, stderr="Cannot connect to the Docker daemon", times=1)
    fake.expect(*COMPOSE, exact=True, rc=1, times=1)
    fake.expect(*SCRIPT, exact=True)
    fake.expect(*INFO, exact=True, stdout="20.10.24\n")
    fake.expect(*COMPOSE, exact=True, stdout="v2.40.3\n")

    assert ensure_engine(fake).ready
    assert fake.argvs() == [INFO, COMPOSE, SCRIPT, INFO, COMPOSE]
    assert fake.calls[2].timeout == BOOTSTRAP_TIMEOUT


def test_missing_docker_cli_counts_as_no_engine(root_on_debian: None) -> None:
    fake = FakeRunner()
    fake.expect("docker", raises=ProgramNotFound("docker"), times=2)
    fake.expect(*SCRIPT, exact=True)
    fake.expect(*INFO, exact=True, stdout="20.10.24\n")
    fake.expect(*COMPOSE, exact=True, stdout="2.40.3\n")

    assert ensure_engine(fake).ready
    assert SCRIPT in fake.argvs()


def test_compose_v1_is_not_enough(root_on_debian: None) -> None:
    fake = FakeRunner()
    fake.expect(*INFO, exact=True, stdout="24.0.7\n")
    fake.expect(*COMPOSE, exact=True, stdout="1.29.2\n", times=1)
    fake.expect(*SCRIPT, exact=True)
    fake.expect(*COMPOSE, exact=True, stdout="2.40.3\n")

    assert ensure_engine(fake).compose == "2.40.3"


def test_not_root_says_so_before_running_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.os, "geteuid", lambda: 1000)
    fake = FakeRunner()
    fake.expect(*INFO, exact=True, rc=1)
    fake.expect(*COMPOSE, exact=True, rc=1)

    with pytest.raises(EngineError, match=r"needs root: run `sudo forge engine`"):
        ensure_engine(fake)
    assert SCRIPT not in fake.argvs()


def test_not_debian_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(engine.os, "geteuid", lambda: 0)
    monkeypatch.setattr(engine, "DEBIAN_MARKER", tmp_path / "absent")
    fake = FakeRunner()
    fake.expect(*INFO, exact=True, rc=1)
    fake.expect(*COMPOSE, exact=True, rc=1)

    with pytest.raises(EngineError, match=r"not Debian .* install Docker Engine"):
        ensure_engine(fake)


def test_daemon_that_will_not_start_shows_the_log_tail(root_on_debian: None) -> None:
    stderr = (
        "engine: starting dockerd (log: /var/log/forge-dockerd.log)\n"
        "failed to start daemon: Error initializing network controller: iptables not found\n"
        "engine: error: dockerd exited during start-up (log tail above; full log: /var/log/dockerd.log)\n"
    )
    fake = FakeRunner()
    fake.expect(*INFO, exact=True, rc=1)
    fake.expect(*COMPOSE, exact=True, rc=1)
    fake.expect(*SCRIPT, exact=True, rc=1, stderr=stderr)

    with pytest.raises(EngineError) as err:
        ensure_engine(fake)
    message = str(err.value)
    assert message.startswith("bootstrapping the engine failed: dockerd exited during start-up")
    assert "iptables not found" in message  # the daemon's own words reach the user


def test_script_success_without_an_answer_is_an_error(root_on_debian: None) -> None:
    fake = FakeRunner()
    fake.expect(*INFO, exact=True, rc=1)
    fake.expect(*COMPOSE, exact=True, stdout="2.40.3\n")
    fake.expect(*SCRIPT, exact=True)

    with pytest.raises(EngineError, match=r"finished but no Docker engine answers"):
        ensure_engine(fake)
