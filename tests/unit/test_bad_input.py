"""Hostile and broken specs through the real CLI: each is a clean error and exit 1 — never a traceback, and
never a command built from unvalidated text (a shell metacharacter in a name runs nothing)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from forgelib.spec.digest import seed_digest
from forgelib.spec.models import SeedKind

Mutator = Callable[[Path], None]
SQL = "CREATE TABLE w (id int);\n"


def base_project(root: Path) -> Path:
    """A small valid project: a sql seed, a directory seed, one compose file, one task, one run config."""
    (root / "seeds" / "tree").mkdir(parents=True)
    (root / "seeds" / "base.sql").write_text(SQL)
    (root / "seeds" / "tree" / "a.txt").write_text("a\n")
    compose = {
        "services": {"db": {"image": "forgelib/postgres:15"}, "files": {"image": "forgelib/python:3.11"}}
    }
    (root / "compose.yaml").write_text(yaml.safe_dump(compose))
    write_project(root)
    (root / "tasks" / "t").mkdir(parents=True)
    (root / "tasks" / "t" / "task.yaml").write_text(
        yaml.safe_dump({"name": "t", "oracle": {"service": "files", "command": ["true"]}})
    )
    (root / "run_configs").mkdir()
    (root / "run_configs" / "dev.yaml").write_text(yaml.safe_dump({"project": "..", "repeats": 1}))
    return root


def write_project(root: Path, **changes: object) -> None:
    seeds = {
        "base": {
            "path": "seeds/base.sql",
            "kind": "sql_dump",
            "digest": seed_digest(root / "seeds" / "base.sql", SeedKind.SQL_DUMP),
        },
        "tree": {
            "path": "seeds/tree",
            "kind": "filesystem_dir",
            "digest": seed_digest(root / "seeds" / "tree", SeedKind.FILESYSTEM_DIR),
        },
    }
    project: dict[str, object] = {
        "name": "bad_input",
        "assets": {"seeds": seeds},
        "default_environment": {
            "compose_file": "compose.yaml",
            "services": {
                "db": {"isolation": "reset", "reset": {"seed": "base"}},
                "files": {"isolation": "reset", "reset": {"seed": "tree"}},
            },
        },
    }
    project.update(changes)
    (root / "project.yaml").write_text(yaml.safe_dump(project))


def validate(root: Path, timeout: float = 120, command: str = "validate") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FORGE_LOG": str(root.parent / "forge.log")}
    bin_dir = root.parent / "bin"
    if bin_dir.is_dir():  # a recording `docker` first on PATH, and every docker call through it
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["FORGE_ENGINE_API"] = "0"
    return subprocess.run(
        [sys.executable, "-m", "forgelib", command, "--project", str(root)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=root.parent,
    )


def test_the_base_project_is_valid(tmp_path: Path) -> None:
    out = validate(base_project(tmp_path / "p"))
    assert out.returncode == 0, out.stdout + out.stderr


# ------------------------------------------------------------------------------------------- the corpus


def _text(rel: str, text: str | bytes) -> Mutator:
    def mutate(root: Path) -> None:
        p = root / rel
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)

    return mutate


def _project(**changes: object) -> Mutator:
    return lambda root: write_project(root, **changes)


def _seed_path(path: str) -> Mutator:
    def mutate(root: Path) -> None:
        data = yaml.safe_load((root / "project.yaml").read_text())
        data["assets"]["seeds"]["base"]["path"] = path
        (root / "project.yaml").write_text(yaml.safe_dump(data))

    return mutate


def _outside_file(root: Path) -> Path:
    outside = root.parent / "outside.sql"
    outside.write_text(SQL)
    return outside


def _dotdot(root: Path) -> None:
    _outside_file(root)
    _seed_path("../outside.sql")(root)


def _absolute(root: Path) -> None:
    _seed_path(str(_outside_file(root)))(root)


def _symlinked_seed_file(root: Path) -> None:
    (root / "seeds" / "link.sql").symlink_to(_outside_file(root))
    _seed_path("seeds/link.sql")(root)


def _symlink_in_dir_seed(target: str) -> Mutator:
    def mutate(root: Path) -> None:
        secret = root.parent / "secret"
        secret.mkdir(exist_ok=True)
        (secret / "key").write_text("s3cret\n")
        (root / "seeds" / "tree" / "escape").symlink_to(target.format(secret=secret))
        # re-stamp, so the loader has to see the link itself, not just a stale digest
        with contextlib.suppress(Exception):
            write_project(root)

    return mutate


def _task(data: object) -> Mutator:
    return _text("tasks/t/task.yaml", yaml.safe_dump(data))


def _billion_laughs(levels: int = 6) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"name: *a{levels}")
    return "\n".join(lines) + "\n"


CORPUS: dict[str, tuple[Mutator, str]] = {
    # malformed YAML
    "unclosed-flow": (_text("project.yaml", "name: [unclosed\nassets: {\n"), "project.yaml"),
    "bad-indent": (_text("project.yaml", "name: x\n  assets:\n - y: [\n"), "project.yaml"),
    "tabs": (_text("project.yaml", "name: x\n\tassets: {}\n"), "project.yaml"),
    "not-utf8": (_text("project.yaml", b"name: \xff\xfe\x00bad\n"), "project.yaml"),
    "empty-file": (_text("project.yaml", ""), "project.yaml"),
    "a-list": (_text("project.yaml", "- 1\n- 2\n"), "project.yaml"),
    "a-scalar": (_text("project.yaml", "just text\n"), "project.yaml"),
    "duplicate-keys": (_text("project.yaml", "name: a\nname: b\n"), "project.yaml"),
    "billion-laughs": (_text("project.yaml", _billion_laughs()), "project.yaml"),
    "task-malformed": (_text("tasks/t/task.yaml", "oracle: {service: [\n"), "task.yaml"),
    "run-config-malformed": (_text("run_configs/dev.yaml", "repeats: [1\n"), "dev.yaml"),
    # wrong types
    "name-is-a-list": (_project(name=["a", "b"]), "name"),
    "seeds-a-list": (_project(assets={"seeds": ["base.sql"]}), "seeds"),
    "environment-a-string": (_project(default_environment="compose.yaml"), "default_environment"),
    "isolation-unknown": (
        _project(
            default_environment={
                "compose_file": "compose.yaml",
                "services": {"db": {"isolation": "sometimes"}},
            }
        ),
        "isolation",
    ),
    "oracle-timeout-text": (
        _task({"name": "t", "oracle": {"service": "files", "command": ["true"], "timeout": "soon"}}),
        "timeout",
    ),
    "oracle-command-a-string": (
        _task({"name": "t", "oracle": {"service": "files", "command": "rm -rf /"}}),
        "command",
    ),
    "repeats-negative": (_text("run_configs/dev.yaml", "project: ..\nrepeats: -1\n"), "repeats"),
    "workers-text": (_text("run_configs/dev.yaml", "project: ..\nworkers: many\n"), "workers"),
    # huge values
    "huge-name": (_project(name="x" * 200_000), "name"),
    "huge-repeats": (_text("run_configs/dev.yaml", f"project: ..\nrepeats: {10**40}\n"), "repeats"),
    "huge-timeout": (_text("run_configs/dev.yaml", "project: ..\ntimeouts: {oracle: 1e400}\n"), "timeout"),
    "huge-digest": (
        _project(
            assets={
                "seeds": {
                    "base": {
                        "path": "seeds/base.sql",
                        "kind": "sql_dump",
                        "digest": "sha256:" + "0" * 100_000,
                    }
                }
            }
        ),
        "digest",
    ),
    # paths leading out of the project
    "dotdot-seed": (_dotdot, "outside"),
    "absolute-seed": (_absolute, "outside"),
    "symlinked-seed-file": (_symlinked_seed_file, "link.sql"),
    "dir-seed-symlink-absolute": (_symlink_in_dir_seed("{secret}/key"), "escape"),
    "dir-seed-symlink-dotdot": (_symlink_in_dir_seed("../../../secret/key"), "escape"),
    "dir-seed-symlink-to-dir": (_symlink_in_dir_seed("{secret}"), "escape"),
    "compose-file-outside": (
        _project(default_environment={"compose_file": "../../../../etc/passwd", "services": {}}),
        "compose_file",
    ),
    "grading-outside": (_task({"name": "t", "grading": "/etc/passwd"}), "grading"),
    # names with shell metacharacters
    "project-name-shell": (_project(name="x; touch {marker}"), "name"),
    "task-name-shell": (_task({"name": "$(touch {marker})"}), "name"),
    "seed-name-shell": (
        lambda root: write_project(
            root,
            assets={"seeds": {"`touch {marker}`": {"path": "seeds/base.sql", "kind": "sql_dump"}}},
        ),
        "seed",
    ),
    "service-name-shell": (
        _project(
            default_environment={
                "compose_file": "compose.yaml",
                "services": {"db; touch {marker}": {"isolation": "reset", "reset": {"seed": "base"}}},
            }
        ),
        "touch",
    ),
}


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_hostile_spec_is_a_clean_error(case: str, tmp_path: Path) -> None:
    root = base_project(tmp_path / "p")
    marker = tmp_path / "pwned"
    mutate, expected = CORPUS[case]
    mutate(root)
    hostile_name = False
    for f in root.rglob("*.yaml"):  # substitute the marker path into names carrying shell metacharacters
        raw = f.read_bytes()
        if b"{marker}" in raw:
            f.write_bytes(raw.replace(b"{marker}", str(marker).encode()))
            hostile_name = True
    # A hostile name goes to `forge provision`, which does run commands (here a `docker` that records any
    # call): it must refuse the spec before building a single command from the name.
    calls = tmp_path / "docker-calls"
    if hostile_name:
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "docker").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
        (tmp_path / "bin" / "docker").chmod(0o755)
    command = "provision" if hostile_name else "validate"
    out = validate(root, timeout=20 if case == "billion-laughs" else 120, command=command)
    text = out.stdout + out.stderr
    assert out.returncode == 1, f"rc={out.returncode}\n{text[-3000:]}"
    assert "Traceback" not in text and "unexpected error" not in text, text[-3000:]
    assert expected in text, text[-3000:]
    assert len(text) < 20_000, f"{len(text)} characters of error output"  # a huge value is not echoed back
    assert not marker.exists(), "a name was run as a command"
    assert not calls.exists(), f"docker ran before the spec was refused: {calls.read_text()}"
