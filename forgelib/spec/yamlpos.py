"""YAML loading that remembers where every value came from, so each problem can say ``file:line:col``.

Scalars resolve by the YAML 1.2 core schema (what docker compose's parser uses), not PyYAML's 1.1 one:
``on``/``yes`` stay strings, ``22:22`` is not sexagesimal 1342, ``2024-01-01`` is not a date, ``017`` is
seventeen. Mapping keys are always strings, so JSON Schema sees JSON-shaped data.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from forgelib.errors import SpecIssue

JsonPath = tuple[str | int, ...]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def json_path(path: JsonPath) -> str:
    """``("assets", "seeds", "x", 0)`` -> ``$.assets.seeds.x[0]`` (odd keys bracketed: ``$["a.b"]``)."""
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.match(part):
            out += f".{part}"
        else:
            escaped = part.replace("\\", "\\\\").replace('"', '\\"')
            out += f'["{escaped}"]'
    return out


def clip(value: Any, limit: int = 80, *, quote: bool = True) -> str:
    """``repr(value)`` (or ``str`` without ``quote``), cut to ``limit`` characters: messages never echo a huge
    value back."""
    text = repr(value) if quote else str(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} characters)"


def display_path(path: Path) -> str:
    """Relative to the working directory when under it (short, clickable), absolute otherwise."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema implicit resolvers."""


_Loader.yaml_implicit_resolvers = {}
_RESOLVERS: list[tuple[str, str, str]] = [
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", "~nN"),
    ("tag:yaml.org,2002:merge", r"^(?:<<)$", "<"),
]
for _tag, _pattern, _first in _RESOLVERS:
    _Loader.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))
# The empty plain scalar resolves through the "" first-character slot.
_Loader.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^$"), [""])


def _scalar(tag: str, text: str) -> Any:
    if tag == "tag:yaml.org,2002:null":
        return None
    if tag == "tag:yaml.org,2002:bool":
        return text.lower() == "true"
    if tag == "tag:yaml.org,2002:int":
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        if digits.startswith("0o"):
            return sign * int(digits[2:], 8)
        if digits.startswith("0x"):
            return sign * int(digits[2:], 16)
        return sign * int(digits, 10)
    if tag == "tag:yaml.org,2002:float":
        low = text.lower()
        if low.endswith("nan"):
            return float("nan")
        if low.endswith("inf"):
            return float("-inf") if low.startswith("-") else float("inf")
        return float(text)
    # str, and any custom tag (compose's !reset/!override): the text as written.
    return text


@dataclass(frozen=True)
class Mark:
    line: int  # 1-based
    col: int  # 1-based


@dataclass
class YamlDoc:
    """A parsed YAML file: plain data plus the position of every key and value by JSON path."""

    file: Path
    data: Any
    values: dict[JsonPath, Mark] = field(default_factory=dict)
    keys: dict[JsonPath, Mark] = field(default_factory=dict)

    @property
    def display(self) -> str:
        return display_path(self.file)

    def mark(self, path: JsonPath, *, key: bool = False) -> Mark | None:
        """Where ``path`` is (its key when ``key``); the nearest ancestor's position when it is absent."""
        table = self.keys if key else self.values
        if path in table:
            return table[path]
        for cut in range(len(path) - 1, -1, -1):
            if path[:cut] in self.values:
                return self.values[path[:cut]]
        return None

    def issue(self, path: JsonPath, message: str, *, key: bool = False) -> SpecIssue:
        m = self.mark(path, key=key)
        return SpecIssue(self.display, m.line if m else None, m.col if m else None, json_path(path), message)

    def get(self, path: JsonPath, default: Any = None) -> Any:
        node = self.data
        for part in path:
            if isinstance(part, int):
                if not isinstance(node, list) or part >= len(node):
                    return default
            elif not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


class _TooBig(Exception):
    pass


def _distinct_nodes(node: yaml.Node) -> int:
    seen: set[int] = set()
    pending = [node]
    while pending:
        n = pending.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.SequenceNode):
            pending.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            pending.extend(x for pair in n.value for x in pair)
    return len(seen)


class _Builder:
    def __init__(self, doc: YamlDoc, budget: int) -> None:
        self.doc = doc
        self.issues: list[SpecIssue] = []
        self._stack: set[int] = set()
        # Aliases may repeat content, but not explode it ("billion laughs"): cap the values built.
        self._budget = budget

    def _mark(self, node: yaml.Node) -> Mark:
        return Mark(node.start_mark.line + 1, node.start_mark.column + 1)

    def build(self, node: yaml.Node, path: JsonPath) -> Any:
        self._budget -= 1
        if self._budget < 0:
            raise _TooBig
        self.doc.values.setdefault(path, self._mark(node))
        if isinstance(node, yaml.ScalarNode):
            return _scalar(node.tag, node.value)
        if id(node) in self._stack:
            self.issues.append(self.doc.issue(path, "an alias refers to its own ancestor (recursive YAML)"))
            return None
        self._stack.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
            assert isinstance(node, yaml.MappingNode)
            return self._mapping(node, path)
        finally:
            self._stack.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: JsonPath) -> dict[str, Any]:
        out: dict[str, Any] = {}
        merges: list[yaml.Node] = []
        for knode, vnode in node.value:
            if knode.tag == "tag:yaml.org,2002:merge":
                merges.append(vnode)
                continue
            if not isinstance(knode, yaml.ScalarNode):
                at = Mark(knode.start_mark.line + 1, knode.start_mark.column + 1)
                self.issues.append(
                    SpecIssue(
                        self.doc.display, at.line, at.col, json_path(path), "keys must be plain scalars"
                    )
                )
                continue
            raw = _scalar(knode.tag, knode.value)
            key = "null" if raw is None else str(raw).lower() if isinstance(raw, bool) else str(raw)
            kpath = (*path, key)
            if key in out:
                first = self.doc.keys[kpath]
                self.issues.append(
                    SpecIssue(
                        self.doc.display,
                        knode.start_mark.line + 1,
                        knode.start_mark.column + 1,
                        json_path(kpath),
                        f"duplicate key {key!r} (first at line {first.line}); remove one of them",
                    )
                )
                continue
            self.doc.keys.setdefault(kpath, self._mark(knode))
            out[key] = self.build(vnode, kpath)
        if not merges:
            return out
        # Explicit keys win over merged ones (YAML merge-key semantics); built after them so the positions
        # recorded are the explicit ones.
        merged: dict[str, Any] = {}
        for vnode in reversed(merges):
            merged.update(self._merge_sources(vnode, path))
        return {**merged, **out}

    def _merge_sources(self, vnode: yaml.Node, path: JsonPath) -> dict[str, Any]:
        sources = vnode.value if isinstance(vnode, yaml.SequenceNode) else [vnode]
        merged: dict[str, Any] = {}
        # Earlier sources win, so apply them last.
        for src in reversed(sources):
            if not isinstance(src, yaml.MappingNode):
                self.issues.append(self.doc.issue(path, "a merge key (<<) must refer to a mapping"))
                continue
            value = self.build(src, path)
            if isinstance(value, dict):
                merged.update(value)
        return merged


def load_yaml(path: Path, *, text: str | None = None) -> tuple[YamlDoc, list[SpecIssue]]:
    """Parse one YAML file. Problems (unreadable, malformed, duplicate keys) come back as issues.

    An empty document loads as ``None``; the schema then says what belongs there.
    """
    doc = YamlDoc(path, None)
    if text is None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return doc, [SpecIssue(doc.display, None, None, "$", "file not found")]
        except (OSError, UnicodeDecodeError) as e:
            return doc, [SpecIssue(doc.display, None, None, "$", f"cannot read the file: {e}")]
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as e:
        m = e.problem_mark or e.context_mark
        what = e.problem or e.context or "cannot parse"
        if e.context and e.problem:
            at = f" at line {e.context_mark.line + 1}" if e.context_mark else ""
            what = f"{e.problem} ({e.context}{at})"
        return doc, [
            SpecIssue(
                doc.display,
                m.line + 1 if m else None,
                m.column + 1 if m else None,
                "$",
                f"invalid YAML: {what}",
            )
        ]
    except yaml.YAMLError as e:
        return doc, [SpecIssue(doc.display, None, None, "$", f"invalid YAML: {e}")]
    finally:
        loader.dispose()
    if node is None:
        return doc, []
    builder = _Builder(doc, budget=10 * _distinct_nodes(node) + 10_000)
    try:
        doc.data = builder.build(node, ())
    except _TooBig:
        doc.data = None
        doc.values.clear()
        doc.keys.clear()
        return doc, [
            SpecIssue(
                doc.display,
                None,
                None,
                "$",
                "aliases (*name) expand to far more values than the file holds; write the values out instead",
            )
        ]
    return doc, builder.issues


def walk(data: Any, path: JsonPath = ()) -> Iterator[tuple[JsonPath, Any]]:
    """Every (path, value) in ``data``, parents before children."""
    yield path, data
    if isinstance(data, dict):
        for k, v in data.items():
            yield from walk(v, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from walk(v, (*path, i))
