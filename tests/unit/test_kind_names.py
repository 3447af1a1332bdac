"""One owner of each kind's knowledge: no string constant in forgelib names a kind outside
``forgelib/kinds/`` (its packages and the registry).

Read statically (ast), like test_docker_argv.py. What counts: every string constant (f-string parts
included) that is not a docstring (the first statement of a module, class or function) and not an
entry of ``__all__`` (those are Python names, not data). Comments are not constants, so they never
count. A constant counts when it holds one of ``WORDS`` as a word (case-insensitive; ``_``, ``-`` and
``.`` join words, so ``sql_dump`` is one word and ``"sql"`` does not match inside it). It fails with
file:line of each.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import forgelib

PACKAGE = Path(forgelib.__file__).parent
OWNER = PACKAGE / "kinds"

WORDS = (
    "postgres",
    "postgresql",
    "postgis",
    "psql",
    "pg_dump",
    "pg_restore",
    "psycopg",
    "redis",
    "valkey",
    "redis-cli",
    "redis-server",
    "valkey-server",
    "sql",
    "sql_dump",
    "redis_dump",
    "filesystem_dir",
    "sql_query",
    "redis_command",
    "rdb",
)
_PATTERN = re.compile(
    r"(?<![\w.-])(" + "|".join(map(re.escape, sorted(WORDS, key=len, reverse=True))) + r")(?![\w-])", re.I
)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _all_entries(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                out.update(id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant))
    return out


def kind_names(package: Path = PACKAGE, owner: Path = OWNER) -> list[str]:
    """file:line: text of every string constant naming a kind outside ``owner``."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(package.rglob("*.py")):
        if path.is_relative_to(owner):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skip = _docstrings(tree) | _all_entries(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                m = _PATTERN.search(node.value)
                if m:
                    found.append((str(path.relative_to(package.parent)), node.lineno, m[0]))
    return [f"{file}:{line}: {word!r}" for file, line, word in sorted(found)]


def test_no_kind_is_named_outside_the_kinds() -> None:
    found = kind_names()
    assert not found, (
        "a kind named outside forgelib/kinds/ (move the knowledge into the kind):\n  " + "\n  ".join(found)
    )


def test_the_scan_finds_a_kind_name_and_skips_docstrings_and_all(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "kinds").mkdir(parents=True)
    (pkg / "a.py").write_text(
        '"""Talks to postgres."""\n'
        '__all__ = ["redis"]\n'
        "def f(kind):\n"
        '    """About redis_dump."""\n'
        '    if kind == "postgres":  # a comment about psql\n'
        '        return ["redis-cli", "--raw"]\n'
        '    return f"an {kind} sql check"\n'
        'SAFE = ("sqlite", "my_sql_thing", "results")\n'
    )
    (pkg / "kinds" / "k.py").write_text('NAME = "postgres"\n')
    assert kind_names(pkg, pkg / "kinds") == [
        "pkg/a.py:5: 'postgres'",
        "pkg/a.py:6: 'redis-cli'",
        "pkg/a.py:7: 'sql'",
    ]
