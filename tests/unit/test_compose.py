from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from forgelib.docker import compose as c
from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import ForgeError
from forgelib.kinds.bare import seed as bare
from forgelib.spec.models import Timeouts
from forgelib.testing import FakeRunner
from tests.support.override import load_override

# ---------------------------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("pg", "r1", "read", 0), "pg-r1-read-0"),
        (("pg_reset", "r-2", "t_1", 12), "pg_reset-r-2-t_1-12"),
        (("pg", "r1", "read", None), "pg-r1-read-shared"),
    ],
)
def test_project_name_kept_verbatim_when_already_valid(
    args: tuple[str, str, str, int | None], expected: str
) -> None:
    assert c.project_name(*args) == expected


@pytest.mark.parametrize(
    "args",
    [
        ("Postgres Reset", "20261129T112351Z-4f0c2a", "read.widget", 3),
        ("-_x", "r", "t", 0),
        ("multi_service_postgres_reset", "20261129T112351Z-4f0c2a", "read_widget_without_reset", 13),
        ("ü" * 80, "r", "t", 0),
    ],
)
def test_project_name_is_always_valid(args: tuple[str, str, str, int]) -> None:
    name = c.project_name(*args)
    assert c.is_valid_name(name), name
    assert len(name) <= 63


def test_lossy_names_get_a_hash_so_they_never_collide() -> None:
    names = {
        c.project_name("pg", "r1", "a.b", 0),
        c.project_name("pg", "r1", "a-b", 0),
        c.project_name("pg", "r1", "A-b", 0),
        c.project_name("pg", "r1", "a" * 40 + "x", 0),
        c.project_name("pg", "r1", "a" * 40 + "y", 0),
    }
    assert len(names) == 5
    assert c.project_name("pg", "r1", "a-b", 0) == "pg-r1-a-b-0"  # the valid one stays readable
    assert c.project_name("pg", "r1", "a.b", 0).startswith("pg-r1-a-b-0-")


def test_long_names_keep_run_and_trial_index() -> None:
    name = c.project_name("multi_service_postgres_reset", "20261129T112351Z-4f0c2a", "read_widget_x", 13)
    assert "-20261129t112351z-4f0c2a-" in name and "-13-" in name


def test_invalid_name_refused_by_compose_project() -> None:
    with pytest.raises(ValueError, match="invalid compose project name"):
        c.ComposeProject("Bad Name", (), FakeRunner())


# ------------------------------------------------------------------------------------------- builders


def test_flags_skip_none_and_false() -> None:
    assert c.flags(detach=True, wait=False, tail=None, wait_timeout=30, t=1.5) == [
        "--detach",
        "--wait-timeout",
        "30",
        "--t",
        "1.5",
    ]


def test_argv_builders() -> None:
    assert c.base_argv("p", [Path("/a.yaml"), Path("/b.yaml")]) == [
        "docker", "compose", "--ansi", "never", "--project-name", "p",
        "--file", "/a.yaml", "--file", "/b.yaml",
    ]  # fmt: skip
    # The run config's profiles: flags, since every ambient COMPOSE_* variable (COMPOSE_PROFILES) is dropped
    assert c.base_argv("p", [Path("/a.yaml")], ["extra", "debug"])[-4:] == [
        "--profile", "extra", "--profile", "debug",
    ]  # fmt: skip
    assert c.build_argv(["tool"]) == ["build", "tool"]
    assert c.up_argv(["db"], wait_timeout=300) == ["up", "--detach", "--wait", "--wait-timeout", "300", "db"]
    assert c.up_argv(wait=False) == ["up", "--detach"]
    # created, not started (the warm pool's successors): no --wait, whatever was asked
    assert c.up_argv(["r"], wait_timeout=9, no_deps=True, force_recreate=True, no_start=True) == [
        *("up", "--detach", "--no-deps", "--no-start", "--force-recreate", "--renew-anon-volumes", "r")
    ]
    # a spare beside the running container (the warm pool's next ephemeral one), the running one untouched
    assert c.up_argv(["r"], wait=False, no_deps=True, no_start=True, no_recreate=True, scale={"r": 2}) == [
        *("up", "--detach", "--no-deps", "--no-start", "--no-recreate", "--scale", "r=2", "r")
    ]
    assert c.down_argv() == ["down", "--volumes", "--remove-orphans"]
    assert c.down_argv(volumes=False, remove_orphans=False, timeout=3) == ["down", "--timeout", "3"]
    assert c.exec_argv("db", ["psql", "-c", "x"], env={"A": "1"}, workdir="/w") == [
        "exec", "-T", "--env", "A=1", "--workdir", "/w", "db", "psql", "-c", "x",
    ]  # fmt: skip
    assert c.cp_argv("/s/.", "box:/t") == ["cp", "/s/.", "box:/t"]
    assert c.stop_argv(["cache"]) == ["stop", "cache"]
    assert c.start_argv(["cache"]) == ["start", "cache"]
    assert c.port_argv("api", 8000) == ["port", "api", "8000"]
    assert c.ps_argv() == ["ps", "--all", "--format", "json"]
    assert c.config_argv() == ["config", "--format", "json"]


def test_labels_override_covers_services_default_network_and_declared_resources(tmp_path: Path) -> None:
    config = {
        "services": {"db": {}, "api": {}},
        "networks": {"back": {}, "ext": {"external": True}},
        "volumes": {"data": None, "outside": {"external": True}},
    }
    labels = {"io.forgelib.run": "r"}
    out = yaml.safe_load(c.write_override(tmp_path / "o.yaml", c.labels_override(config, labels)).read_text())
    assert out == {
        "services": {"db": {"labels": labels}, "api": {"labels": labels}},
        "networks": {"default": {"labels": labels}, "back": {"labels": labels}},
        "volumes": {"data": {"labels": labels}},
    }


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("500ms", 0.5), ("1m30s", 90.0), ("1h", 3600.0), ("2.5s", 2.5), (3_000_000_000, 3.0),
     ("", None), ("soon", None), ("1s!", None), (None, None)],
)  # fmt: skip
def test_go_durations_as_compose_prints_them(text: Any, seconds: float | None) -> None:
    assert c.go_seconds(text) == seconds


@pytest.mark.parametrize(
    ("healthcheck", "quiet"),
    [
        # the packs' database, 1 s x 60 with a 3 s timeout: every probe timing out, unhealthy after 240 s
        # as written and after 11 x (20 + 3) = 253 s spaced out, never sooner
        (
            {"test": ["CMD", "pg_isready"], "interval": "1s", "timeout": "3s", "retries": 60},
            {"interval": "20s", "retries": 11},
        ),
        (
            {"test": ["CMD", "true"], "interval": "1s", "timeout": "3s", "retries": 30},
            {"interval": "10s", "retries": 10},
        ),
        # capped at Docker's own default interval
        (
            {"test": ["CMD", "true"], "interval": "5s", "timeout": "3s", "retries": 60},
            {"interval": "30s", "retries": 15},
        ),
        # Docker's default timeout (30 s) when none is given: 6 x 31 s as written, 6 x 32 s spaced out
        ({"test": ["CMD", "true"], "interval": "1s", "retries": 6}, {"interval": "2s", "retries": 6}),
        ({"test": ["CMD", "true"], "interval": "1s", "retries": 3}, None),  # already fails fast: kept
        ({"test": ["CMD", "true"]}, None),  # Docker's defaults, 30 s x 3: kept
        ({"test": ["CMD", "true"], "interval": "2s", "retries": 2}, None),
        ({"test": ["NONE"]}, None),
        ({"disable": True}, None),
        ({}, None),
    ],
)
def test_healthchecks_are_spaced_out_keeping_the_time_to_unhealthy(
    healthcheck: dict[str, Any], quiet: dict[str, Any] | None
) -> None:
    assert c.quiet_healthcheck(healthcheck) == quiet


def test_only_a_quiet_health_override_touches_healthchecks(tmp_path: Path) -> None:
    hc = {"test": ["CMD", "true"], "interval": "1s", "timeout": "3s", "retries": 30}
    config = {"services": {"api": {"healthcheck": hc}, "runner": {}}}
    assert "healthcheck" not in _override(tmp_path, config)["services"]["api"]
    quiet = _override(tmp_path, config, quiet_health=True)["services"]
    assert quiet["api"]["healthcheck"] == {"interval": "10s", "retries": 10}  # compose merges the rest in
    assert "healthcheck" not in quiet["runner"]


def test_the_build_override_is_written_by_the_one_writer(tmp_path: Path) -> None:
    labels = {"io.forgelib.run": "r"}
    doc = c.build_override({"api": "forgelib-build/p-api:r-1"}, labels)
    text = c.write_override(tmp_path / "b.yaml", doc, header=c.BUILD_HEADER).read_text()
    assert text.startswith("# generated by forgelib: build once per run\n")
    assert yaml.safe_load(text) == {
        "services": {"api": {"image": "forgelib-build/p-api:r-1", "build": {"labels": labels}}}
    }


def _override(tmp_path: Path, config: dict[str, Any], **kw: Any) -> dict[str, Any]:
    text = c.write_override(tmp_path / "o.yaml", c.labels_override(config, {"l": "v"}, **kw)).read_text()
    return load_override(text)


def test_bare_seed_mounts_and_variables_go_to_their_service_only(tmp_path: Path) -> None:
    seed = tmp_path / "order.json"
    m = bare.mount("runner", "widget-order", seed)
    assert (m.path, m.env_var) == ("/run/forge/seeds/widget-order", "FORGE_SEED_WIDGET_ORDER")
    out = _override(
        tmp_path,
        {"services": {"runner": {"environment": {"A": "1"}}, "db": {}}},
        mounts={"runner": [m.volume()]},
        environment={"runner": {m.env_var: m.path}},
    )
    runner = out["services"]["runner"]
    assert runner["volumes"] == [
        {"type": "bind", "source": str(seed), "target": "/run/forge/seeds/widget-order", "read_only": True}
    ]
    assert runner["environment"] == {"FORGE_SEED_WIDGET_ORDER": "/run/forge/seeds/widget-order"}
    assert set(out["services"]["db"]) == {"labels"}


def test_loopback_ports_are_added_to_the_named_services_only(tmp_path: Path) -> None:
    config = {"services": {"db": {"ports": [{"target": 5432, "protocol": "tcp"}]}, "cache": {}, "api": {}}}
    out = _override(tmp_path, config, loopback={"db": [5432], "cache": [6379]})
    # The port the file publishes is already the one forge wants: listed once, loopback only, and no
    # published port: the engine picks a free one, so parallel stacks never collide.
    loop = {"target": 5432, "host_ip": "127.0.0.1", "protocol": "tcp"}
    assert out["services"]["db"]["ports"] == ("!override", [loop])
    assert out["services"]["cache"]["ports"] == ("!override", [{**loop, "target": 6379}])
    assert "ports" not in out["services"]["api"]


def test_published_ports_go_to_loopback_at_random_host_ports_and_fixed_names_are_dropped(
    tmp_path: Path,
) -> None:
    config = {
        "services": {
            "web": {
                "container_name": "web",
                "ports": [
                    {"mode": "ingress", "target": 8000, "published": "8000", "protocol": "tcp"},
                    {
                        "mode": "ingress",
                        "host_ip": "0.0.0.0",
                        "target": 53,
                        "published": "53",
                        "protocol": "udp",
                    },
                    {"mode": "ingress", "target": 9000, "protocol": "tcp", "app_protocol": "http"},
                ],
            }
        }
    }
    web = _override(tmp_path, config)["services"]["web"]
    assert web["container_name"] == "!reset"
    assert web["ports"] == (
        "!override",
        [
            {"target": 8000, "protocol": "tcp", "host_ip": "127.0.0.1"},
            {"target": 53, "protocol": "udp", "host_ip": "127.0.0.1"},
            {"target": 9000, "protocol": "tcp", "app_protocol": "http", "host_ip": "127.0.0.1"},
        ],
    )


def test_clean_env_drops_every_ambient_compose_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPOSE_PROJECT_NAME", "evil")
    monkeypatch.setenv("COMPOSE_FILE", "/evil.yaml")
    monkeypatch.setenv("COMPOSE_PROFILES", "x")
    env = c.clean_env({"FORGE_IMAGE_REDIS": "forgelib/redis:7.0"})
    assert (
        env["COMPOSE_PROJECT_NAME"] is None
        and env["COMPOSE_FILE"] is None
        and env["COMPOSE_PROFILES"] is None
    )
    assert env["FORGE_IMAGE_REDIS"] == "forgelib/redis:7.0"


# -------------------------------------------------------------------------------------------- project

BASE = ("docker", "compose", "--ansi", "never", "--project-name", "p1", "--file", "/x/c.yaml")


def project(fake: FakeRunner) -> c.ComposeProject:
    t = Timeouts(compose_up=100, teardown=50, command=7)
    return c.ComposeProject(
        "p1", (Path("/x/c.yaml"),), fake, t, {"FORGE_IMAGE_POSTGRES": "forgelib/postgres:15"}
    )


def test_calls_carry_timeouts_env_and_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPOSE_FILE", "/evil.yaml")
    fake = FakeRunner()
    fake.expect(*BASE, "up", exact=False)
    fake.expect(*BASE, "down", "--volumes", "--remove-orphans", exact=True)
    fake.expect(*BASE, "exec", "-T", "db", "true", exact=True)
    p = project(fake)
    p.up(["db"])
    p.down()
    p.exec("db", ["true"])
    up, down, ex = fake.calls
    assert up.argv[len(BASE) :] == ("up", "--detach", "--wait", "--wait-timeout", "100", "db")
    assert up.timeout == 130  # compose's own --wait-timeout message wins the race
    assert (down.timeout, ex.timeout) == (50, 7)
    assert up.env["COMPOSE_FILE"] is None and up.env["FORGE_IMAGE_POSTGRES"] == "forgelib/postgres:15"
    assert up.cwd == Path("/x")


@pytest.mark.parametrize(
    ("out", "expected"),
    [
        ("0.0.0.0:49153\n", ("127.0.0.1", 49153)),
        ("[::]:5\n", ("127.0.0.1", 5)),
        ("10.0.0.2:80", ("10.0.0.2", 80)),
    ],
)
def test_port(out: str, expected: tuple[str, int]) -> None:
    fake = FakeRunner()
    fake.expect("docker", "port", "p1-api-1", "8000/tcp", exact=True, stdout=out)
    assert project(fake).port("api", 8000) == expected
    assert len(fake.calls) == 1  # no compose CLI start


@pytest.mark.parametrize("docker_says", ["No such container: p1-api-1", "No public port '8000/tcp'"])
def test_port_not_published(docker_says: str) -> None:
    # docker cannot answer: compose does, and its answer (or error) names the service
    fake = FakeRunner()
    fake.expect("docker", "port", rc=1, stderr=f"Error: {docker_says}")
    fake.expect(*BASE, "port", "api", "8000", stdout=":0\n")
    with pytest.raises(ForgeError, match="does not publish container port 8000"):
        project(fake).port("api", 8000)


def test_port_of_the_container_a_warm_stack_serves_with() -> None:
    fake = FakeRunner()
    fake.expect("docker", "port", "proj-api-3", "53/udp", exact=True, stdout="127.0.0.1:5353\n")
    served = c.ComposeProject("proj", (Path("/x/c.yaml"),), fake, containers={"api": "proj-api-3"})
    assert served.port("api", 53, protocol="udp") == ("127.0.0.1", 5353)


def test_parse_ps_accepts_lines_and_arrays() -> None:
    rows = [{"Service": "db", "State": "running"}, {"Service": "api", "State": "exited"}]
    assert c.parse_ps("\n".join(json.dumps(r) for r in rows)) == rows
    assert c.parse_ps(json.dumps(rows)) == rows
    assert c.parse_ps("") == []


def test_container_logs_go_to_one_file_in_a_directory_made_for_it(tmp_path: Path) -> None:
    fake = FakeRunner()
    # rc 1: a container gone meanwhile; its log is a finding, not an error
    fake.expect("docker", "logs", "--tail", "5", "abc", exact=True, rc=1, stdout="out\n", stderr="gone\n")
    dest = tmp_path / "s" / "db.log"
    assert project(fake).container_logs("abc", dest, tail=5).rc == 1
    call = fake.calls[0]
    assert call.stdout_path == call.stderr_path == dest and dest.parent.is_dir()  # 2>&1 into the file
    assert dest.read_text() == "out\ngone\n"


@pytest.mark.parametrize("tail", [0, None])
def test_log_tail_lines_0_keeps_the_whole_log(tmp_path: Path, tail: int | None) -> None:
    fake = FakeRunner()
    fake.expect("docker", "logs", "abc", exact=True)  # no `--tail 0`: that would keep nothing
    project(fake).container_logs("abc", tmp_path / "db.log", tail=tail)
    assert fake.calls[0].argv == ("docker", "logs", "abc")


def test_config_parses_json() -> None:
    fake = FakeRunner()
    fake.expect(*BASE, "config", "--format", "json", exact=True, stdout='{"services": {"db": {}}}')
    assert project(fake).config() == {"services": {"db": {}}}


def test_a_provisioned_stack_execs_straight_into_the_container_and_lets_compose_explain_a_missing_one() -> (
    None
):
    import dataclasses

    from forgelib.errors import ServiceCommandError

    fake = FakeRunner()
    fake.expect(
        "docker",
        "exec",
        "--env",
        "A=1",
        "--workdir",
        "/w",
        "p1-db-1",
        "cat",
        "f",
        exact=True,
        stdout="x",
    )
    fake.expect("docker", "exec", "-i", "p1-db-1", "cat", exact=True)
    fake.expect("docker", "exec", "p1-db-1", "false", exact=True, rc=3, stderr="boom")
    fake.expect(
        "docker",
        "exec",
        "p1-api-1",
        "true",
        rc=1,
        stderr="Error response from daemon: No such container: p1-api-1",
    )
    fake.expect(*BASE, "exec", "-T", "api", "true", exact=True, rc=1, stderr='service "api" is not running')
    p = dataclasses.replace(project(fake), direct=True)
    assert p.exec("db", ["cat", "f"], env={"A": "1"}, workdir="/w").stdout == "x"
    # -i only with something to read: Docker can lose a short stdin's EOF (a `cat` then never ends).
    p.exec("db", ["cat"], input="fed")
    assert fake.calls[-1].argv[:3] == ("docker", "exec", "-i") and fake.calls[-1].input == "fed"
    assert p.exec("db", ["false"], input="", check=False).rc == 3  # its own failure: not rerun by compose
    assert "-i" not in fake.calls[-1].argv
    with pytest.raises(ServiceCommandError, match='service "api" is not running'):
        p.exec("api", ["true"])
    assert [call.argv[1] for call in fake.calls] == ["exec", "exec", "exec", "exec", "compose"]


def test_published_ports_of_an_inspect_record_read_like_compose_ps() -> None:
    info = {"NetworkSettings": {"Ports": {
        "8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "49170"}, {"HostIp": "::", "HostPort": "49170"}],
        "9000/udp": None,  # exposed, not published
    }}}  # fmt: skip
    assert c.published_of_inspect(info) == ["127.0.0.1:49170->8000/tcp"]
    assert c.published_of_inspect({"NetworkSettings": {"Ports": {}}}) == []


def test_published_ports_come_from_docker_inspect_of_the_containers_a_trial_runs_on() -> None:
    fake = FakeRunner()
    bind = [{"HostIp": "0.0.0.0", "HostPort": "49153"}, {"HostIp": "::", "HostPort": "49153"}]
    infos = [
        {"Id": "a1", "Name": "/p1-db-1", "Config": {"Labels": {c.lab.COMPOSE_SERVICE: "db"}},
         "NetworkSettings": {"Ports": {"5432/tcp": bind, "9/udp": None}}},
        {"Id": "r1", "Name": "/p1-runner-1", "Config": {"Labels": {c.lab.COMPOSE_SERVICE: "runner"}},
         "NetworkSettings": {"Ports": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "40001"}]}}},
        {"Id": "r2", "Name": "/p1-runner-2", "Config": {"Labels": {c.lab.COMPOSE_SERVICE: "runner"}},
         "NetworkSettings": {"Ports": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "40002"}]}}},
    ]  # fmt: skip
    fake.expect("docker", "ps", "--all", "--quiet", stdout="a1\nr1\nr2\n")
    fake.expect("docker", "inspect", "a1", "r1", "r2", exact=True, stdout=json.dumps(infos))
    served = dataclasses.replace(project(fake), containers={"runner": "p1-runner-2"})
    assert served.published_ports() == {
        "db": ["127.0.0.1:49153->5432/tcp"],  # IPv4/IPv6 folded, an unpublished port left out
        "runner": ["127.0.0.1:40002->8000/tcp"],  # the container the trial runs on, not the old one
    }
    ps = fake.calls[0].argv
    assert f"label={c.lab.COMPOSE_PROJECT}=p1" in ps and f"label={c.lab.COMPOSE_ONEOFF}=False" in ps
    assert not [x for x in fake.calls if "compose" in x.argv]  # no compose CLI start


def test_log_tail_reads_the_containers_the_trial_uses_with_docker_logs() -> None:
    """An error message's log tail is read the way a trial's logs are captured (``service_log``): the
    container a warm stack serves the service with (not its retired one), replicas each under a header."""
    fake = FakeRunner()
    infos = [
        {"Id": i, "Name": f"/p1-{svc}-{n}", "Config": {"Labels": {c.lab.COMPOSE_SERVICE: svc}}}
        for i, svc, n in [("old", "api", 1), ("cur", "api", 2), ("w2", "worker", 2), ("w1", "worker", 1)]
    ]  # fmt: skip
    fake.expect("docker", "ps", "--all", "--quiet", stdout="old cur w2 w1\n")
    fake.expect("docker", "inspect", "old", "cur", "w2", "w1", exact=True, stdout=json.dumps(infos))
    for i in ("cur", "w1", "w2"):
        fake.expect("docker", "logs", "--tail", "3", i, exact=True, stdout=f"{i} out\n", stderr=f"{i} err\n")
    p = dataclasses.replace(project(fake), containers={"api": "p1-api-2"})
    assert p.log_tail("api", 3) == "cur out\ncur err"
    replicas = "==> p1-worker-1 <==\nw1 out\nw1 err\n==> p1-worker-2 <==\nw2 out\nw2 err"
    assert p.log_tail("worker", 3) == replicas
    assert p.log_tail("gone", 3) == ""
    assert not [x for x in fake.calls if "compose" in x.argv]  # no compose logs

    down = FakeRunner()
    down.expect("docker", "ps", rc=1, stderr="Cannot connect to the Docker daemon")
    assert project(down).log_tail("api", 3).startswith("(could not read the log: ")


def test_service_states_of_a_warm_ephemeral_service_are_its_current_containers() -> None:
    """A warm stack's retired container (paused, off its networks) and its created spare are not the
    service's state: only the container ``containers`` names, as ``serves`` says; other services keep
    every container (replicas)."""

    def info(i: str, svc: str, n: int, status: str, health: str | None = None) -> dict[str, Any]:
        state: dict[str, Any] = {"Status": status, **({"Health": {"Status": health}} if health else {})}
        return {"Id": i, "Name": f"/p1-{svc}-{n}", "Config": {"Labels": {c.lab.COMPOSE_SERVICE: svc}},
                "State": state}  # fmt: skip

    infos = [
        info("old", "api", 1, "paused"),
        info("cur", "api", 2, "running", "healthy"),
        info("spare", "api", 3, "created"),
        info("db1", "db", 1, "running"),
        info("db2", "db", 2, "exited"),
    ]
    fake = FakeRunner()
    fake.expect("docker", "ps", "--all", "--quiet", stdout="old cur spare db1 db2\n")
    ids = ("old", "cur", "spare", "db1", "db2")
    fake.expect("docker", "inspect", *ids, exact=True, stdout=json.dumps(infos))
    warm = dataclasses.replace(project(fake), containers={"api": "p1-api-2"})
    assert warm.service_states() == {"api": [("running", "healthy")], "db": [("running", ""), ("exited", "")]}
    assert warm.service_states(["api"]) == {"api": [("running", "healthy")]}
    # the same look on a fresh stack (no container map) lists every container of the service
    every = [("paused", ""), ("running", "healthy"), ("created", "")]
    assert project(fake).service_states(["api"])["api"] == every


@pytest.mark.parametrize(
    ("rc", "docker_says", "error"),
    [
        (1, "Error: No public port '8000/tcp' published for proj-api-3", "does not publish container port"),
        (0, "", "does not publish container port"),
        (1, "Error response from daemon: No such container: proj-api-3", "could not be read .*No such"),
    ],
)
def test_port_of_a_warm_ephemeral_service_never_falls_back_to_compose(
    rc: int, docker_says: str, error: str
) -> None:
    """``compose port`` answers for a container of the service, which on a warm stack may be its retired
    or spare one: where ``docker port`` of the container the trial uses fails, that is the answer."""
    fake = FakeRunner()
    fake.expect("docker", "port", "proj-api-3", "8000/tcp", exact=True, rc=rc, stderr=docker_says)
    fake.expect("docker", "compose", stdout="127.0.0.1:40001\n")  # the retired container's port
    served = c.ComposeProject("proj", (Path("/x/c.yaml"),), fake, containers={"api": "proj-api-3"})
    with pytest.raises(ForgeError, match=f"^service 'api'.*{error}") as err:
        served.port("api", 8000)
    assert "proj-api-3" in str(err.value)
    assert [x.argv[1] for x in fake.calls] == ["port"]


def test_a_warm_process_replaces_its_services_entrypoint_and_command_only(tmp_path: Path) -> None:
    from forgelib.kinds import supervisor

    image = c.ImageProcess(("ep.sh",), ("postgres",))
    wrapped = supervisor.wrap(ServiceConfig.of({"image": "pg"}, "db"), image)
    assert wrapped is not None
    out = _override(tmp_path, {"services": {"db": {}, "api": {}}}, process={"db": wrapped})
    db = out["services"]["db"]
    # A compose file: every `$` of the loop's script doubled, so compose hands the container one.
    assert db["entrypoint"][:2] == ["sh", "-c"] and db["entrypoint"][3] == supervisor.MARKER
    assert db["entrypoint"][2].replace("$$", "$") == supervisor.SUPERVISOR
    assert db["command"] == ["ep.sh", "postgres"]
    assert set(out["services"]["api"]) == {"labels"}
