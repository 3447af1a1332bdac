"""docs/ as the code generates it: a command, option, schema field or lifecycle step changed without
`nox -s docs` fails here (and in `nox -s lint`)."""

from __future__ import annotations

from pathlib import Path

from forgelib import docsgen
from forgelib.run import lifecycle as lc

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_committed_docs_are_what_the_code_generates() -> None:
    assert docsgen.stale(DOCS) == [], "run `nox -s docs` (python -m forgelib.docsgen) and commit docs/"


def test_the_check_names_a_stale_file_and_fails(tmp_path: Path) -> None:
    for name, text in docsgen.generate().items():
        (tmp_path / name).write_text(text)
    assert docsgen.stale(tmp_path) == []
    (tmp_path / "commands.md").write_text("edited by hand\n")
    (tmp_path / "spec.md").unlink()
    assert docsgen.stale(tmp_path) == ["commands.md", "spec.md"]


def test_the_state_chart_comes_from_advance() -> None:
    edges = docsgen.lifecycle_edges()
    assert edges[(lc.Phase.PROVISIONING, lc.Phase.SOLVE)] == {"ok"}
    assert "timed_out" in edges[(lc.Phase.SOLVE, lc.Phase.CAPTURE_LOGS)]
    assert (lc.Phase.TEARDOWN, lc.Phase.PROVISIONING) in edges  # a retry on a fresh stack
    assert (lc.Phase.SOLVE, lc.Phase.TEARDOWN) not in edges  # evidence is recorded before any teardown


def test_every_command_and_exit_code_is_in_the_reference() -> None:
    from forgelib.cli.tasks import ns

    text = docsgen.commands_doc()
    assert all(f"## `forge {name}`" in text for name in ns.tasks)
    assert [code for code, _ in docsgen.exit_codes()] == [0, 1, 2, 3, 130]
