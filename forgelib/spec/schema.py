"""JSON Schema validation of spec files: every error becomes a located ``SpecIssue`` that names the fix.

The schemas in ``schemas/`` are checked themselves before anything is validated against them, so a broken
schema surfaces as ``SchemaBug`` (a forgelib bug, exit 3) rather than as a confusing error in the user's spec.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from forgelib.errors import SpecIssue
from forgelib.resources import data_dir
from forgelib.spec.yamlpos import JsonPath, YamlDoc, clip, walk

SCHEMAS = ("project", "task", "grading", "run_config", "agent")


class SchemaBug(Exception):
    """One of forgelib's own schema files is broken. Deliberately not a ForgeError: it is not the user's."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'digest'?"`` when a choice is close to ``word``, else ``""``."""
    if len(word) > 200:
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class SchemaSet:
    """The schemas of one folder (forgelib's own ``schemas/`` by default), each read, checked and made a
    validator once, on first use. The set owns that cache: a test builds its own set instead of clearing
    a global one."""

    def __init__(self, folder: Path | None = None) -> None:
        self._folder = folder
        self._lock = threading.Lock()
        self._loaded: tuple[dict[str, dict[str, Any]], Registry[Any]] | None = None
        self._validators: dict[str, Draft202012Validator] = {}

    def _load(self) -> tuple[dict[str, dict[str, Any]], Registry[Any]]:
        with self._lock:
            if self._loaded is None:
                self._loaded = _read(self._folder)
            return self._loaded

    def schema(self, name: str) -> dict[str, Any]:
        """The parsed (and checked) schema ``name`` (one of ``SCHEMAS``)."""
        return self._load()[0][name]

    def validator(self, name: str) -> Draft202012Validator:
        schemas, registry = self._load()
        with self._lock:
            if name not in self._validators:
                self._validators[name] = Draft202012Validator(schemas[name], registry=registry)
            return self._validators[name]


def _read(folder: Path | None) -> tuple[dict[str, dict[str, Any]], Registry[Any]]:
    try:
        folder = folder or data_dir("schemas")
    except FileNotFoundError as e:
        raise SchemaBug(str(e)) from None
    schemas: dict[str, dict[str, Any]] = {}
    for name in SCHEMAS:
        path = folder / f"{name}.schema.json"
        try:
            schema = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise SchemaBug(f"forgelib's schema {path} cannot be read: {e}; reinstall forgelib") from None
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as e:
            where = "/".join(str(p) for p in e.absolute_path) or "(root)"
            raise SchemaBug(
                f"forgelib's schema {path} is itself invalid at {where}: {e.message} "
                "(a bug in forgelib, not in your spec)"
            ) from None
        if not isinstance(schema.get("$id"), str):
            raise SchemaBug(f"forgelib's schema {path} has no $id (a bug in forgelib, not in your spec)")
        schemas[name] = schema
    registry: Registry[Any] = Registry().with_resources(
        (s["$id"], Resource.from_contents(s, default_specification=DRAFT202012)) for s in schemas.values()
    )
    return schemas, registry


FORGELIB_SCHEMAS = SchemaSet()  # the installed package's schemas: immutable files, read once per process


def schema(name: str) -> dict[str, Any]:
    """The parsed (and checked) schema ``name`` (one of ``SCHEMAS``) of forgelib's own schemas."""
    return FORGELIB_SCHEMAS.schema(name)


def validate(doc: YamlDoc, name: str, schemas: SchemaSet = FORGELIB_SCHEMAS) -> list[SpecIssue]:
    """Every schema violation in ``doc`` against schema ``name``, in file order."""
    try:
        errors = list(schemas.validator(name).iter_errors(doc.data))
    except Unresolvable as e:
        raise SchemaBug(f"forgelib's schema {name!r} has a $ref that does not resolve: {e}") from None
    issues: dict[SpecIssue, None] = {}
    for at, value in walk(doc.data):
        if isinstance(value, float) and not math.isfinite(value):
            issues[doc.issue(at, f"{value} is not a usable number; write a finite one")] = None
    lookup = _Defs(schemas, name)
    for error in errors:
        for issue in _issues(doc, error, lookup):
            issues[issue] = None
    for better in _solver_path(doc, name):  # replaces the schema's own words for the same spot
        issues = {(better if i.json_path == better.json_path else i): None for i in issues}
    return sorted(issues, key=lambda i: (i.line or 0, i.col or 0, i.json_path))


class _Defs:
    """Resolves a property's ``$ref`` to its schema, to see which keys it takes (``#/$defs/X`` of the schema
    being validated, or ``other.schema.json#/$defs/X``); None when it cannot."""

    def __init__(self, schemas: SchemaSet, name: str) -> None:
        self._schemas = schemas
        self._name = name

    def keys_of(self, node: Any) -> Sequence[str]:
        if not isinstance(node, dict):
            return ()
        ref = node.get("$ref")
        if isinstance(ref, str):
            file, _, pointer = ref.partition("#")
            target: Any = self._schemas.schema(file.removesuffix(".schema.json") if file else self._name)
            for part in (p for p in pointer.split("/") if p):
                target = target.get(part) if isinstance(target, dict) else None
            node = target if isinstance(target, dict) else {}
        return list(node.get("properties") or ())


_JSON_TYPES = {
    dict: "a mapping",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    type(None): "empty (null)",
}
_TYPE_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "empty",
}


def _describe(value: Any) -> str:
    what = _JSON_TYPES.get(type(value), type(value).__name__)
    if isinstance(value, dict | list) or value is None:
        return what
    shown = repr(value)
    return f"{what} ({shown[:40] + '...' if len(shown) > 40 else shown})"


def _issues(doc: YamlDoc, error: ValidationError, lookup: _Defs) -> list[SpecIssue]:
    path: JsonPath = tuple(error.absolute_path)
    v = error.validator
    # The stubs widen these to include "unset"; on a raised error they are the schema's own values.
    value: Any = error.validator_value
    sch: Any = error.schema
    if v in ("oneOf", "anyOf") and error.context:
        return _issues(doc, best_match(error.context), lookup)
    if v == "additionalProperties" and isinstance(error.instance, dict):
        return _unknown_keys(doc, path, error.instance, sch, lookup)
    if v == "required" and isinstance(error.instance, dict):
        missing = [k for k in value if k not in error.instance]
        return [doc.issue(path, f"missing required key {k!r}") for k in missing]
    if v == "type":
        types: list[str] = value if isinstance(value, list) else [value]
        want = " or ".join(_TYPE_WORDS.get(t) or t for t in types)
        return [doc.issue(path, f"expected {want}, got {_describe(error.instance)}")]
    if v == "enum":
        allowed = [str(x) for x in value]
        hint = did_you_mean(str(error.instance), allowed)
        return [doc.issue(path, f"{clip(error.instance)} is not one of: {', '.join(allowed)}{hint}")]
    if "propertyNames" in error.absolute_schema_path and isinstance(error.instance, str):
        # jsonschema reports a bad key at its parent's path; point at the key itself.
        rule = (
            f"use letters, digits, '_', '.', '-' (must match {value!r})" if v == "pattern" else error.message
        )
        return [
            doc.issue(
                (*path, error.instance), f"{clip(error.instance)} is not a valid name: {rule}", key=True
            )
        ]
    if v == "pattern":
        return [doc.issue(path, f"{clip(error.instance)} does not match {value!r}")]
    if v == "maxLength" and isinstance(error.instance, str):
        return [doc.issue(path, f"too long ({len(error.instance)} characters; at most {value})")]
    message = error.message
    return [doc.issue(path, message if len(message) <= 300 else message[:300] + "...")]


def _unknown_keys(
    doc: YamlDoc, path: JsonPath, instance: dict[str, Any], sch: dict[str, Any], lookup: _Defs
) -> list[SpecIssue]:
    allowed: Sequence[str] = list(sch.get("properties", {}))
    patterns = [re.compile(p) for p in sch.get("patternProperties", {})]
    out = []
    for key in instance:
        if key in allowed or any(p.search(key) for p in patterns):
            continue
        owner = _owner(key, instance, sch, lookup)
        if owner is not None:
            out.append(
                doc.issue(
                    (*path, key),
                    f"{clip(key)} belongs inside {owner}, not beside it; move it in: "
                    f"{owner}: {{..., {key}: {clip(instance[key], 40)}}}",
                    key=True,
                )
            )
            continue
        hint = did_you_mean(key, allowed)
        known = f" (allowed here: {', '.join(allowed)})" if allowed else ""
        out.append(doc.issue((*path, key), f"unknown key {clip(key)}{hint or known}", key=True))
    return out


def _owner(key: str, instance: dict[str, Any], sch: dict[str, Any], lookup: _Defs) -> str | None:
    """The mapping written beside ``key`` whose own schema takes ``key`` (``equals:`` written beside ``sql:``
    instead of inside it: ``sql``), or None."""
    for sibling, sub in (sch.get("properties") or {}).items():
        if isinstance(instance.get(sibling), dict) and key in lookup.keys_of(sub):
            return str(sibling)
    return None


def _solver_path(doc: YamlDoc, name: str) -> list[SpecIssue]:
    """A run config's ``agent:`` given a path: the schema can only say it is not ``oracle``; say how an agent
    file is used instead."""
    value = doc.get(("agent",)) if name == "run_config" and isinstance(doc.data, dict) else None
    if not isinstance(value, str) or value == "oracle" or did_you_mean(value, ["oracle"]):
        return []  # a typo of oracle keeps the schema's "did you mean"
    exists = (doc.file.parent / value).is_file()
    what = "the agent file" if exists else "an agent file"
    return [
        doc.issue(
            ("agent",),
            f"{clip(value)} is not an agent: a run config's agent: is `oracle` or the agent itself, written "
            f"here (agent: {{command: [...], where: host}}); to use {what} {clip(value)}, give it to "
            "`forge run` with --agent PATH (PATH as seen from where forge runs), or copy its keys under "
            "agent:",
        )
    ]
