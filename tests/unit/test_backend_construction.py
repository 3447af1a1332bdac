"""One way to open stacks: only ``forgelib/stacks/`` builds what hands out stacks.

Read statically (ast), like test_docker_argv.py: a call of any of ``BUILDERS`` — a backend, a stack
source, a warm pool, the shared stacks, a provisioning context, a memory budget, the engine's start slots
or memory ledger — anywhere in forgelib outside ``forgelib/stacks/`` fails here, named by file:line.
Every front end gets them from ``forgelib.stacks.open``, which gives them the same budget, start bound
and live-stack registry. (``forgelib/stacks/warm/`` builds none of them: its pool is handed its context.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import forgelib

PACKAGE = Path(forgelib.__file__).parent
OWNER = PACKAGE / "stacks"
BUILDERS = frozenset(
    {
        "DockerBackend",
        "FreshSource",
        "SharedSource",
        "WarmSource",
        "WarmPool",
        "SharedStacks",
        "StackContext",
        "Admission",
        "StartSlots",
        "MemoryLedger",
    }
)


def _called(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def backend_constructions(package: Path = PACKAGE, owner: Path = OWNER) -> list[str]:
    """file:line (and what) of every call of a ``BUILDERS`` name outside ``owner``."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(package.rglob("*.py")):
        if path.is_relative_to(owner):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Call) and _called(node) in BUILDERS:
                found.append((str(path.relative_to(package.parent)), node.lineno, str(_called(node))))
    return [f"{file}:{line}: {name}(" for file, line, name in sorted(found)]


def test_no_backend_is_built_outside_the_stacks_package() -> None:
    found = backend_constructions()
    assert not found, "stacks built outside forgelib/stacks/ (use forgelib.stacks.open):\n  " + "\n  ".join(
        found
    )


def test_the_scan_finds_a_construction(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "stacks").mkdir(parents=True)
    (pkg / "stacks" / "ok.py").write_text("b = DockerBackend(ctx)\n")
    (pkg / "fine.py").write_text("from x import WarmPool\nWarmPool.close\nname = 'DockerBackend('\n")
    (pkg / "bad.py").write_text(
        "import x\n\nb = x.DockerBackend(\n    ctx,\n)\np = WarmPool(ctx, workers=1_000)\n"
    )
    assert backend_constructions(pkg, pkg / "stacks") == [
        "pkg/bad.py:3: DockerBackend(",
        "pkg/bad.py:6: WarmPool(",
    ]
