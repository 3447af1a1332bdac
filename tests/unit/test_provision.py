"""Provisioning on the fake runner: ordering, stage wrapping and exact reasons, teardown on every path."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from forgelib.cli import commands
from forgelib.docker import compose as compose_mod
from forgelib.docker import labels as lab
from forgelib.errors import CommandError, CommandTimeout, ProvisionError
from forgelib.spec.digest import seed_digest
from forgelib.spec.models import (
    EnvironmentManifest,
    Isolation,
    Project,
    ResetBinding,
    Seed,
    SeedKind,
    Service,
    Task,
    Timeouts,
)
from forgelib.stacks import SharedStacks
from forgelib.stacks import provision as prov
from forgelib.testing import ANY, FakeRunner
from tests.support.override import load_override

T = Timeouts(compose_up=100, recipe=40, teardown=50, command=9)
NAME = "proj-r1-t-0"


@pytest.fixture(autouse=True)
def _no_user_image_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FORGE_IMAGE_POSTGRES", "FORGE_IMAGE_REDIS", "FORGE_IMAGE_PYTHON"):
        monkeypatch.delenv(var, raising=False)


def known_cache() -> prov.ProvisionCache:
    """A backend's cache that already knows the postgres stand-in exists (no `docker image ls` to fake)."""
    cache = prov.ProvisionCache()
    cache.images.know_present(["forgelib/postgres:15"])
    return cache


# What `docker image inspect` says of the images the test stacks use: postgres declares its data volume.
IMAGES = [
    {
        "Id": "sha256:p",
        "RepoTags": ["forgelib/postgres:15"],
        "Config": {"Volumes": {"/var/lib/postgresql/data": {}}},
    },
    {"Id": "sha256:y", "RepoTags": ["forgelib/python:3.11"], "Config": {"Volumes": None}},
]


class Stack:
    """A small project on disk plus the argv prefixes its compose calls use."""

    def __init__(
        self,
        tmp_path: Path,
        services: Mapping[str, Mapping[str, Any]],
        reset: Mapping[str, tuple[str, Mapping[str, Any]]],
        seeds: Mapping[str, tuple[str, SeedKind, bytes | None]] | None = None,
        isolation: Isolation = Isolation.EPHEMERAL,
    ) -> None:
        self.compose_file = tmp_path / "compose.yaml"
        self.compose_file.write_text(yaml.safe_dump({"services": dict(services)}))
        self.trial_dir = tmp_path / "trial"
        seed_models = {}
        for name, (fname, kind, data) in (seeds or {}).items():
            path = tmp_path / fname
            if data is None:
                path.mkdir()
            else:
                path.write_bytes(data)
            seed_models[name] = Seed(name, path, kind, seed_digest(path, kind))
        svc = {
            n: Service(n, Isolation.RESET, ResetBinding(*reset[n])) if n in reset else Service(n, isolation)
            for n in services
        }
        self.env = EnvironmentManifest((self.compose_file,), svc, dict(services))
        self.project = Project("proj", tmp_path, tmp_path / "project.yaml", "", seed_models, self.env, ())
        self.task = Task("t", tmp_path / "task.yaml", "", self.env)
        self.config = {"name": NAME, "services": {n: dict(s) for n, s in services.items()}}
        b = ["docker", "compose", "--ansi", "never", "--project-name", NAME, "--file", str(self.compose_file)]
        self.base = tuple(b)  # before the override exists (config, and clean-up after an early failure)
        self.full = (*b, "--file", str(self.trial_dir / "compose.forge.yaml"))
        self.fake = FakeRunner()
        self.cache = known_cache()
        self.shared = SharedStacks()

    def expect_config(self, **kw: Any) -> None:
        kw.setdefault("stdout", json.dumps(self.config))
        # asked under a placeholder name, the answer renamed to the stack's (``ConfigMemo``)
        asked = tuple(
            ANY if i == self.base.index("--project-name") + 1 else a for i, a in enumerate(self.base)
        )
        self.fake.expect(*asked, "config", "--format", "json", exact=True, **kw)
        self.fake.expect("docker", "image", "inspect", rc=1, stdout=json.dumps(IMAGES))
        self.fake.expect("docker", "compose", "version", "--short", stdout="2.40.3\n")  # ``ComposeFacts``

    def expect_cleanup(self, base: tuple[str, ...] | None = None) -> None:
        b = base or self.full
        self.expect_logs()
        self.fake.expect(*b, "down", "--volumes", "--remove-orphans", exact=True)

    def expect_logs(self, tail: int = 200, **kw: Any) -> None:
        """Log capture: the project's containers found by label, then ``docker logs`` of each (``kw``:
        every one's answer; by default ``<svc> says hi``)."""
        self.fake.expect("docker", "ps", "--all", "--quiet", stdout="\n".join(self.ids()))
        self.fake.expect("docker", "inspect", stdout=json.dumps(self.infos()))
        for svc in self.env.services:
            answer = kw or {"stdout": f"{svc} says hi\n"}
            self.fake.expect("docker", "logs", "--tail", str(tail), f"id-{svc}", exact=True, **answer)

    def ids(self) -> list[str]:
        return [f"id-{n}" for n in self.env.services]

    def infos(self) -> list[dict[str, Any]]:
        """``docker inspect`` of one container per service, named as compose names them (app-db publishes
        5432 on loopback, as the override asks for a seeded postgres)."""
        return [
            {
                "Id": f"id-{n}",
                "Name": f"/{NAME}-{n}-1",
                "Config": {"Labels": {COMPOSE_SERVICE: n}},
                "NetworkSettings": {"Ports": PUBLISHED.get(n, {})},
            }
            for n in self.env.services
        ]

    def expect_readiness(self) -> None:
        """What ``forgelib.docker.readiness`` finds, starts and watches: one container per service, no
        healthcheck, running once started."""
        self.fake.expect("docker", "ps", "--all", "--quiet", stdout="\n".join(self.ids()))
        self.fake.expect("docker", "inspect", "--format", stdout=json.dumps({"Status": "running"}))
        self.fake.expect("docker", "inspect", stdout=json.dumps(self.infos()))
        self.fake.expect("docker", "start")

    def started(self) -> list[list[str]]:
        """The services of each ``docker start``, in order."""
        starts = [c.argv[2:] for c in self.fake.calls if c.argv[:2] == ("docker", "start")]
        return [[i.removeprefix("id-") for i in ids] for ids in starts]

    def provision(
        self,
        *,
        snapshots: bool = False,
        on_phase: prov.PhaseCallback | None = None,
        steps: prov.FreshSteps | None = None,
    ) -> prov.Stack:
        ctx = prov.StackContext(self.project, T, self.fake, self.cache, goldens=snapshots)
        trial = prov.TrialSpec(self.task, "r1", 0, self.trial_dir, on_phase=on_phase)
        if steps is not None:
            return prov.provision_stack(ctx, trial.stack(ctx), steps, on_phase=on_phase)
        return prov.provision_trial(ctx, trial)

    def verbs(self) -> list[str]:
        out = []
        for call in self.fake.calls:
            if call.argv[:2] != ("docker", "compose") or call.argv[2:3] == ("version",):
                continue  # `docker image inspect` (image volumes), `ComposeFacts`' version: no stack verb
            rest = (
                call.argv[len(self.full) :]
                if call.argv[: len(self.full)] == self.full
                else call.argv[len(self.base) :]
            )
            out.append(" ".join(rest))
        return out

    def assert_cleaned_up(self) -> None:
        verbs = self.verbs()
        assert verbs[-1] == "down --volumes --remove-orphans"
        logs = [c.argv[-1] for c in self.fake.calls if c.argv[:2] == ("docker", "logs")]
        assert sorted(logs) == sorted(self.ids())  # every service's container, read at once
        for svc in self.env.services:
            assert (self.trial_dir / "services" / f"{svc}.log").read_text() == f"{svc} says hi\n"


PG = {"image": "forgelib/postgres:15", "environment": {"POSTGRES_USER": "app"}}
API = {
    "image": "forgelib/python:3.11",
    "depends_on": {"app-db": {"condition": "service_healthy", "required": True}},
}
RUNNER = {"image": "forgelib/python:3.11"}
SQL = b"create table t (id int);\n"


def pg_stack(tmp_path: Path, seed: bytes = SQL) -> Stack:
    return Stack(
        tmp_path,
        {"app-db": PG, "widgets-api": API, "runner": RUNNER},
        {"app-db": ("postgres_baseline", {})},
        {"postgres_baseline": ("base.sql", SeedKind.SQL_DUMP, seed)},
    )


COMPOSE_SERVICE = "com.docker.compose.service"
# every container created at once; forgelib.docker.readiness starts them
CREATE = ("up", "--detach", "--no-start")
# What `docker inspect` says each service publishes (NetworkSettings.Ports).
PUBLISHED = {"app-db": {"5432/tcp": [{"HostIp": "127.0.0.1", "HostPort": "49153"}], "9/udp": None}}
# The recipe's psql goes straight to the container (`docker exec`, no compose CLI start).
PSQL = ("docker", "exec", "-i", f"{NAME}-app-db-1", "psql", "-q", "-v", "ON_ERROR_STOP=1", "-U", "app")
PSQL += ("-d", "app")


def test_order_is_config_up_seeded_closure_seed_then_the_rest(tmp_path: Path) -> None:
    s = pg_stack(tmp_path)
    s.expect_config()
    s.fake.expect(*s.full, *CREATE, exact=True)
    s.expect_readiness()
    s.fake.expect(*PSQL, exact=True)
    phases: list[str] = []
    trial = s.provision(on_phase=lambda name, secs: phases.append(name))
    assert s.verbs() == ["config --format json", " ".join(CREATE)]
    # app-db alone before the seed; then the API (its dependency is up) and the runner, at once.
    assert s.started()[0] == ["app-db"]
    assert sorted(x for ids in s.started()[1:] for x in ids) == ["runner", "widgets-api"]
    psql_at = next(i for i, c in enumerate(s.fake.calls) if "psql" in c.argv)
    starts_at = [i for i, c in enumerate(s.fake.calls) if c.argv[:2] == ("docker", "start")]
    assert starts_at[0] < psql_at < starts_at[1]
    # The mapping trial.yaml and `forge provision` show: the seeded postgres on loopback (direct connections)
    assert trial.ports == {"app-db": ["127.0.0.1:49153->5432/tcp"], "runner": [], "widgets-api": []}
    assert phases == ["compose_config", "up_seeded", "recipe:app-db", "up_rest"]
    assert list(trial.timings) == [*phases, "provision"]
    assert trial.name == NAME and trial.compose.files[-1] == s.trial_dir / "compose.forge.yaml"
    psql = next(c for c in s.fake.calls if "psql" in c.argv)
    assert psql.stdin == s.project.seeds["postgres_baseline"].path
    override = load_override((s.trial_dir / "compose.forge.yaml").read_text())
    assert set(override["services"]) == {"app-db", "widgets-api", "runner"}
    labels = override["services"]["runner"]["labels"]
    assert labels[lab.RUN] == "r1" and labels[lab.TRIAL] == "t.0" and labels[lab.MANAGED] == "true"
    assert override["networks"]["default"]["labels"] == labels
    # The image's VOLUME gets a named, labelled volume (an anonymous one would be invisible to label queries).
    assert override["services"]["app-db"]["volumes"] == [
        {"type": "volume", "source": "forge-image-vol-app-db-0", "target": "/var/lib/postgresql/data"}
    ]
    assert override["volumes"]["forge-image-vol-app-db-0"]["labels"] == labels
    assert "volumes" not in override["services"]["runner"]
    compose_calls = [c for c in s.fake.calls if c.argv[:2] == ("docker", "compose")]
    assert all(c.env.get("FORGE_IMAGE_POSTGRES") == "forgelib/postgres:15" for c in compose_calls)


class _FromCheckpoint(prov.FreshSteps):
    """A warm stack's steps from a checkpoint holding app-db: no recipe, yet up first and prepared."""

    def __init__(self) -> None:
        self.seeded_with: list[str] = []

    def needs_recipe(self, service: str) -> bool:
        return service != "app-db"

    def starts_first(self, service: str) -> bool:
        return service == "app-db"

    def seeded(self, applied: Any, phase: prov.PhaseTimer) -> tuple[Any, ...]:
        self.seeded_with = [b.service for b, _ in applied]
        return ()


def test_a_service_that_starts_first_comes_up_alone_without_a_recipe_and_is_prepared_before_the_rest(
    tmp_path: Path,
) -> None:
    s = pg_stack(tmp_path)
    s.expect_config()
    s.fake.expect(*s.full, *CREATE, exact=True)
    s.expect_readiness()
    steps = _FromCheckpoint()
    phases: list[str] = []
    s.provision(steps=steps, on_phase=lambda name, secs: phases.append(name))
    assert not [c for c in s.fake.calls if "psql" in c.argv]  # no recipe: it started at its state
    assert s.started()[0] == ["app-db"]  # before its dependents, as a seeded service
    assert sorted(x for ids in s.started()[1:] for x in ids) == ["runner", "widgets-api"]
    assert steps.seeded_with == ["app-db"] and phases == ["compose_config", "up_seeded", "up_rest"]


def test_image_volumes_already_mounted_by_the_service_are_left_alone() -> None:
    config = {
        "services": {
            "db": {"image": "pg", "volumes": [{"type": "volume", "source": "data", "target": "/data"}]},
        },
        "volumes": {"data": {}},
    }
    out = compose_mod.labels_override(config, {"k": "v"}, {"pg": ("/data", "/logs")})
    assert out["services"]["db"]["volumes"] == [
        {"type": "volume", "source": "forge-image-vol-db-0", "target": "/logs"}
    ]
    assert set(out["volumes"]) == {"data", "forge-image-vol-db-0"}


def test_an_ephemeral_services_image_volumes_are_its_containers_own_and_labelled() -> None:
    """``per_container``: each container of the service gets its own anonymous volume for the image's
    VOLUME, carrying the labels (so label queries see it); the other services keep a named one."""
    config = {"services": {"cache": {"image": "redis"}, "db": {"image": "redis"}}}
    out = compose_mod.labels_override(config, {"k": "v"}, {"redis": ("/data",)}, per_container=["cache"])
    assert out["services"]["cache"]["volumes"] == [
        {"type": "volume", "target": "/data", "volume": {"labels": {"k": "v"}}}
    ]
    assert out["services"]["db"]["volumes"] == [
        {"type": "volume", "source": "forge-image-vol-db-0", "target": "/data"}
    ]
    assert set(out["volumes"]) == {"forge-image-vol-db-0"}
    # With the project's name (a resolved config has it): its label too, so `forge reap` counts the volume
    # with its stack's containers and networks, not as a project of its own.
    named = compose_mod.labels_override(
        {**config, "name": "p1"}, {"k": "v"}, {"redis": ("/data",)}, per_container=["cache"]
    )
    assert named["services"]["cache"]["volumes"][0]["volume"]["labels"] == {
        "k": "v",
        "com.docker.compose.project": "p1",
    }


def test_the_seeded_phase_brings_up_the_depends_on_closure(tmp_path: Path) -> None:
    # api (reset, filesystem seed) depends on db: both come up before the seed; `other` only afterwards.
    s = Stack(
        tmp_path,
        {"db": PG, "api": API | {"depends_on": {"db": {}}}, "other": RUNNER | {"depends_on": {"api": {}}}},
        {"api": ("tree", {"target": "/srv"})},
        {"tree": ("tree", SeedKind.FILESYSTEM_DIR, None)},
    )
    s.expect_config()
    s.fake.expect(*s.full, *CREATE, exact=True)
    s.expect_readiness()
    s.fake.expect("docker", "exec", f"{NAME}-api-1")  # the tree's wipe, straight to the container
    s.fake.expect(*s.full, "cp", f"{tmp_path / 'tree'}/.", "api:/srv", exact=True)
    s.provision()
    assert s.verbs()[1] == "up --detach --no-start"
    # db, then api once db started (`depends_on: {}` is service_started), the seed, then `other`.
    assert s.started() == [["db"], ["api"], ["other"]]
    cp_at = next(i for i, c in enumerate(s.fake.calls) if "cp" in c.argv)
    assert [c.argv[:2] for c in s.fake.calls[cp_at:]].count(("docker", "start")) == 1


def test_no_second_up_when_every_service_was_in_the_first(tmp_path: Path) -> None:
    s = Stack(tmp_path, {"app-db": PG}, {"app-db": ("s", {})}, {"s": ("s.sql", SeedKind.SQL_DUMP, SQL)})
    s.expect_config()
    s.fake.expect(*s.full, "up", exact=False)
    s.expect_readiness()
    s.fake.expect(*PSQL)
    s.provision()
    assert [v.split()[0] for v in s.verbs()] == ["config", "up"]
    assert s.started() == [["app-db"]]


def test_ephemeral_only_stack_is_one_up(tmp_path: Path) -> None:
    s = Stack(tmp_path, {"a": RUNNER, "b": RUNNER}, {})
    s.expect_config()
    s.fake.expect(*s.full, *CREATE, exact=True)
    s.expect_readiness()
    trial = s.provision()
    assert s.verbs() == ["config --format json", " ".join(CREATE)]
    assert sorted(x for ids in s.started() for x in ids) == ["a", "b"]
    assert not trial.shared
    assert trial.own_volumes == ()  # no image VOLUME among them


def test_the_stack_records_which_ephemeral_services_own_their_image_volumes(tmp_path: Path) -> None:
    """Decided once, where the override is written: a warm pool makes each successor by the same decision
    (``PooledStack``: its volumes go with the old container, or a named one is renewed)."""
    s = Stack(tmp_path, {"db": PG, "runner": RUNNER}, {})
    s.expect_config()
    s.fake.expect(*s.full, *CREATE, exact=True)
    s.expect_readiness()
    trial = s.provision()
    assert trial.own_volumes == ("db",)
    override = load_override((s.trial_dir / "compose.forge.yaml").read_text())
    assert [v["target"] for v in override["services"]["db"]["volumes"]] == ["/var/lib/postgresql/data"]
    assert "source" not in override["services"]["db"]["volumes"][0]  # each container's own


def test_bare_seed_path_is_exposed(tmp_path: Path) -> None:
    s = Stack(
        tmp_path, {"data": RUNNER}, {"data": ("fixture", {})}, {"fixture": ("f.csv", SeedKind.BARE, b"a,b\n")}
    )
    s.expect_config()
    s.fake.expect(*s.full, "up", exact=False)
    s.expect_readiness()
    trial = s.provision()
    (m,) = trial.bare_seeds.values()
    assert (m.service, m.seed, m.host_path) == ("data", "fixture", tmp_path / "f.csv")
    assert [v.split()[0] for v in s.verbs()] == ["config", "up"]  # no container action for bare
    override = yaml.safe_load((s.trial_dir / "compose.forge.yaml").read_text())["services"]["data"]
    assert {"type": "bind", "source": str(tmp_path / "f.csv"), "target": m.path, "read_only": True} in (
        override["volumes"]
    )  # mounted read-only in its service, before that service starts
    assert override["environment"] == {"FORGE_SEED_FIXTURE": "/run/forge/seeds/fixture"}


# ------------------------------------------------------------------------------------------- failures


def test_recipe_failure_reason_is_exact_and_the_stack_is_cleaned_up(tmp_path: Path) -> None:
    s = pg_stack(tmp_path)
    s.expect_config()
    s.fake.expect(*s.full, "up", exact=False)
    s.expect_readiness()
    s.fake.expect(*PSQL, rc=3, stderr='psql:<stdin>:2: ERROR:  syntax error at or near "selec"')
    s.expect_cleanup()
    with pytest.raises(ProvisionError) as err:
        s.provision()
    e = err.value
    assert e.stage == "reset_recipe"
    argv = " ".join(PSQL)
    # the cause, then the short command: no 500-character compose argv in the reason a user reads
    assert e.reason == (
        "reset recipe for service 'app-db' (seed 'postgres_baseline', kind 'sql_dump') failed: "
        f"psql step on service 'app-db': seed file {tmp_path / 'base.sql'} (on psql's stdin): "
        'psql:<stdin>:2: ERROR:  syntax error at or near "selec" (`psql` in service `app-db`, rc 3)'
    )
    detail = (s.trial_dir / prov.FAILURE_FILE).read_text()  # the whole command is in the trial's files
    assert f"command {argv} exited with rc=3" in detail and "stderr (tail):" in detail
    s.assert_cleaned_up()
    assert s.started() == [["app-db"]]  # the dependents never started


@pytest.mark.parametrize(
    ("error", "stage"),
    [
        (
            CommandError(["docker"], 1, "", "Error response from daemon: pull access denied for nope"),
            "compose_up",
        ),
        (
            CommandError(["docker"], 1, "", "dependency failed to start: container x is unhealthy"),
            "readiness",
        ),
        (CommandTimeout(["docker"], 130.0), "readiness"),
    ],
)
def test_up_failures_name_their_stage(tmp_path: Path, error: CommandError, stage: str) -> None:
    s = pg_stack(tmp_path)
    s.expect_config()
    s.fake.expect(*s.full, "up", raises=error)
    s.expect_cleanup()
    with pytest.raises(ProvisionError) as err:
        s.provision()
    assert err.value.stage == stage
    assert err.value.reason == str(error)
    s.assert_cleaned_up()


def test_config_failure_is_compose_config_stage_and_cleaned_up(tmp_path: Path) -> None:
    s = pg_stack(tmp_path)
    s.expect_config(rc=15, stderr="services.app-db.image: invalid")
    s.expect_cleanup(s.base)
    with pytest.raises(ProvisionError) as err:
        s.provision()
    assert err.value.stage == "compose_config" and "services.app-db.image: invalid" in err.value.reason
    s.assert_cleaned_up()


@pytest.mark.parametrize(
    ("reset", "reason"),
    [
        (
            ("", {}),
            "reset recipe for service 'app-db' failed: isolation is reset but no reset.seed is bound",
        ),
        (
            ("nope", {}),
            "reset recipe for service 'app-db' (seed 'nope') failed: "
            "no seed named 'nope'; seeds: postgres_baseline",
        ),
        (
            ("postgres_baseline", {"target": "/x"}),
            "reset recipe for service 'app-db' (seed 'postgres_baseline', kind 'sql_dump') failed: "
            "guard step on service 'app-db': unknown reset option(s) ['target'] "
            "(known: database, strategy, user)",
        ),
    ],
)
def test_binding_guards_fail_before_any_container_exists(
    tmp_path: Path, reset: tuple[str, dict[str, str]], reason: str
) -> None:
    s = Stack(
        tmp_path,
        {"app-db": PG, "runner": RUNNER},
        {"app-db": reset},
        {"postgres_baseline": ("base.sql", SeedKind.SQL_DUMP, SQL)},
    )
    s.expect_cleanup(s.base)
    with pytest.raises(ProvisionError) as err:
        s.provision()
    assert (err.value.stage, err.value.reason) == ("reset_recipe", reason)
    assert not any(v.startswith(("up", "config")) for v in s.verbs())
    s.assert_cleaned_up()


def test_seed_edited_after_load_fails_the_digest_step(tmp_path: Path) -> None:
    s = pg_stack(tmp_path)
    s.expect_config()
    s.fake.expect(*s.full, "up", exact=False)
    s.expect_readiness()
    s.expect_cleanup()
    seed = s.project.seeds["postgres_baseline"]
    seed.path.write_bytes(b"drop table everything;\n")
    with pytest.raises(ProvisionError) as err:
        s.provision()
    assert err.value.reason == (
        "reset recipe for service 'app-db' (seed 'postgres_baseline', kind 'sql_dump') failed: "
        f"digest step on service 'app-db': seed 'postgres_baseline' changed since the project was loaded "
        f"({seed.path}: expected {seed.digest}, found {seed_digest(seed.path, SeedKind.SQL_DUMP)}); "
        "re-run `forge stamp` if the change is intended"
    )
    assert not any(v.startswith("exec") for v in s.verbs())
    s.assert_cleaned_up()


def test_ctrl_c_during_a_recipe_still_cleans_up_then_reraises(tmp_path: Path) -> None:
    s = pg_stack(tmp_path)
    s.expect_config()
    s.fake.expect(*s.full, "up", exact=False)
    s.expect_readiness()
    s.fake.expect(*PSQL, raises=KeyboardInterrupt())
    s.expect_cleanup()
    with pytest.raises(KeyboardInterrupt):
        s.provision()
    s.assert_cleaned_up()


def test_a_bug_still_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = pg_stack(tmp_path)
    s.expect_config(stdout="not json")
    s.expect_cleanup(s.base)
    with pytest.raises(json.JSONDecodeError):
        s.provision()
    s.assert_cleaned_up()


def test_failed_teardown_is_noted_on_the_original_error(tmp_path: Path) -> None:
    s = pg_stack(tmp_path)
    s.expect_config()
    s.fake.expect(*s.full, "up", raises=CommandError(["docker"], 1, "", "port is already allocated"))
    s.expect_logs()
    s.fake.expect(*s.full, "down", rc=1, stderr="engine gone")
    with pytest.raises(ProvisionError) as err:
        s.provision()
    assert err.value.stage == "compose_up"
    assert any("tearing down proj-r1-t-0 failed too" in n for n in err.value.__notes__)


def test_log_capture_failure_does_not_hide_the_rest(tmp_path: Path) -> None:
    s = pg_stack(tmp_path)
    s.expect_config()
    s.fake.expect(*s.full, "up", raises=CommandError(["docker"], 1, "", "boom"))
    s.fake.expect("docker", "logs", "--tail", "200", "id-app-db", raises=CommandTimeout(["logs"], 9))
    s.expect_logs()
    s.fake.expect(*s.full, "down")
    with pytest.raises(ProvisionError):
        s.provision()
    assert "could not capture this log" in (s.trial_dir / "services" / "app-db.log").read_text()
    assert s.verbs()[-1] == "down --volumes --remove-orphans"


# ------------------------------------------------------------------------------------ teardown/shared


def test_capture_logs_and_teardown_trial(tmp_path: Path) -> None:
    s = Stack(tmp_path, {"a": RUNNER}, {})
    s.expect_config()
    s.fake.expect(*s.full, "up", exact=False)
    s.expect_readiness()
    s.expect_logs(5, stdout="hello\n", stderr="warning\n")
    s.fake.expect(*s.full, "down", "--volumes", "--remove-orphans", exact=True)
    trial = s.provision()
    prov.capture_logs(trial, tmp_path / "out", 5)
    assert (tmp_path / "out" / "a.log").read_text() == "hello\nwarning\n"  # both streams, one file
    assert prov.teardown_trial(trial) >= 0
    assert s.fake.calls[-1].timeout == 50


def test_capture_logs_reads_each_container_the_trial_ran_on(tmp_path: Path) -> None:
    # A warm stack: `a` has its current container, a retired one and a spare (neither is this trial's);
    # `b` has two replicas (each under a header); `c` was never created (an empty file, no error).
    s = Stack(tmp_path, {"a": RUNNER, "b": RUNNER, "c": RUNNER}, {})
    infos = [
        {"Id": i, "Name": f"/{NAME}-{svc}-{n}", "Config": {"Labels": {COMPOSE_SERVICE: svc}}}
        for i, svc, n in [("old", "a", 1), ("cur", "a", 2), ("spare", "a", 3), ("b2", "b", 2), ("b1", "b", 1)]
    ]  # fmt: skip
    s.fake.expect("docker", "ps", "--all", "--quiet", stdout="old cur spare b2 b1")
    s.fake.expect("docker", "inspect", stdout=json.dumps(infos))
    for i in ("cur", "b1", "b2"):
        answer = {"stdout": f"{i} out\n", "stderr": f"{i} err\n"}
        s.fake.expect("docker", "logs", "--tail", "7", i, exact=True, **answer)
    compose = compose_mod.ComposeProject(
        NAME, (tmp_path / "c.yaml",), s.fake, containers={"a": f"{NAME}-a-2"}
    )
    trial = prov.Stack(NAME, s.env, compose, {}, {}, tmp_path)
    prov.capture_logs(trial, tmp_path / "out", 7)
    out = tmp_path / "out"
    assert (out / "a.log").read_text() == "cur out\ncur err\n"
    assert (out / "b.log").read_text() == (
        f"==> {NAME}-b-1 <==\nb1 out\nb1 err\n==> {NAME}-b-2 <==\nb2 out\nb2 err\n"
    )
    assert (out / "c.log").read_text() == ""
    assert sorted(p.name for p in out.iterdir()) == ["a.log", "b.log", "c.log"]  # no part files left
    assert not [c for c in s.fake.calls if "compose" in c.argv]  # no compose CLI start per service


def test_all_shared_services_share_one_stack_per_run(tmp_path: Path) -> None:
    s = Stack(tmp_path, {"a": RUNNER}, {}, isolation=Isolation.SHARED)
    assert not s.env.requires_per_trial
    config = json.dumps(s.config)
    s.fake.expect(
        "docker", "compose", "--ansi", "never", "--project-name", ANY, "--file", ANY, "config", stdout=config
    )
    s.fake.expect("docker", "compose", "--ansi", "never", "--project-name")
    s.fake.expect("docker", "image", "inspect", stdout=json.dumps(IMAGES))
    s.expect_readiness()
    ctx = prov.StackContext(s.project, T, s.fake, s.cache)
    first = s.shared.acquire(ctx, prov.TrialSpec(s.task, "r1", 0, s.trial_dir))
    second = s.shared.acquire(ctx, prov.TrialSpec(s.task, "r1", 1, tmp_path / "t1"))
    assert first.shared and second.shared and first.name == second.name
    assert first.name.startswith("proj-r1-env") and first.name.endswith("-shared")
    assert second.trial_dir == tmp_path / "t1" and second.timings == {"shared_stack": 0.0}
    stack_calls = [c for c in s.fake.calls if c.argv[:2] == ("docker", "compose")]
    assert [c.argv[8] for c in stack_calls] == ["config", "--file"]  # the second call has the override
    assert stack_calls[1].argv[10] == "up"
    n = len(s.fake.calls)
    assert prov.teardown_trial(second) == 0.0
    assert len(s.fake.calls) == n  # the shared stack outlives its trials
    s.shared.teardown_run("r1")
    assert s.fake.calls[-1].argv[-3:] == ("down", "--volumes", "--remove-orphans")
    assert first.compose.files[-1].parent == tmp_path / "trial"
    labels = yaml.safe_load(first.compose.files[-1].read_text())["services"]["a"]["labels"]
    assert labels[lab.TRIAL] == "shared"


def test_main_teardown_refuses_a_name_forge_did_not_create(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRunner()
    fake.expect("docker", exact=False)  # every query finds nothing
    monkeypatch.setattr(commands, "SubprocessRunner", lambda **kw: fake)
    from forgelib.errors import ForgeError

    with pytest.raises(ForgeError, match="no forge stack named 'someone-elses' on this engine"):
        commands.main_teardown("someone-elses")
    assert all(c.argv[1] in ("ps", "network", "volume") for c in fake.calls)
    with pytest.raises(ForgeError, match="is not a compose project name"):
        commands.main_teardown("Bad Name")


def test_exhausted_network_address_pools_read_as_a_fix_not_dockers_text(tmp_path: Path) -> None:
    s = pg_stack(tmp_path)
    s.expect_config()
    said = (
        "failed to create network proj-r1-t-0_default: Error response from daemon: could not find an "
        "available, non-overlapping IPv4 address pool among the defaults to assign to the network"
    )
    s.fake.expect(*s.full, "up", rc=1, stderr=said)
    s.expect_cleanup()
    with pytest.raises(ProvisionError) as info:
        s.provision()
    assert info.value.stage == "compose_up"
    assert info.value.reason.startswith("Docker has no free network address pool left")
    assert "forge reap" in info.value.reason and "default-address-pools" in info.value.reason
    assert "non-overlapping IPv4 address pool" in info.value.reason  # docker's own words kept, last
    s.assert_cleaned_up()


def test_every_call_after_the_config_redacts_the_services_passwords_and_is_tagged(tmp_path: Path) -> None:
    s = pg_stack(tmp_path)
    s.config["services"]["app-db"]["environment"] = {"POSTGRES_USER": "app", "POSTGRES_PASSWORD": "s3cret"}
    s.config["services"]["runner"]["environment"] = {"API_TOKEN": "tok-1", "HOME": "/root"}
    s.expect_config()
    s.fake.expect(*s.full, "up", exact=False)
    s.expect_readiness()
    s.fake.expect(*PSQL, exact=False)
    s.provision()
    stack_calls = [c for c in s.fake.calls if c.argv[:2] == ("docker", "compose") or "psql" in c.argv]
    config_call, *after = stack_calls
    assert config_call.secrets == ()  # the config is what names them
    assert after and all({"s3cret", "tok-1"} <= set(c.secrets) and "/root" not in c.secrets for c in after)
    # each call is tagged with its verb: what a stop kills (launches) is known, not guessed
    assert [c.tag for c in stack_calls] == ["config", "up", "exec"]
    # and so is each container start: a stop refuses it (signals.LAUNCH_VERBS)
    assert {c.tag for c in s.fake.calls if c.argv[:2] == ("docker", "start")} == {"start"}


def test_ctrl_c_while_a_stack_comes_up_is_an_interruption_not_a_compose_up_failure() -> None:
    """A stop refusing (or killing) `up` must reach the run as Interrupted: wrapped in ProvisionError, the
    trial's record would name a provisioning stage (a pack fault) for what Ctrl-C did."""
    from types import SimpleNamespace

    from forgelib.errors import Interrupted
    from forgelib.stacks import provision

    def up(*a: Any, **kw: Any) -> None:
        raise Interrupted("stop requested (SIGINT): not running `up`")

    compose: Any = SimpleNamespace(up=up)
    with pytest.raises(Interrupted):
        provision._up(compose, {}, ["db"], {}, create=True)


def test_ctrl_c_during_a_runs_build_is_not_cached_as_a_broken_build(tmp_path: Path) -> None:
    """The run builds each `build:` service once and every trial shares the outcome: an interrupted build
    must propagate as Interrupted, not become the run's "building failed, fix the Dockerfile" for all."""
    from types import SimpleNamespace

    from forgelib.docker.builds import Builds
    from forgelib.errors import Interrupted

    calls: list[str] = []

    def build(services: Any, timeout: float) -> None:
        calls.append("build")
        if len(calls) == 1:
            raise Interrupted("stop requested (SIGINT): `build` was stopped")

    compose: Any = SimpleNamespace(files=(tmp_path / "c.yaml",))
    compose.with_files = lambda *files: SimpleNamespace(build=build)
    config = {"services": {"api": {"build": {"context": "."}}}}
    b = Builds()
    with pytest.raises(Interrupted):
        b.images("p", compose, config, {}, tmp_path, 5)
    assert set(b.images("p", compose, config, {}, tmp_path, 5)) == {"api"} and calls == ["build", "build"]


def test_a_golden_failing_while_a_stop_is_requested_is_not_discarded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During a stop any service may fail to come up (its commands refused or killed): that is no proof
    against the golden it was restored from, so it stays tagged and the provisioning ends Interrupted."""
    from types import SimpleNamespace

    from forgelib.errors import Interrupted
    from forgelib.spec.models import Timeouts
    from forgelib.stacks import provision
    from forgelib.stacks.live import StopState
    from forgelib.stacks.snapshots.trial import GoldenFailed, Plan, TrialGoldens
    from forgelib.testing import FakeRunner

    state = StopState()
    runner = state.guard(FakeRunner())  # unscripted: any discard (docker image rm) would fail the test
    project: Any = SimpleNamespace(name="p")
    env: Any = None
    ctx = provision.StackContext(project, Timeouts(), runner)
    goldens = TrialGoldens(runner, Timeouts(), "r1", "p", lambda: state.requested)
    spec = provision.StackPlan(env, "p1", {}, tmp_path)
    p = provision._Provisioning(ctx, spec, provision.GoldenSteps(goldens))
    discarded: list[str] = []
    monkeypatch.setattr(TrialGoldens, "discard", lambda self, plan, reason: discarded.append(reason))

    attempts: list[int] = []

    def attempt() -> Any:
        attempts.append(1)
        assert len(attempts) == 1, "provisioned again after a stop"
        state.request("SIGINT")
        raise GoldenFailed(Plan("db"), "did not start from the golden")

    monkeypatch.setattr(p, "_attempt", attempt)
    with pytest.raises(Interrupted):
        p.run()
    assert discarded == []


def test_a_trial_restoring_a_golden_writes_its_override_once_on_the_golden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The override is written after the golden plan, once: the restored service on its golden's image
    (by ID) without a volume at the image's VOLUME, the others as on a fresh trial; no recipe runs for it."""
    from types import SimpleNamespace

    from forgelib.stacks.snapshots.trial import Plan, TrialGoldens

    s = pg_stack(tmp_path)
    golden: Any = SimpleNamespace(id="sha256:golden")
    planned: list[Mapping[str, Any]] = []

    def plan(self: Any, bindings: Any, services: Mapping[str, Any], locks: Any) -> dict[str, Plan]:
        planned.append(services)
        return {"app-db": Plan("app-db", golden=golden)}

    monkeypatch.setattr(TrialGoldens, "plan", plan)
    monkeypatch.setattr(TrialGoldens, "verify", lambda self, plan, recipe, ctx: None)
    writes: list[Path] = []
    write = prov.write_override
    monkeypatch.setattr(prov, "write_override", lambda path, doc: writes.append(path) or write(path, doc))
    s.expect_config()
    s.fake.expect("docker", "image", "inspect", "sha256:golden", stdout=json.dumps([{"Id": "sha256:golden"}]))
    s.fake.expect(*s.full, *CREATE, exact=True)
    s.expect_readiness()
    trial = s.provision(snapshots=True)
    assert writes == [s.trial_dir / "compose.forge.yaml"]
    assert planned[0]["app-db"].image == "forgelib/postgres:15"  # planned on the config's image
    override = load_override(writes[0].read_text())
    assert override["services"]["app-db"]["image"] == "sha256:golden"
    assert "volumes" not in override["services"]["app-db"]
    assert "image" not in override["services"]["runner"]
    assert not [c for c in s.fake.calls if "psql" in c.argv]
    assert trial.compose.files[-1] == writes[0]


def test_warm_steps_start_from_goldens_only_when_the_context_says_so(tmp_path: Path) -> None:
    s = pg_stack(tmp_path)
    plain = prov.StackContext(s.project, T, s.fake, s.cache)
    assert type(prov.warm_steps(plain, "r1")) is prov.WarmSteps
    steps = prov.warm_steps(prov.StackContext(s.project, T, s.fake, s.cache, goldens=True), "r1")
    assert isinstance(steps, prov.GoldenWarmSteps)
    assert steps.goldens.run_id == "r1" and steps.goldens.project == "proj"


def test_a_warm_stack_restoring_a_golden_starts_it_first_verifies_then_prepares_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With goldens, a warm stack's restored service comes up alone before its dependents (no recipe), is
    verified against its golden, and only then prepared for in-place resets, as a seeded one would be."""
    from types import SimpleNamespace

    from forgelib.stacks.snapshots.trial import Plan, TrialGoldens

    s = pg_stack(tmp_path)
    golden: Any = SimpleNamespace(id="sha256:golden")
    order: list[str] = []
    monkeypatch.setattr(
        TrialGoldens, "plan", lambda self, b, services, locks: {"app-db": Plan("app-db", golden=golden)}
    )
    monkeypatch.setattr(TrialGoldens, "verify", lambda self, plan, recipe, ctx: order.append("verify"))
    prepared: Any = SimpleNamespace(restarts=False)
    monkeypatch.setattr(
        prov, "prepare_seed", lambda b, ctx, live=False: order.append(f"prepare {live}") or prepared
    )
    s.expect_config()
    s.fake.expect("docker", "image", "inspect", "sha256:golden", stdout=json.dumps([{"Id": "sha256:golden"}]))
    s.fake.expect(*s.full, *CREATE, exact=True)
    s.expect_readiness()
    phases: list[str] = []
    steps = prov.warm_steps(prov.StackContext(s.project, T, s.fake, s.cache, goldens=True), "r1")
    trial = s.provision(steps=steps, on_phase=lambda name, secs: phases.append(name))
    assert not [c for c in s.fake.calls if "psql" in c.argv]  # no recipe: it started at its seeded state
    assert s.started()[0] == ["app-db"]  # before its dependents
    assert sorted(x for ids in s.started()[1:] for x in ids) == ["runner", "widgets-api"]
    assert order == ["verify", "prepare False"]  # verified once, then prepared as a seeded one (not live)
    assert trial.prepared == (prepared,)
    assert phases.index("golden_verify:app-db") < phases.index("warm_prepare") < phases.index("up_rest")


def test_a_warm_stack_whose_golden_fails_is_provisioned_again_seeding_that_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The golden's failure discards it; the next attempt plans again (the golden gone) and seeds."""
    from forgelib.stacks.snapshots.trial import GoldenFailed, Plan

    steps = prov.warm_steps(
        prov.StackContext(pg_stack(tmp_path).project, T, FakeRunner(), goldens=True), "r1"
    )
    assert isinstance(steps, prov.GoldenWarmSteps)
    discarded: list[str] = []
    monkeypatch.setattr(steps.goldens, "discard", lambda plan, reason: discarded.append(reason))
    steps.failed(GoldenFailed(Plan("app-db"), "not at its golden"), "p1")
    assert discarded == ["not at its golden"]
    steps.plans = {"app-db": Plan("app-db")}  # the next attempt's plan: no golden to restore
    assert steps.needs_recipe("app-db") and not steps.starts_first("app-db")


def test_compose_is_asked_once_whether_it_labels_a_containers_own_volume() -> None:
    """``ComposeFacts.volume_labels``: compose 2.35 or later puts a mount's ``volume.labels`` on the volume it
    creates; an older one (it refuses the key), or one that does not say, takes the named volume's path."""
    from forgelib.docker.compose import ComposeFacts
    from forgelib.testing import FakeRunner

    for said, rc, labels in [
        ("2.40.3\n", 0, True),
        ("v2.35.0", 0, True),
        ("2.34.9", 0, False),
        ("", 1, False),
        ("garbage", 0, False),
    ]:
        fake = FakeRunner()
        fake.expect("docker", "compose", "version", "--short", rc=rc, stdout=said)
        facts = ComposeFacts()
        assert [facts.volume_labels(fake, 5.0) for _ in range(3)] == [labels] * 3, said
        assert len(fake.calls) == 1  # asked once per owner
