"""A kind registered with a client is reachable from ``connect`` and the pytest fixture with no code
outside its package: here a made-up kind (``fakedb``) whose package exists only in this test, registered
the way a kind is (its ``Kind`` in the registry's list), and nothing else."""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from forgelib.errors import ForgeError
from forgelib.kinds import registry
from forgelib.kinds.base import CLIENT_MEMBERS, Address
from forgelib.kinds.kind import Kind
from forgelib.pytest_plugin.stacks import ForgeStack
from forgelib.spec.models import EnvironmentManifest, Isolation, ResetBinding, Service, Timeouts
from forgelib.stacks import connect
from forgelib.stacks.stack import Stack

PACKAGE = "fakedb_kind_for_tests"
FAKE = Kind(name="fakedb", package=PACKAGE, seeds={}, images=("fakedb",), client="client")


@dataclass
class FakeClient:
    """What the fake kind's ``client`` opens: the arguments it was given, and whether it was closed."""

    where: tuple[str, int]
    user: str
    keywords: Mapping[str, Any]
    closed: bool = False

    def close(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class FakeParams:
    where: tuple[str, int]
    user: str
    database: str

    def url(self) -> str:
        return f"fakedb://{self.user}@{self.where[0]}:{self.where[1]}/{self.database}"

    def client(self, **keywords: Any) -> FakeClient:
        return FakeClient(self.where, self.user, keywords)


def _client_module() -> types.ModuleType:
    """The fake kind's client module: the two functions of ``kinds.base.Client``, port 7000 in the
    container, the user from the binding's options else the service's ``FAKEDB_USER``."""
    mod = types.ModuleType(f"{PACKAGE}.client")

    def params(
        svc: Any, options: Mapping[str, Any], address: Address, /, *, database: str = "main"
    ) -> FakeParams:
        return FakeParams(address(7000), str(options.get("user") or svc.environment["FAKEDB_USER"]), database)

    def connection_strings(svc: Any, options: Mapping[str, Any], address: Address) -> dict[str, str]:
        return {"url": params(svc, options, address).url()}

    for fn in (params, connection_strings):
        setattr(mod, fn.__name__, fn)
    return mod


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Kind:
    """The fake kind in the registry's list, as its one line in ``forgelib.kinds.KINDS`` would put it."""
    monkeypatch.setitem(sys.modules, PACKAGE, types.ModuleType(PACKAGE))
    monkeypatch.setitem(sys.modules, f"{PACKAGE}.client", _client_module())
    monkeypatch.setattr(registry, "KINDS", (*registry.KINDS, FAKE))
    monkeypatch.setitem(registry.BY_NAME, FAKE.name, FAKE)
    return FAKE


class Ports:
    """compose's port lookup: ``fdb:7000`` is published at 127.0.0.1:41000; nothing else is."""

    def port(self, service: str, container_port: int) -> tuple[str, int]:
        if (service, container_port) == ("fdb", 7000):
            return "127.0.0.1", 41000
        raise ForgeError(f"service {service!r} does not publish port {container_port}")


CONFIG = {
    "services": {
        "fdb": {"image": "registry.example/fakedb:2", "environment": {"FAKEDB_USER": "app"}},
        "other": {"image": "fakedb:2", "environment": {"FAKEDB_USER": "app"}},
        "plain": {"image": "custom:1", "environment": {"FAKEDB_USER": "app"}},
        "runner": {"image": "forgelib/python:3.11"},
    }
}


def _stack(bound_user: str | None = None) -> Stack:
    binding = ResetBinding("s", {"user": bound_user}) if bound_user else None
    env = EnvironmentManifest(
        (Path("/p/compose.yaml"),),
        {
            "fdb": Service("fdb", Isolation.RESET, binding),
            "runner": Service("runner", Isolation.EPHEMERAL),
        },
    )
    return Stack("p", env, Ports(), {}, {}, Path("/t"), config=CONFIG)  # type: ignore[arg-type]


def test_connect_dispatches_to_the_client_of_the_kind_recognised_for_the_service(registered: Kind) -> None:
    stack = _stack()
    assert stack.kind("fdb") is registered
    assert connect.url(stack, "fdb") == "fakedb://app@127.0.0.1:41000/main"
    assert connect.url(stack, "fdb", database="other") == "fakedb://app@127.0.0.1:41000/other"
    assert connect.url(stack, "fdb", inside=True) == "fakedb://app@fdb:7000/main"  # by name on its network
    assert connect.params(stack, "fdb") == FakeParams(("127.0.0.1", 41000), "app", "main")
    opened = connect.client(stack, "fdb", autocommit=False)
    assert isinstance(opened, FakeClient) and opened.keywords == {"autocommit": False}
    # the seed binding's options reach the kind (the user the seed connected as)
    assert connect.url(_stack(bound_user="seeder"), "fdb") == "fakedb://seeder@127.0.0.1:41000/main"


def test_the_pytest_fixture_gives_the_kinds_client_and_url_and_closes_the_client(registered: Kind) -> None:
    view = ForgeStack(_stack(), None, None, "run", Timeouts())  # type: ignore[arg-type]
    assert view.url("fdb") == "fakedb://app@127.0.0.1:41000/main"
    assert view.url("fdb", database="x") == "fakedb://app@127.0.0.1:41000/x"
    opened = view.client("fdb", autocommit=False)
    assert isinstance(opened, FakeClient) and not opened.closed
    view.release()
    assert opened.closed  # the test is over: what it opened is closed
    with pytest.raises(ForgeError, match="does not publish port 7000") as e:
        view.client("other")  # recognised as the kind, but its port is not published
    assert "publish it in the compose file" in str(e.value)


def test_a_service_of_no_kind_with_a_client_is_refused_naming_the_ones_forge_connects_to(
    registered: Kind,
) -> None:
    stack = _stack()
    with pytest.raises(ForgeError, match=r"'runner' is of no kind forge recognises; .*: fdb, other \("):
        connect.client(stack, "runner")
    with pytest.raises(ForgeError, match="no service 'ghost'"):
        connect.url(stack, "ghost")
    with pytest.raises(ForgeError, match="no kind 'nosuch'"):
        connect.url(stack, "fdb", kind="nosuch")
    # named, the kind reaches a service forge does not recognise (as connect.postgres always has)
    with pytest.raises(ForgeError, match="'plain' is of no kind"):
        connect.url(stack, "plain", inside=True)
    assert connect.url(stack, "plain", kind="fakedb", inside=True) == "fakedb://app@plain:7000/main"
    assert connect.url(stack, "plain", kind=registered, inside=True) == "fakedb://app@plain:7000/main"


@pytest.mark.parametrize("kind", [k for k in registry.KINDS if k.client], ids=lambda k: k.name)
def test_every_kind_with_a_client_has_every_member_of_the_client_protocol(kind: Kind) -> None:
    module = registry.client(kind)
    assert module is not None
    missing = [m for m in CLIENT_MEMBERS if not callable(getattr(module, m, None))]
    assert missing == [], f"{kind.package}.{kind.client} lacks {missing}"
