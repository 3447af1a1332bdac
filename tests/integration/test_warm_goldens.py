"""A warm stack from goldens on the real engine: the first warm stack of a key captures its reset services'
goldens (as a fresh stack with goldens does), a later one starts from them; both reset in place to the
fingerprints of a warm stack seeded by its recipes, and a trial on a reset, golden-started stack observes
what a trial on a fresh stack does. A golden whose state is not the one it was captured with is discarded
and that warm stack seeds instead. Every golden taken is removed; nothing is left on the engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.goldens import goldens_of, misstate, own_project
from support.stacks import PG, REDIS, TIMEOUTS, make_project
from support.trialview import seen

from forgelib.docker import labels as lab
from forgelib.kinds.base import Fingerprint, fingerprint_diff
from forgelib.runner import SubprocessRunner
from forgelib.spec.models import Project, SeedKind
from forgelib.stacks import connect
from forgelib.stacks.provision import (
    StackContext,
    StackPlan,
    TrialSpec,
    WarmSteps,
    provision_stack,
    provision_trial,
    teardown_trial,
    warm_steps,
)
from forgelib.stacks.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

RDB = Path(__file__).parents[2] / "examples/multi_service_cache_debug/assets/cache_poisoned.rdb"


@pytest.fixture
def name(runner: SubprocessRunner) -> Iterator[str]:
    """A project name of its own; every golden taken under it is removed afterwards."""
    with own_project(runner, "wgold") as n:
        yield n


def _project(root: Path, name: str) -> Project:
    root.mkdir(parents=True)
    (root / "seed.sql").write_text("update t set v = 'seeded'; create table s (k int primary key);\n")
    # init file and environment name the project: a golden's key is content, so a concurrent session of
    # this test (another checkout on this engine) never restores or retags ours
    (root / "init.sql").write_text(f"-- {name}\ncreate table t (v text); insert into t values ('factory');\n")
    db = {**PG, "volumes": [f"{root / 'init.sql'}:/docker-entrypoint-initdb.d/init.sql:ro"]}
    cache = {**REDIS, "environment": {"FORGE_TEST_PROJECT": name}}
    return make_project(
        root,
        {"db": db, "cache": cache},
        seeds={"sql": (root / "seed.sql", SeedKind.SQL_DUMP), "rdb": (RDB, SeedKind.REDIS_DUMP)},
        reset={"db": "sql", "cache": "rdb"},
        name=name,
    )


def _warm(ctx: StackContext, run_id: str, tmp: Path, n: int) -> Stack:
    name = f"{ctx.project.name}-{run_id}-warm{n}"
    spec = StackPlan(ctx.project.environment, name, lab.run_labels(run_id, f"warm.{n}"), tmp / f"warm{n}")
    steps = warm_steps(ctx, run_id) if ctx.goldens else WarmSteps()
    assert isinstance(steps, WarmSteps) != ctx.goldens
    return provision_stack(ctx, spec, steps)


def _observe(stack: Stack) -> dict[str, Any]:
    """What a hostile trial lists first: rows, schema, databases, roles and settings; every key and value
    of redis; what the server's OS user sees of postgres's container."""
    with connect.postgres(stack, "db").connect() as conn:
        q = {
            "rows": "select * from t order by 1",
            "tables": "select table_schema, table_name, column_name, data_type"
            " from information_schema.columns"
            " where table_schema not in ('pg_catalog', 'information_schema') order by 1, 2, 3",
            "databases": "select datname from pg_database order by 1",
            "roles": "select rolname, rolsuper, rolcanlogin from pg_roles order by 1",
            "settings": "select name, setting from pg_settings where source not in ('default', 'override')"
            " and name not in ('application_name', 'client_encoding') order by 1",
        }
        out: dict[str, Any] = {k: [list(r) for r in conn.execute(sql).fetchall()] for k, sql in q.items()}
    client = connect.redis_client(stack, "cache")
    try:
        out["redis"] = sorted((k.decode(), repr(client.dump(k))) for k in client.scan_iter(count=1000))
    finally:
        client.close()
    out["db_container"] = seen(stack, "db", "postgres")
    return out


def _without_total(observed: dict[str, Any]) -> dict[str, Any]:
    view = [line for line in observed["db_container"] if not line.startswith("root: total ")]
    return {**observed, "db_container": view}


def _vandalise(stack: Stack) -> None:
    with connect.postgres(stack, "db").connect() as conn:
        conn.execute("update t set v = 'vandalised'")
        conn.execute("alter table t add column extra int")
        conn.execute("create table intruder (x int)")
        conn.execute("create role intruder login")
        conn.execute("create database intruded")
    client = connect.redis_client(stack, "cache")
    try:
        client.flushall()
        client.set("intruder", "yes")
    finally:
        client.close()


def _reset(stack: Stack) -> dict[str, Fingerprint]:
    """Every reset service reset in place; its fingerprint afterwards, proven equal to its baseline."""
    out = {}
    for p in stack.prepared:
        p.reset()
        now = p.fingerprint()
        assert fingerprint_diff(p.baseline, now) == [], p.ctx.service
        out[p.ctx.service] = now
    return out


def test_a_warm_stack_from_goldens_resets_as_one_from_seeds_and_a_trial_sees_a_fresh_stack(
    tmp_path: Path, runner: SubprocessRunner, run_id: str, name: str
) -> None:
    project = _project(tmp_path / "p", name)
    seeds = StackContext(project, TIMEOUTS, runner)
    goldens = StackContext(project, TIMEOUTS, runner, goldens=True)
    stacks: list[Stack] = []
    try:
        stacks.append(fresh := provision_trial(seeds, TrialSpec(None, run_id, 0, tmp_path / "fresh")))
        expected = _observe(fresh)
        assert expected["rows"] == [["seeded"]] and expected["redis"], expected  # not vacuous
        teardown_trial(stacks.pop())

        stacks.append(seeded := _warm(seeds, run_id, tmp_path, 0))
        assert seeded.snapshots == {}
        _vandalise(seeded)
        from_seeds = _reset(seeded)
        assert _observe(seeded) == expected
        teardown_trial(stacks.pop())

        # the first warm stack of the key captures the goldens, as a fresh stack with goldens does
        stacks.append(capturing := _warm(goldens, run_id, tmp_path, 1))
        assert {s: r["outcome"] for s, r in capturing.snapshots.items()} == {
            "cache": "captured",
            "db": "captured",
        }, capturing.snapshots
        teardown_trial(stacks.pop())
        assert sorted(g.part("service") for g in goldens_of(runner, name) if g.complete) == ["cache", "db"]

        # A fresh stack from the golden: what a trial sees of postgres's container differs from a seeded
        # one's in one line, the block count of `ls -la /` (the server's writes copy /var up out of the
        # golden's layer: docs/goldens.md, "What a trial can tell"); everything else is equal. A warm stack
        # from the golden must show exactly this.
        stacks.append(golden_fresh := provision_trial(goldens, TrialSpec(None, run_id, 1, tmp_path / "gf")))
        assert golden_fresh.snapshots["db"]["outcome"] == "restored"
        as_golden = _observe(golden_fresh)
        teardown_trial(stacks.pop())
        assert _without_total(as_golden) == _without_total(expected)

        # a later one starts from them: no recipe ran, and it resets in place as the seeded one does
        stacks.append(restored := _warm(goldens, run_id, tmp_path, 2))
        assert {s: r["outcome"] for s, r in restored.snapshots.items()} == {
            "cache": "restored",
            "db": "restored",
        }, restored.snapshots
        assert not [p for p in restored.timings if p.startswith("recipe:")], restored.timings
        assert "warm_prepare" in restored.timings
        assert sorted(p.ctx.service for p in restored.prepared) == ["cache", "db"]
        for trial in range(2):  # a trial changes everything, the reset undoes it, the next sees a fresh stack
            _vandalise(restored)
            from_golden = _reset(restored)
            for svc in ("cache", "db"):
                assert fingerprint_diff(from_seeds[svc], from_golden[svc]) == [], (trial, svc)
            assert _observe(restored) == as_golden, trial
        teardown_trial(stacks.pop())
    finally:
        for s in stacks:
            teardown_trial(s)


def test_a_warm_stack_whose_golden_was_tampered_with_discards_it_and_seeds(
    tmp_path: Path, runner: SubprocessRunner, run_id: str, name: str
) -> None:
    project = _project(tmp_path / "p", name)
    goldens = StackContext(project, TIMEOUTS, runner, goldens=True)
    teardown_trial(_warm(goldens, run_id, tmp_path, 0))  # captures
    (golden,) = [g for g in goldens_of(runner, name) if g.complete and g.part("service") == "db"]
    # the golden restores other state than it was taken from: its fingerprint says so
    misstate(runner, golden, tmp_path / "tamper", seeded_rows="0" * 64)
    stack = _warm(goldens, run_id, tmp_path, 1)
    try:
        rec = stack.snapshots["db"]
        assert "fingerprint parts differ: seeded_rows" in rec["discarded"]["reason"], rec
        assert "recipe:db" in stack.timings  # seeded the normal way
        assert stack.snapshots["cache"]["outcome"] == "restored"  # the other golden still served
        _vandalise(stack)
        _reset(stack)
        with connect.postgres(stack, "db").connect() as conn:
            assert conn.execute("select * from t").fetchall() == [("seeded",)]
    finally:
        teardown_trial(stack)
