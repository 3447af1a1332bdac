"""The schemas themselves: valid Draft 2020-12 with $ids, strict about unknown keys, and a broken schema
reads as forgelib's bug, not the user's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from forgelib.errors import ForgeError
from forgelib.spec import schema
from forgelib.spec.schema import SCHEMAS, SchemaBug, SchemaSet, did_you_mean
from forgelib.spec.yamlpos import load_yaml


def _objects(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if node.get("type") == "object" or "properties" in node:
            yield node
        for v in node.values():
            yield from _objects(v)
    elif isinstance(node, list):
        for v in node:
            yield from _objects(v)


@pytest.mark.parametrize("name", SCHEMAS)
def test_schemas_are_valid_2020_12_with_ids_and_closed_objects(name: str) -> None:
    s = schema.schema(name)
    Draft202012Validator.check_schema(s)
    assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert s["$id"].endswith(f"/{name}.schema.json")
    for obj in _objects(s):
        if "properties" in obj:
            assert obj.get("additionalProperties") is False, obj


def test_did_you_mean() -> None:
    assert did_you_mean("digets", ["path", "kind", "digest"]) == "; did you mean 'digest'?"
    assert did_you_mean("zzz", ["path"]) == ""


def test_unknown_keys_each_get_their_own_issue_at_the_key() -> None:
    doc, _ = load_yaml(
        Path("t.yaml"), text="descripton: x\noracle:\n  service: s\n  comand: [a]\n  bogus: 1\n"
    )
    issues = schema.validate(doc, "task")
    assert [(i.line, i.col, i.json_path) for i in issues] == [
        (1, 1, "$.descripton"),
        (4, 3, "$.oracle.comand"),
        (5, 3, "$.oracle.bogus"),
    ]
    assert "did you mean 'command'" in issues[1].message
    assert "allowed here: service, command" in issues[2].message


def test_a_broken_schema_is_a_forgelib_bug(tmp_path: Path) -> None:
    for name in SCHEMAS:
        src = schema.schema(name)
        (tmp_path / f"{name}.schema.json").write_text(json.dumps(src))
    broken = json.loads((tmp_path / "task.schema.json").read_text())
    broken["properties"]["name"] = {"type": "strnig"}
    (tmp_path / "task.schema.json").write_text(json.dumps(broken))
    with pytest.raises(SchemaBug, match=r"task\.schema\.json is itself invalid at properties/name/type"):
        SchemaSet(tmp_path).schema("task")
    assert not issubclass(SchemaBug, ForgeError)  # so the CLI reports it as a bug (exit 3)


def test_a_dangling_ref_is_a_forgelib_bug(tmp_path: Path) -> None:
    for name in SCHEMAS:
        (tmp_path / f"{name}.schema.json").write_text(json.dumps(schema.schema(name)))
    broken = json.loads((tmp_path / "grading.schema.json").read_text())
    broken["properties"]["threshold"] = {"$ref": "#/$defs/nope"}
    (tmp_path / "grading.schema.json").write_text(json.dumps(broken))
    doc, _ = load_yaml(Path("g.yaml"), text="threshold: 1\nchecks: []\n")
    with pytest.raises(SchemaBug, match="does not resolve"):
        schema.validate(doc, "grading", SchemaSet(tmp_path))
