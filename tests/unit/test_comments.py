"""Comments say why, never timings: no measured figure in a forgelib comment or docstring.

A figure such as "~0.1 s" or "40 ms" in a comment is a measurement: it was true on one machine on one day,
goes stale without anyone noticing, and belongs in benchmarks/README.md, where it has a date and the
command that reproduces it. The comment says why the code is as it is ("a compose call starts a CLI and
loads the project; one docker call does not") and may point there.

Scanned: every ``#`` comment (``tokenize``) and every docstring (``ast``) under forgelib/. Code (string
literals that are messages, constants) is not scanned: a timeout's value lives in code, under a name.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

FORGELIB = Path(__file__).resolve().parents[2] / "forgelib"
# A number followed by a time unit: "0.1 s", "~2 ms", "25ms", "1-3 s" (hyphen or en dash), "≈ 1 s". A number
# glued to a letter or dot before it is not one ("1m30s", "v1.5s"); the allow-list below names the rest.
TIMING = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:\s?[-\u2013]\s?\d+(?:\.\d+)?)?\s?(?:ms|s)\b")
# (file relative to forgelib/, the exact text matched): documented behaviour, not a measurement.
ALLOWED: set[tuple[str, str]] = {
    # how compose spells Go durations, quoted as the input the parser accepts
    ("docker/compose.py", "1s"),
    ("docker/compose.py", "500ms"),
    # the kill grace forge passes to /usr/bin/timeout, quoted as the argv it builds
    ("inspect/environment.py", "5s"),
}


def _comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in ``source``; a docstring's lines numbered each."""
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                value = body[0].value
                if isinstance(value.value, str):
                    first = value.lineno
                    found += [(first + i, line) for i, line in enumerate(value.value.splitlines())]
    return found


def timing_figures(path: Path, rel: str) -> list[str]:
    """``rel:line: figure in text`` for each timing figure in ``path``'s comments and docstrings."""
    hits = []
    for line, text in _comments_and_docstrings(path.read_text(encoding="utf-8")):
        for m in TIMING.finditer(text):
            if (rel, m.group(0)) not in ALLOWED:
                hits.append(f"forgelib/{rel}:{line}: {m.group(0)!r} in {text.strip()!r}")
    return hits


def test_no_timing_figures_in_forgelib_comments() -> None:
    hits = [
        hit
        for path in sorted(FORGELIB.rglob("*.py"))
        for hit in timing_figures(path, path.relative_to(FORGELIB).as_posix())
    ]
    assert not hits, (
        "timing figures in forgelib comments/docstrings (say why instead; measurements go in "
        "benchmarks/README.md with their date and command):\n" + "\n".join(hits)
    )


def test_the_scan_finds_a_figure_in_a_comment_and_a_docstring(tmp_path: Path) -> None:
    """The check above can fail: figures in both places are found, with their lines; code is not scanned."""
    src = tmp_path / "m.py"
    src.write_text(
        'def f():\n    """Fast: ~0.1 s a call."""\n    x = "takes 5 s"  # compose costs 0.2-0.3 s here\n',
        encoding="utf-8",
    )
    assert [h.split(" in ")[0] for h in timing_figures(src, "m.py")] == [
        "forgelib/m.py:3: '0.2-0.3 s'",
        "forgelib/m.py:2: '0.1 s'",
    ]
