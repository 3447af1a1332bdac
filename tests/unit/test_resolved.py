"""forgelib.docker.resolved: the typed view of `docker compose config`; only it reads the dict's fields."""

from __future__ import annotations

import ast
from pathlib import Path

import forgelib
from forgelib.docker.resolved import ResolvedConfig, ServiceConfig

PACKAGE = Path(forgelib.__file__).parent


def test_a_service_reads_normalised() -> None:
    raw = {
        "image": "postgres:16",
        "build": {"context": "."},
        "environment": ["A=1", "B=x=y", "C"],
        "command": "redis-server --port 7000",
        "ports": [{"target": 5432, "published": "0"}, "5433"],
        "volumes": [{"type": "bind", "source": "/s", "target": "/t"}],
        "depends_on": {"db": {"condition": "service_healthy"}, "cache": None},
        "networks": {"back": None},
        "network_mode": "service:vpn",
        "volumes_from": ["data:ro"],
        "links": ["db:database"],
        "container_name": "shop-app",
        "deploy": {"replicas": 3},
    }
    svc = ServiceConfig.of(raw, "app")
    assert (svc.name, svc.image, svc.build) == ("app", "postgres:16", True)
    assert svc.environment == {"A": "1", "B": "x=y", "C": ""}
    assert svc.command == ("redis-server", "--port", "7000")
    assert svc.ports == ({"target": 5432, "published": "0"},)
    assert svc.volumes == ({"type": "bind", "source": "/s", "target": "/t"},)
    assert svc.depends_on == {"db": {"condition": "service_healthy"}, "cache": {}}
    assert svc.networks == ("back",)
    assert (svc.network_mode, svc.volumes_from, svc.links) == ("service:vpn", ("data:ro",), ("db:database",))
    assert (svc.container_name, svc.replicas) == ("shop-app", 3)
    assert ServiceConfig.of({"scale": 2}).replicas == 2 and ServiceConfig.of({}).replicas == 1
    built = svc.with_image("forge-built:1")
    assert (built.image, built.raw["image"], built.name, built.command) == (
        "forge-built:1",
        "forge-built:1",
        "app",
        svc.command,
    )
    assert svc.image == "postgres:16"  # a copy: the service's own view is unchanged
    assert ServiceConfig.of({"environment": {"P": None, "Q": 5}}).environment == {"P": "", "Q": "5"}


def test_the_whole_config_and_an_absent_service() -> None:
    cfg = ResolvedConfig.of(
        {
            "services": {"b": {"image": "x"}, "a": None},
            "volumes": {"v": None},
            "networks": {"n": {"external": True}},
        }
    )
    assert list(cfg.services) == ["b", "a"]  # compose's order
    assert cfg.service("a").image == "" and cfg.service("nope") == ServiceConfig("nope")
    assert cfg.volumes == {"v": {}} and cfg.networks == {"n": {"external": True}}
    assert ResolvedConfig.of(None).services == {}


# The fields ServiceConfig reads (``volumes``, ``image``: override documents have them too; ``command``: so
# does an agent record).
FIELDS = (
    "environment", "depends_on", "ports", "healthcheck", "network_mode", "volumes_from", "links",
    "container_name", "deploy", "scale",
)  # fmt: skip


def test_only_resolved_py_reads_a_service_s_fields() -> None:
    """``.get(FIELD)`` on a config dict is forgelib.docker.resolved's alone, and ``.raw`` (the dict behind the
    typed view) is read only by it and the golden key's digest (file:line otherwise)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "resolved.py" or "spec" in path.relative_to(PACKAGE).parts:
            continue  # spec/ reads the compose *files* as written, not the resolved config
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in FIELDS
            ):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
            if isinstance(node, ast.Attribute) and node.attr == "raw" and path.name != "key.py":
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} (.raw)")
    assert not found, "resolved config read outside forgelib/docker/resolved.py:\n  " + "\n  ".join(found)
