"""forgelib.docker.readiness without an engine: the healthcheck argv, the order containers are started in for
each ``depends_on`` condition, and how a container that exits or that Docker finds unhealthy fails. (That it
brings real stacks up: tests/integration/test_provision.py and every provisioning test on the engine.)"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from forgelib.docker.compose import ComposeProject
from forgelib.docker.readiness import NotReady, health_argv, start
from forgelib.docker.resolved import ResolvedConfig, ServiceConfig
from forgelib.spec.models import Timeouts
from forgelib.testing import ANY, FakeRunner

T = Timeouts(compose_up=100, recipe=40, teardown=50, command=9)
HC = {"Test": ["CMD", "check"], "Timeout": 3_000_000_000}


def test_health_argv_is_what_docker_would_run() -> None:
    assert health_argv({"Config": {"Healthcheck": {**HC, "Test": ["CMD", "test", "-d", "/w"]}}}) == (
        ["test", "-d", "/w"],
        3.0,
    )
    shell = health_argv({"Config": {"Healthcheck": {"Test": ["CMD-SHELL", "curl -f x || exit 1"]}}})
    assert shell == (["/bin/sh", "-c", "curl -f x || exit 1"], 30.0)
    assert health_argv({"Config": {"Healthcheck": {"Test": ["NONE"]}}})[0] is None
    assert health_argv({"Config": {}})[0] is None


def _stack(fake: FakeRunner, services: dict[str, dict[str, Any] | None]) -> ComposeProject:
    """``services``: name -> its healthcheck (None: none); one container each, id ``id-<name>``."""
    infos = [
        {
            "Id": f"id-{n}",
            "Name": f"/p-{n}-1",
            "Config": {"Labels": {"com.docker.compose.service": n}, **({"Healthcheck": hc} if hc else {})},
        }
        for n, hc in services.items()
    ]
    fake.expect("docker", "ps", "--all", stdout="\n".join(f"id-{n}" for n in services))
    fake.expect("docker", "inspect", ANY, stdout=json.dumps(infos), times=1)  # containers(), first
    return ComposeProject("p", (Path("/x/compose.yaml"),), fake, T)


def _state(fake: FakeRunner, cid: str, times: int | None = None, **state: Any) -> None:
    fake.expect(
        "docker", "inspect", "--format", "{{json .State}}", cid, stdout=json.dumps(state), times=times
    )


def _order(fake: FakeRunner) -> list[str]:
    """What was started and probed, in order: ``start <svc>`` / ``probe <svc>``."""
    out = []
    for c in fake.calls:
        if c.argv[:2] == ("docker", "start"):
            out.append("start " + c.argv[2].removeprefix("id-"))
        elif c.argv[:2] == ("docker", "exec"):
            out.append("probe " + c.argv[2].removeprefix("id-"))
    return out


def _services(raw: dict[str, Any]) -> Mapping[str, ServiceConfig]:
    """The resolved config's services, typed, as ``start`` takes them."""
    return ResolvedConfig.of({"services": raw}).services


def test_a_dependent_starts_once_the_dependency_is_healthy_by_its_own_check() -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"db": HC, "api": None})
    _state(fake, "id-db", Status="running", Health={"Status": "starting"})  # Docker's tick is not there yet
    _state(fake, "id-api", Status="running")
    fake.expect("docker", "exec", "id-db", "check", rc=1, times=2)  # not yet, not yet...
    fake.expect("docker", "exec", "id-db", "check", rc=0)  # ...ready
    fake.expect("docker", "start")
    deps = {"api": {"depends_on": {"db": {"condition": "service_healthy"}}}}
    start(compose, _services(deps), ["db", "api"])
    assert _order(fake) == ["start db", "probe db", "probe db", "probe db", "start api"]
    assert {c.tag for c in fake.calls if c.argv[1] in ("start", "exec")} == {"start", "exec"}


def test_service_started_does_not_wait_for_health_and_completed_waits_for_exit_0() -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"db": HC, "migrate": None, "api": None, "side": None})
    _state(fake, "id-db", Status="running")
    _state(fake, "id-migrate", times=1, Status="running")
    _state(fake, "id-migrate", Status="exited", ExitCode=0)
    _state(fake, "id-api", Status="running")
    _state(fake, "id-side", Status="running")
    fake.expect("docker", "exec", "id-db", "check", rc=0)
    fake.expect("docker", "start")
    deps = {
        "side": {"depends_on": {"db": {"condition": "service_started"}}},
        "api": {"depends_on": {"migrate": {"condition": "service_completed_successfully"}}},
    }
    start(compose, _services(deps), ["db", "migrate", "api", "side"])
    order = _order(fake)
    assert order.index("start side") > order.index("start db")
    # api only after migrate was seen exited (its second state read), never while it still ran
    reads = [i for i, c in enumerate(fake.calls) if c.argv[2] == "--format" and c.argv[-1] == "id-migrate"]
    api_start = next(i for i, c in enumerate(fake.calls) if c.argv[:3] == ("docker", "start", "id-api"))
    assert len(reads) == 2 and reads[1] < api_start


@pytest.mark.parametrize(
    "implicit",
    [{"network_mode": "service:db"}, {"volumes_from": ["db:ro"]}, {"links": ["db:database"]}],
)
def test_what_compose_orders_by_implicitly_starts_first(implicit: dict[str, Any]) -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"db": None, "api": None})
    _state(fake, "id-db", Status="running")
    _state(fake, "id-api", Status="running")
    fake.expect("docker", "start")
    start(compose, _services({"api": implicit}), ["api", "db"])
    assert _order(fake) == ["start db", "start api"]


@pytest.mark.parametrize(
    ("state", "said"),
    [
        (
            {"Status": "running", "Health": {"Status": "unhealthy"}},
            "service 'db' container p-db-1 is unhealthy",
        ),
        ({"Status": "exited", "ExitCode": 3}, "service 'db' container p-db-1 exited (3)"),
    ],
)
def test_a_failing_dependency_fails_fast_and_its_dependents_never_start(
    state: dict[str, Any], said: str
) -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"db": HC, "api": None})
    _state(fake, "id-db", **state)
    fake.expect("docker", "exec", "id-db", "check", rc=1)
    fake.expect("docker", "start")
    with pytest.raises(NotReady) as err:
        start(
            compose,
            _services({"api": {"depends_on": {"db": {"condition": "service_healthy"}}}}),
            ["db", "api"],
        )
    assert err.value.service == "db"
    assert str(err.value).startswith(said)
    assert "start api" not in _order(fake)


def test_on_ready_runs_as_each_service_is_ready_beside_its_dependents_start() -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"db": HC, "api": None})
    _state(fake, "id-db", Status="running")
    _state(fake, "id-api", Status="running")
    fake.expect("docker", "exec", "id-db", "check", rc=0)
    fake.expect("docker", "start")
    seen: list[tuple[str, int]] = []  # (service, how many calls the runner had made by then)
    deps = {"api": {"depends_on": {"db": {"condition": "service_healthy"}}}}
    start(compose, _services(deps), ["db", "api"], on_ready=lambda svc: seen.append((svc, len(fake.calls))))
    assert sorted(s for s, _ in seen) == ["api", "db"]
    db_ready = dict(seen)["db"]
    probe_db = next(i for i, c in enumerate(fake.calls) if c.argv[:3] == ("docker", "exec", "id-db"))
    assert db_ready > probe_db  # only once its own check passed


def test_what_on_ready_raises_is_what_the_start_raises() -> None:
    fake = FakeRunner()
    compose = _stack(fake, {"db": None, "api": None})
    _state(fake, "id-db", Status="running")
    _state(fake, "id-api", Status="running")
    fake.expect("docker", "start")

    def check(svc: str) -> None:
        if svc == "db":
            raise RuntimeError("db is not at its golden")

    deps = {"api": {"depends_on": {"db": {"condition": "service_healthy"}}}}
    with pytest.raises(RuntimeError, match="not at its golden"):
        start(compose, _services(deps), ["db", "api"], on_ready=check)
