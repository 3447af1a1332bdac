"""No import cycles in forgelib: read statically (ast), so a cycle fails here whichever module imports first.

What counts as an edge A -> B: every ``import``/``from ... import`` in A that names a forgelib module B,
at module level *and inside functions* — a deferred import still means A cannot work without B, so the
two are coupled whatever the order Python happens to load them in. Left out: imports under ``if
TYPE_CHECKING:`` (annotations only, never executed) and the implicit import of a module's parent
package (a package's ``__init__`` importing its own submodules is the normal layout, not a cycle).
``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import forgelib

PACKAGE = Path(forgelib.__file__).parent


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package."""
    out: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)  # the `else:` of `if TYPE_CHECKING:` does run
        else:
            stack.extend(ast.iter_child_nodes(node))


def _known(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a forgelib module (``forgelib.x.Y`` -> ``forgelib.x``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [_known(alias.name, known) for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from .x import y
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else _known(base, known)
                    for alias in node.names
                ]
            edges.update(t for t in targets if t is not None and t != name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (modules in import order, the first repeated at the end) per tangle."""
    return [_a_cycle(graph, tangle) for tangle in tangles(graph)]


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative): every
    module of one imports every other, directly or not."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return components


def _a_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest cycle through the component's first module (breadth-first inside the component)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")  # a component always has one


def describe(graph: dict[str, set[str]]) -> str:
    """Each tangle's shortest cycle through its first module, and its other modules when there are more."""
    lines = []
    for tangle, cycle in zip(tangles(graph), cycles(graph), strict=True):
        others = sorted(tangle - set(cycle))
        lines.append(" -> ".join(cycle) + (f"  (tangled with: {', '.join(others)})" if others else ""))
    return "\n".join(lines)


def test_forgelib_has_no_import_cycles() -> None:
    graph = import_graph(modules())
    assert not tangles(graph), f"import cycles in forgelib (modules in import order):\n{describe(graph)}"


# The checker itself, on small packages written here: a checker that never finds anything would pass above.


def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules(root)


def test_a_cycle_is_named_in_import_order(tmp_path: Path) -> None:
    known = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import thing\n",
            "b.py": "import pkg.sub.c\n",
            "sub/__init__.py": "",
            "sub/c.py": "def f():\n    from .. import a\n",  # deferred and relative: still an edge
            "d.py": "import pkg.a\n",  # imports into the cycle, is not part of it
        },
    )
    graph = import_graph(known)
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    assert describe(graph) == "pkg.a -> pkg.b -> pkg.sub.c -> pkg.a"


def test_a_tangle_bigger_than_its_cycle_names_the_rest(tmp_path: Path) -> None:
    known = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "import pkg.b\nimport pkg.c\n",
            "b.py": "import pkg.a\n",
            "c.py": "import pkg.a\n",
        },
    )
    assert describe(import_graph(known)) == "pkg.a -> pkg.b -> pkg.a  (tangled with: pkg.c)"


def test_type_checking_imports_and_parent_packages_are_not_edges(tmp_path: Path) -> None:
    known = _package(
        tmp_path,
        {
            "__init__.py": "from pkg.a import x\n",  # a package importing its own module
            "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import y\nx = 1\n",
            "b.py": "from pkg.a import x\n",
        },
    )
    graph = import_graph(known)
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": set(), "pkg.b": {"pkg.a"}}
    assert cycles(graph) == []
