"""docs/ as the code generates it: a command, option, schema field or lifecycle step changed without
`nox -s docs` fails here (and in `nox -s lint`)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource

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
    assert [code for code, _ in docsgen.exit_codes()] == [0, 1, 2, 3, 130, 141]


def test_the_spec_reference_shows_every_constraint_as_yaml_writes_it() -> None:
    text = docsgen.spec_doc()
    assert "Type: string (length ≤ `100`, matches `^[A-Za-z0-9][A-Za-z0-9_.-]*$`)." in text  # name
    assert "| `ok` | `true` \\| `false` \\| `any` |" in text
    assert "`True`" not in text and "`False`" not in text
    assert "keys: [name](#name)" in text  # a map's keys follow the name pattern
    assert "each: matches `^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`" in text  # run config profiles


SCHEMAS = DOCS.parent / "schemas"


def test_the_committed_grading_schema_defines_each_kinds_check_as_the_kind_declares() -> None:
    text = (SCHEMAS / "grading.schema.json").read_text()
    assert docsgen.check_fields_text(text) == text, "run `nox -s docs` (python -m forgelib.docsgen)"
    assert docsgen.check_types_drift(text) == []


def test_a_new_kinds_check_type_is_written_into_the_grading_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    import forgelib.kinds
    from forgelib.kinds import toolschema as ts

    mongo = ts.check({"service": {"type": "string"}, "find": {"type": "object"}}, ["service", "find"])
    monkeypatch.setattr(forgelib.kinds, "CHECK_FIELDS", {**forgelib.kinds.CHECK_FIELDS, "mongo": mongo})
    before = (SCHEMAS / "grading.schema.json").read_text()
    after = json.loads(docsgen.check_fields_text(before))
    assert after["$defs"]["mongo"] == mongo
    assert after["$defs"]["check"]["properties"]["mongo"] == {"$ref": "#/$defs/mongo"}
    # everything else as it was
    del after["$defs"]["mongo"], after["$defs"]["check"]["properties"]["mongo"]
    assert after == json.loads(before)
    # a check of the new type now validates against the written schema, its fields enforced
    schema = json.loads(docsgen.check_fields_text(before))
    check = {"name": "found", "mongo": {"service": "db", "find": {}, "contains": "x"}}
    defs_only = {"$defs": schema["$defs"], "$ref": "#/$defs/check"}
    registry = Registry().with_resource(
        "project.schema.json",
        Resource.from_contents(json.loads((SCHEMAS / "project.schema.json").read_text())),
    )
    jsonschema.Draft202012Validator(defs_only, registry=registry).validate(check)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(defs_only, registry=registry).validate(
            {"name": "found", "mongo": {"service": "db"}}
        )


def test_the_committed_schemas_list_the_kinds_names() -> None:
    """Seed kinds, reset strategies and tools in the schemas are the kinds' (``Kind.seeds``,
    ``Kind.strategies``, ``Kind.tools``), and the spec's enums are built from the same lists."""
    from forgelib.kinds import RESET_STRATEGIES
    from forgelib.spec.models import ResetStrategy

    for name, text in docsgen.schemas_text(SCHEMAS).items():
        assert (SCHEMAS / f"{name}.schema.json").read_text() == text, f"run `nox -s docs`: {name}"
    assert [s.value for s in ResetStrategy] == list(RESET_STRATEGIES) == ["exact", "restart", "template"]
