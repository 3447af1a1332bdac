"""Every kind passes the same checks on the real engine (``forgelib.kinds``), like inspect's sandbox
``self_check``: its seed applied, each reset strategy restoring it, a stable fingerprint, its grading
observer, its MCP tool backend and its client. One warm stack serves the module (a service per kind and
reset strategy). A kind that does not support a check says so itself (``Kind.unsupported``): the check is
skipped with the kind's reason, never edited per kind."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.stacks import IDLE, PG, REDIS, TIMEOUTS, make_project

from forgelib import connect
from forgelib import labels as lab
from forgelib.kinds import KINDS, Kind
from forgelib.kinds import registry as kinds
from forgelib.kinds.base import PreparedSeed, fingerprint_diff
from forgelib.mcp.tools import Toolbox
from forgelib.provision import (
    ProvisionedTrial,
    StackContext,
    StackSpec,
    WarmSteps,
    provision_stack,
    teardown_trial,
)
from forgelib.resolved import ResolvedConfig
from forgelib.runner import SubprocessRunner
from forgelib.spec.models import SeedKind

pytestmark = pytest.mark.integration

RDB = Path(__file__).parents[2] / "examples/multi_service_cache_debug/assets/cache_poisoned.rdb"


@dataclass(frozen=True)
class Case:
    """How the suite exercises one kind: its services in the stack, a way to change the seeded state and
    to read it back (``probe``: what it must read after apply and after every reset)."""

    services: tuple[str, ...]
    seed: str
    probe: list[str]  # argv in the service whose stdout is the seeded state
    expected: str
    change: list[str]  # argv in the service that changes the seeded state
    check: dict[str, Any] | None = None  # the spec of the kind's check (service filled in)
    tool: tuple[str, dict[str, Any], str] | None = None  # (tool, arguments, text the result holds)


CASES: dict[str, Case] = {
    "postgres": Case(
        ("db", "tdb"),
        "sql",
        ["psql", "-At", "-U", "postgres", "-c", "select v from t"],
        "seeded",
        ["psql", "-U", "postgres", "-c", "update t set v = 'changed'"],
        check={"query": "select v from t"},
        tool=("sql_query", {"query": "select v from t"}, '"rows": [["seeded"]]'),
    ),
    "redis": Case(
        ("cache",),
        "rdb",
        ["redis-cli", "--raw", "DBSIZE"],
        "",  # filled from the stack after apply
        ["redis-cli", "FLUSHALL"],
        check={"command": ["DBSIZE"]},
        tool=("redis_command", {"command": ["DBSIZE"]}, '"reply"'),
    ),
    "tree": Case(
        ("ws",),
        "tree",
        ["sh", "-c", "cat /workspace/a.txt"],
        "a",
        ["sh", "-c", "echo vandal > /workspace/a.txt; rm -f /workspace/b.txt"],
    ),
    "bare": Case(("bare",), "order", ["sh", "-c", 'cat "$FORGE_SEED_ORDER"'], "order-7", ["true"]),
}


def _skip_unless(kind: Kind, what: str) -> None:
    if what in kind.unsupported:
        pytest.skip(f"{kind.name}: {kind.unsupported[what]}")


@pytest.fixture(scope="module")
def stack(
    docker_ready: None, runner: SubprocessRunner, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProvisionedTrial]:
    tmp = tmp_path_factory.mktemp("kinds")
    (tmp / "seed.sql").write_text("create table t (v text); insert into t values ('seeded');\n")
    tree = tmp / "tree"
    tree.mkdir()
    (tree / "a.txt").write_text("a")
    (tree / "b.txt").write_text("b")
    (tmp / "order.txt").write_text("order-7")
    project = make_project(
        tmp / "p",
        {
            "db": PG,
            "tdb": PG,
            "cache": {**REDIS, "command": ["redis-server", "--save", "", "--appendonly", "no"]},
            "ws": {**IDLE, "volumes": ["work:/workspace"]},
            "bare": IDLE,
        },
        seeds={
            "sql": (tmp / "seed.sql", SeedKind.SQL_DUMP),
            "rdb": (RDB, SeedKind.REDIS_DUMP),
            "tree": (tree, SeedKind.FILESYSTEM_DIR),
            "order": (tmp / "order.txt", SeedKind.BARE),
        },
        reset={
            "db": "sql",
            "tdb": ("sql", {"strategy": "template"}),
            "cache": "rdb",
            "ws": "tree",
            "bare": "order",
        },
        volumes={"work": {}},
    )
    run_id = f"it-kinds-{secrets.token_hex(4)}"
    name = f"itkinds-{run_id}"
    spec = StackSpec(project.environment, name, lab.run_labels(run_id, "kinds-0"), tmp / "stack")
    trial = provision_stack(StackContext(project, TIMEOUTS, runner), spec, WarmSteps())
    try:
        yield trial
    finally:
        teardown_trial(trial)
        assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))


@pytest.fixture(scope="module")
def seeded(stack: ProvisionedTrial) -> dict[str, str]:
    """service -> what its probe reads right after the first seeding."""
    return {s: _probe(stack, s, CASES[k.name]) for k in KINDS for s in CASES[k.name].services}


def _probe(stack: ProvisionedTrial, service: str, case: Case) -> str:
    return str(stack.compose.exec(service, case.probe, timeout=30).stdout.strip())


def _prepared(stack: ProvisionedTrial, service: str) -> PreparedSeed | None:
    return next((p for p in stack.prepared if p.ctx.service == service), None)


KIND_IDS = [k.name for k in KINDS]


def test_every_kind_has_a_case() -> None:
    assert set(CASES) == set(KIND_IDS)


@pytest.mark.parametrize("name", KIND_IDS)
def test_apply_seeds_the_service(stack: ProvisionedTrial, seeded: dict[str, str], name: str) -> None:
    case = CASES[name]
    for service in case.services:
        assert seeded[service], service
        if case.expected:
            assert seeded[service] == case.expected, service


@pytest.mark.parametrize("name", KIND_IDS)
def test_each_reset_strategy_restores_the_seed(
    stack: ProvisionedTrial, seeded: dict[str, str], name: str
) -> None:
    kind = kinds.by_name(name)
    _skip_unless(kind, "reset")
    case = CASES[name]
    for service in case.services:  # one service per strategy
        prepared = _prepared(stack, service)
        assert prepared is not None, service
        stack.compose.exec(service, case.change, timeout=30)
        assert _probe(stack, service, case) != seeded[service], service
        prepared.reset()
        assert _probe(stack, service, case) == seeded[service], service


@pytest.mark.parametrize("name", KIND_IDS)
def test_the_fingerprint_is_stable_across_a_reset(stack: ProvisionedTrial, name: str) -> None:
    kind = kinds.by_name(name)
    _skip_unless(kind, "fingerprint")
    for service in CASES[name].services:
        prepared = _prepared(stack, service)
        assert prepared is not None and prepared.baseline, service
        prepared.reset()
        assert fingerprint_diff(prepared.baseline, prepared.fingerprint()) == [], service


@pytest.mark.parametrize("name", KIND_IDS)
def test_the_observer_reads_the_seeded_state(
    stack: ProvisionedTrial, seeded: dict[str, str], name: str
) -> None:
    kind = kinds.by_name(name)
    case = CASES[name]
    if not kind.checks or case.check is None:
        pytest.skip(f"{name} observes no check type of its own (the generic file check reads it)")
    config = ResolvedConfig.of(stack.config)
    for check_type in kind.checks:
        for service in case.services:
            svc = config.service(service)
            assert kinds.kind_for_check(check_type, svc) is kind
            got = kinds.observer(kind, check_type)(stack.compose, {**case.check, "service": service}, svc, 30)
            assert got.strip() == seeded[service], service


@pytest.mark.parametrize("name", KIND_IDS)
def test_the_mcp_backend_answers_its_tools(
    stack: ProvisionedTrial, seeded: dict[str, str], name: str
) -> None:
    kind = kinds.by_name(name)
    case = CASES[name]
    if not kind.tools or case.tool is None:
        pytest.skip(f"{name} backs no MCP tool")
    tool, args, holds = case.tool
    box = Toolbox(stack.compose, stack.config)
    try:
        for service in case.services:
            result = box.call(tool, {**args, "service": service})
            assert holds in result, result
            assert seeded[service] in json.dumps(json.loads(result)), result
    finally:
        box.close()


@pytest.mark.parametrize("name", KIND_IDS)
def test_the_client_connects(stack: ProvisionedTrial, name: str) -> None:
    kind = kinds.by_name(name)
    if kinds.client(kind) is None:
        pytest.skip(f"{name}: forge never connects to it directly")
    service = CASES[name].services[0]
    if name == "postgres":
        with connect.postgres(stack, service).connect() as conn:
            assert conn.execute("select v from t").fetchone() == ("seeded",)
    else:
        assert connect.redis(stack, service).client().ping()
