"""Bring-your-own compose files at validate: what forge refuses (exit 1, file:line and the fix), warns about
(risky, allowed) and notes (what its override changes), per the table in docs/compose.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from forgelib.spec import trialsafety
from forgelib.spec.digest import seed_digest
from forgelib.spec.models import SeedKind
from forgelib.spec.validate import validate_project

HEAD = """services:
  db:
    image: forgelib/postgres:15
"""
TAIL = """  app:
    image: forgelib/python:3.11
  side:
    image: forgelib/redis:7.0
"""


def _project(root: Path, compose: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "s.bin").write_bytes(b"x")
    digest = seed_digest(root / "s.bin", SeedKind.BARE)
    (root / "project.yaml").write_text(
        "name: p\n"
        f"assets: {{seeds: {{s: {{path: s.bin, kind: bare, digest: '{digest}'}}}}}}\n"
        "default_environment:\n  compose_file: compose.yaml\n  services:\n"
        "    db: {isolation: reset, reset: {seed: s}}\n    app: {isolation: ephemeral}\n"
        "    side: {isolation: shared}\n"
    )
    (root / "compose.yaml").write_text(compose)
    return root


# (what the compose file adds, where: (service block or top level), expected severity, line, words)
CASES = {
    "network_mode_host_on_reset": ("db", "    network_mode: host\n", "error", 4, "network_mode: host"),
    "pid_host_on_ephemeral": ("app", "    pid: host\n", "error", 6, "pid: host"),
    "external_volume_on_reset": (
        "db",
        "    volumes: ['shared-data:/var/lib/postgresql/data']\n",
        "error",
        4,
        "external volume 'shared-data'",
    ),
    "external_network_on_reset": (
        "db",
        "    networks: [outside]\n",
        "error",
        4,
        "external network 'outside'",
    ),
    "network_mode_host_on_shared": ("side", "    network_mode: host\n", "warning", 8, "network_mode: host"),
    "external_volume_elsewhere": (
        "app",
        "    volumes: ['shared-data:/data']\n",
        "warning",
        6,
        "external volume",
    ),
    "writable_bind_mount": ("app", "    volumes: ['./data:/data']\n", "warning", 6, "host path ./data"),
    "writable_bind_mount_of_a_variable": (  # the colons inside ${...} are not the mount's
        "app",
        "    volumes: ['${DATA:?set DATA to a host directory}:/data']\n",
        "warning",
        6,
        "host path ${DATA:?set DATA to a host directory} at /data writable",
    ),
    "privileged": ("side", "    privileged: true\n", "warning", 8, "privileged"),
}
EXTERNALS = (
    "volumes:\n  shared-data: {external: true}\nnetworks:\n  outside: {external: true}\n  default: {}\n"
)


def _compose(service: str, line: str) -> str:
    text = HEAD + TAIL
    block = {"db": "    image: forgelib/postgres:15\n", "app": "    image: forgelib/python:3.11\n"}.get(
        service, "    image: forgelib/redis:7.0\n"
    )
    return text.replace(block, block + line, 1) + EXTERNALS


@pytest.mark.parametrize("case", list(CASES))
def test_each_case_is_refused_or_warned_at_its_line(tmp_path: Path, case: str) -> None:
    service, line, severity, lineno, words = CASES[case]
    report = validate_project(str(_project(tmp_path / "p", _compose(service, line))))
    found = [i for i in [*report.errors, *report.notices] if i.severity == severity]
    assert len(found) == 1, [str(i) for i in [*report.errors, *report.notices]]
    issue = found[0]
    assert issue.file.endswith("compose.yaml") and issue.line == lineno, str(issue)
    assert words in issue.message and f"service {service!r}" in issue.message
    assert report.ok is (severity != "error")


@pytest.mark.parametrize(
    ("entry", "mount"),
    [
        ("./data:/data", ("bind", "./data", "/data", False)),
        ("${DATA:?set DATA}:/data:ro", ("bind", "${DATA:?set DATA}", "/data", True)),
        ("${DATA:-${HOME:-/h}/x:y}:/data", ("bind", "${DATA:-${HOME:-/h}/x:y}", "/data", False)),
        ("$${literal:/data", ("bind", "$${literal", "/data", False)),  # an escaped $: no interpolation
        ("cache:/var/cache:rw,z", ("volume", "cache", "/var/cache", False)),
        ("/scratch", ("anonymous", "", "/scratch", False)),
    ],
)
def test_a_short_volume_is_split_on_the_colons_outside_interpolations(
    entry: str, mount: tuple[str, str, str, bool]
) -> None:
    assert trialsafety._mount(entry) == mount


def test_a_read_only_bind_of_a_variable_with_a_colon_passes_without_warnings(tmp_path: Path) -> None:
    compose = _compose("app", "    volumes: ['${MARKER:?set MARKER to a host directory}:/marker:ro']\n")
    report = validate_project(str(_project(tmp_path / "p", compose)))
    assert report.ok and not report.notices, [str(i) for i in report.notices]


def test_a_clean_read_only_bind_and_a_shared_external_network_pass_without_errors(tmp_path: Path) -> None:
    compose = HEAD + "    volumes: ['./init:/docker-entrypoint-initdb.d:ro']\n" + TAIL
    report = validate_project(str(_project(tmp_path / "p", compose)))
    assert report.ok and not report.notices


def test_what_forge_changes_is_noted_once_and_validate_still_passes(tmp_path: Path) -> None:
    compose = (
        HEAD + "    container_name: shop-db\n    ports: ['5432:5432', '127.0.0.1:9187:9187']\n"
        "  app:\n    build: ./app\n    ports: ['8000']\n  side:\n    image: forgelib/redis:7.0\n"
    )
    root = _project(tmp_path / "p", compose)
    for name in ("a", "b"):  # two tasks sharing the stack: still one note each
        (root / f"tasks/{name}").mkdir(parents=True, exist_ok=True)
        (root / f"tasks/{name}/task.yaml").write_text(f"name: {name}\n")
    report = validate_project(str(root))
    assert report.ok, [str(i) for i in report.errors]
    notes = [str(i) for i in report.notices]
    assert all(i.severity == "note" for i in report.notices) and len(notes) == 3, notes
    assert any(
        ":5:" in n
        and "db 5432:5432 -> 127.0.0.1:<random>:5432, db 127.0.0.1:9187:9187 -> 127.0.0.1:<random>:9187" in n
        for n in notes
    )
    assert any(":4:" in n and "container_name 'shop-db' is dropped" in n for n in notes)
    assert any(":7:" in n and "built once per run" in n for n in notes)
    # a bare container port is what forge does anyway: nothing to note
    assert not any("app 8000" in n for n in notes), notes


def test_fixed_ports_are_one_note_per_compose_file(tmp_path: Path) -> None:
    compose = (
        "include: [more.yaml]\n" + HEAD + "    ports: ['5432:5432']\n"
        "  app:\n    image: forgelib/python:3.11\n"
        "    ports: ['8000', '0.0.0.0::8001', {target: 8002, published: 9002}]\n"
    )
    root = _project(tmp_path / "p", compose)
    (root / "more.yaml").write_text(
        "services:\n  side:\n    image: forgelib/redis:7.0\n    ports: ['6379:6379', '6380:6380']\n"
    )
    report = validate_project(str(root))
    assert report.ok, [str(i) for i in report.errors]
    notes = [i for i in report.notices if "random host port" in i.message]
    assert sorted((i.file.rsplit("/", 1)[-1], i.line) for i in notes) == [
        ("compose.yaml", 5),
        ("more.yaml", 4),
    ]
    (main,) = (i.message for i in notes if i.file.endswith("compose.yaml"))
    assert "db 5432:5432 -> 127.0.0.1:<random>:5432, app 0.0.0.0::8001 -> 127.0.0.1:<random>:8001, " in main
    assert "app 9002:8002 -> 127.0.0.1:<random>:8002" in main and "'8000'" not in main
    assert 'write a bare container port (ports: ["8000"])' in main
    (more,) = (i.message for i in notes if i.file.endswith("more.yaml"))
    assert "side 6379:6379 -> 127.0.0.1:<random>:6379, side 6380:6380 -> 127.0.0.1:<random>:6380" in more


def test_the_program_exits_1_listing_every_refusal_with_file_line(tmp_path: Path) -> None:
    compose = (
        HEAD + "    network_mode: host\n    volumes: ['shared-data:/data']\n"
        "  app:\n    image: forgelib/python:3.11\n    pid: host\n    volumes: ['./w:/w']\n"
        "  side:\n    image: forgelib/redis:7.0\n" + EXTERNALS
    )
    root = _project(tmp_path / "p", compose)
    env = {"FORGE_LOG": str(tmp_path / "forge.log"), "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "forgelib", "validate", "--project", str(root)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    for where in (
        "compose.yaml:4:19: $.services.db.network_mode",
        "compose.yaml:5:15:",
        "compose.yaml:8:10:",
    ):
        assert where in done.stderr, done.stderr
    assert "warning: service 'app' (ephemeral) bind-mounts host path ./w" in done.stderr
    as_json = subprocess.run(
        [*run, "--json"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )
    out = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and len(out["errors"]) == 3 and len(out["warnings"]) == 1
