"""forgelib's floors, bottom up: a module never imports one of a higher floor (docs/design.md, "Layers").

Read statically (ast), with the import-cycle test's rules (tests/unit/test_import_cycles.py): imports inside
functions count, imports under ``if TYPE_CHECKING:`` do not. A module's floor is that of the longest entry
of ``LAYERS`` naming it or a package above it; a kind's package ``__init__`` (``forgelib.kinds.<kind>``)
is a declaration and sits on the ground floor, its implementation modules on the kinds' floor.
"""

from __future__ import annotations

import ast
from pathlib import Path

from unit.test_import_cycles import _imports, _known, modules

# Floors, bottom up; entries are modules or packages relative to ``forgelib`` ("" is the package itself).
Layers = tuple[tuple[str, tuple[str, ...]], ...]

LAYERS: Layers = (
    (
        "base",
        (
            "",  # forgelib/__init__.py: the version
            "errors",
            "runner",
            "engineapi",  # the runner's fast path: the runner consults it
            "table",
            "resources",
            "clients",
            "testing",
            "spec",  # the spec's models, schema and files: what every floor reads
            "docker.resolved",  # the typed `docker compose config`: a pure model
            "kinds",  # the kinds' declarations: the KINDS list and each package's __init__ (Kind)
            "kinds.kind",
            "kinds.toolschema",
            "mcp.names",  # the MCP tool list, derived from the kinds' declarations
        ),
    ),
    ("docker", ("docker",)),
    (
        "kinds",
        (
            "kinds.registry",
            "kinds.base",
            "kinds.datadir",
            "kinds.supervisor",
            "kinds.checkpointcopy",
            "kinds.*",  # each kind's implementation modules (seed, check, tool, client, rules)
            # the spec's checks against the kinds (which service is of which kind, its ports)
            "spec.rules",
            "spec.ports",
            "spec.loader",
            "spec.validate",
            "spec.stamp",
        ),
    ),
    ("stacks", ("stacks",)),
    ("grading, mcp", ("grading", "mcp")),
    ("run", ("run",)),
    ("report", ("report",)),
    (
        "front ends",
        ("cli", "pytest_plugin", "inspect", "harbor", "cluster", "scaffold", "docsgen", "__main__"),
    ),
)

# Imports allowed to point up, each with why: at most one (issue 37).
ALLOWED: frozenset[tuple[str, str]] = frozenset()


def floor(module: str, known: dict[str, Path], layers: Layers = LAYERS) -> int:
    """The index in ``layers`` of ``module``'s floor (``forgelib.x.y``, or ``pkg.x.y`` in the tests)."""
    rel = module.partition(".")[2]
    parts = rel.split(".") if rel else []
    key: str | None = None
    if parts[:1] == ["kinds"] and len(parts) == 2 and known[module].name == "__init__.py":
        key = "kinds"  # a kind's package __init__: its declaration
    elif parts[:1] == ["kinds"] and len(parts) >= 3:
        key = "kinds.*"  # a module inside a kind's package
    best: tuple[int, int] | None = None  # (length of the entry, floor)
    for index, (_, entries) in enumerate(layers):
        for entry in entries:
            if key is not None:
                named = entry == key
            else:
                named = entry == rel or (entry != "" and rel.startswith(entry + "."))
            if named and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    if best is None:
        raise AssertionError(f"{module}: no floor in LAYERS; add it to tests/unit/test_layers.py")
    return best[1]


def upward(known: dict[str, Path], layers: Layers = LAYERS) -> list[tuple[str, int, str, str]]:
    """(file, line, importer, imported) of every import of a module on a higher floor."""
    found: list[tuple[str, int, str, str]] = []
    for name, path in known.items():
        here = floor(name, known, layers)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [_known(alias.name, known) for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else _known(base, known)
                    for alias in node.names
                ]
            for target in targets:
                if target is None or target == name or name.startswith(target + "."):
                    continue  # itself, or its own parent package
                if floor(target, known, layers) > here:
                    found.append((str(path), node.lineno, name, target))
    return sorted(found)


def test_no_module_imports_a_higher_floor() -> None:
    known = modules()
    bad = [f"{f}:{line}: {a} imports {b}" for f, line, a, b in upward(known) if (a, b) not in ALLOWED]
    names = [n for n, _ in LAYERS]
    assert not bad, "imports up the floors (" + " < ".join(names) + "):\n" + "\n".join(bad)
    assert len(ALLOWED) <= 1, "at most one import may point up the tree (docs/design.md says which)"


def test_every_module_has_a_floor() -> None:
    known = modules()
    for name in known:
        floor(name, known)  # raises naming the module


# The checker itself, on a small package written here: a checker that never finds anything would pass above.


def test_an_upward_import_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    files = {
        "__init__.py": "",
        "low.py": "import os\n\n\ndef f():\n    from pkg.high import x\n",  # deferred: still an edge
        "high.py": "from pkg import low\nx = 1\n",  # downward: fine
        "kinds/__init__.py": "from pkg.kinds import a\n",
        "kinds/a/__init__.py": "from pkg import low\n",  # a declaration on the ground floor
        "kinds/a/seed.py": "from pkg.kinds import a\nfrom pkg import high\n",  # a kind's module: up
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    layers = (("base", ("", "low", "kinds")), ("kinds", ("kinds.*",)), ("top", ("high",)))
    known = modules(root)
    assert floor("pkg.kinds.a", known, layers) == 0 and floor("pkg.kinds.a.seed", known, layers) == 1
    found = [(Path(f).relative_to(root).as_posix(), line, a, b) for f, line, a, b in upward(known, layers)]
    assert found == [
        ("kinds/a/seed.py", 2, "pkg.kinds.a.seed", "pkg.high"),
        ("low.py", 5, "pkg.low", "pkg.high"),
    ]
