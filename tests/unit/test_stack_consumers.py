"""Every consumer of a stack takes the one ``Stack`` (issue 37): no raw compose config above the stacks.

Read statically (ast), like test_backend_construction.py: a function in a package above ``forgelib/stacks/``
(grading, the MCP server, the orchestrator, the front ends) that takes the compose config as a raw mapping
(a parameter named ``config`` or ``compose`` annotated ``Mapping[str, Any]``, ``dict[str, Any]`` or the
like) fails here, named by file:line. It takes the ``Stack`` instead, or what the stack carries of it:
``Stack.resolved`` (the typed ``ResolvedConfig``), ``Stack.service(name)``, ``Stack.kind(name)``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import forgelib

PACKAGE = Path(forgelib.__file__).parent
# Above the stack layer (tests/unit/test_layers.py): what a stack is handed to.
CONSUMERS = ("grading", "mcp", "run", "report", "inspect", "pytest_plugin", "harbor", "cli", "cluster")
NAMES = frozenset({"config", "compose"})
# Functions whose ``config`` is another thing's, each with what it is.
NOT_COMPOSE = {
    ("inspect/environment.py", "config_deserialize"): "inspect_ai's sandbox hook: the sandbox's config",
}
RAW = re.compile(r"^(typing\.)?(Mapping|MutableMapping|dict|Dict)\[str, *Any\]( *\| *None)?$")


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else [])]


def raw_config_parameters(package: Path = PACKAGE, consumers: tuple[str, ...] = CONSUMERS) -> list[str]:
    """file:line of every function parameter of ``consumers`` that takes the compose config raw."""
    found: list[tuple[str, int, str]] = []
    for sub in consumers:
        for path in sorted((package / sub).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for arg in _parameters(node):
                    shown = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                    rel = path.relative_to(package).as_posix()
                    if arg.arg in NAMES and RAW.match(shown) and (rel, node.name) not in NOT_COMPOSE:
                        where = str(path.relative_to(package.parent))
                        found.append((where, arg.lineno, f"{node.name}({arg.arg}: {shown})"))
    return [f"{file}:{line}: {what}" for file, line, what in sorted(found)]


def test_no_consumer_above_the_stacks_takes_the_raw_compose_config() -> None:
    found = raw_config_parameters()
    assert not found, (
        "raw compose config taken above forgelib/stacks/ (take the Stack, or Stack.resolved):\n  "
        + "\n  ".join(found)
    )


# The checker itself, on a small package written here: a checker that never finds anything would pass above.


def test_a_raw_config_parameter_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    files = {
        "__init__.py": "",
        "grading/__init__.py": "",
        "grading/checks.py": (
            "from typing import Any, Mapping\n"
            "def evaluate(stack, check, config: Mapping[str, Any], *, timeout: float): ...\n"
            "def fine(stack, resolved: 'ResolvedConfig', config: str, compose: 'ComposeProject'): ...\n"
        ),
        "run/__init__.py": "",
        "run/manifest.py": "class B:\n    async def build(self, *, compose: dict[str, Any] | None): ...\n",
        "stacks/stack.py": "def below(config: Mapping[str, Any]): ...\n",  # the stack layer owns it
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    found = [line.removeprefix("pkg/") for line in raw_config_parameters(root, ("grading", "run"))]
    assert found == [
        "grading/checks.py:2: evaluate(config: Mapping[str, Any])",
        "run/manifest.py:2: build(compose: dict[str, Any] | None)",
    ]
