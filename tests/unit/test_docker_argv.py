"""One owner of docker argv: ``forgelib/docker/argv.py`` spells every ``docker …`` argv, nothing else does.

Read statically (ast), like test_import_cycles.py: a list or tuple literal whose first item is the string
``"docker"`` anywhere in forgelib but the builder module fails here, named by file:line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import forgelib
from forgelib.docker import argv as dk

PACKAGE = Path(forgelib.__file__).parent
OWNER = PACKAGE / "docker" / "argv.py"


def raw_docker_argv(package: Path = PACKAGE) -> list[str]:
    """file:line of every ``["docker", ...]`` / ``("docker", ...)`` literal outside the builder module."""
    found: list[tuple[str, int]] = []
    for path in sorted(package.rglob("*.py")):
        if path == OWNER:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.List | ast.Tuple) and node.elts:
                first = node.elts[0]
                if isinstance(first, ast.Constant) and first.value == "docker":
                    found.append((str(path.relative_to(package.parent)), node.lineno))
    return [f"{file}:{line}" for file, line in sorted(found)]


def test_no_docker_argv_outside_the_builders() -> None:
    found = raw_docker_argv()
    assert not found, "docker argv spelled outside forgelib/docker/argv.py:\n  " + "\n  ".join(found)


def test_the_scan_finds_a_raw_argv(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "ok.py").write_text('x = ["compose", "docker"]\n')
    (pkg / "bad.py").write_text('import x\n\nx.run(\n    ["docker", "ps", *x.f],\n)\ny = ("docker",)\n')
    assert raw_docker_argv(pkg) == ["pkg/bad.py:4", "pkg/bad.py:6"]


def test_builders_keep_the_cli_order_and_spellings() -> None:
    f = ["--filter", "label=a=1"]
    assert dk.ps(all=True, quiet=True, no_trunc=True, filters=f) == [
        "docker", "ps", "--all", "--quiet", "--no-trunc", "--filter", "label=a=1",
    ]  # fmt: skip
    assert dk.ps(all=True, no_trunc=True, filters=f, format="{{.ID}}") == [
        "docker", "ps", "--all", "--no-trunc", "--filter", "label=a=1", "--format", "{{.ID}}",
    ]  # fmt: skip
    assert dk.ls("image", format="F", filter=["reference=a", "reference=b"]) == [
        "docker", "image", "ls", "--format", "F", "--filter", "reference=a", "--filter", "reference=b",
    ]  # fmt: skip
    assert dk.rm(["c1"], force=True, volumes=True) == ["docker", "rm", "--force", "--volumes", "c1"]
    assert dk.rm(["i1"], kind="image", force=False) == ["docker", "image", "rm", "i1"]
    assert dk.inspect(["n"], kind="network") == ["docker", "network", "inspect", "n"]
    assert dk.exec("c", ["sh"], interactive=True, env={"A": "1"}, user="u") == [
        "docker", "exec", "-i", "--env", "A=1", "--user", "u", "c", "sh",
    ]  # fmt: skip
    assert dk.exec("c", ["sh"], interactive=True, tty=True) == ["docker", "exec", "-it", "c", "sh"]
    assert dk.exec("c", ["true"]) == ["docker", "exec", "c", "true"]
    assert dk.pull("img", quiet=True) == ["docker", "pull", "--quiet", "img"]
    assert dk.logs("c", tail=None) == ["docker", "logs", "c"]
    assert dk.compose("version", "--short") == ["docker", "compose", "version", "--short"]


def test_cp_names_source_then_destination() -> None:
    assert dk.cp("/host/dir/.", "c1:/work") == ["docker", "cp", "/host/dir/.", "c1:/work"]
