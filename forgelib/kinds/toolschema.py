"""The pieces every MCP tool's argument schema and every check type's fields are built from (pure data),
and the bounds they state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_TIMEOUT = 30.0  # seconds, for every tool that does not take a timeout
MAX_TIMEOUT = 600.0  # the longest timeout a tool accepts

TIMEOUT: Mapping[str, Any] = {
    "type": "number",
    "exclusiveMinimum": 0,
    "maximum": MAX_TIMEOUT,
    "description": "Seconds (default 30).",
}


def service(what: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "description": f"The compose service {what}."}


TEXT_MATCH = {"$ref": "#/$defs/text"}
# What every check's observation is matched against (the grading schema's matchers).
MATCHERS: Mapping[str, Any] = {
    "equals": TEXT_MATCH,
    "contains": TEXT_MATCH,
    "icontains": TEXT_MATCH,
    "regex": {"type": "string"},
    "not_contains": TEXT_MATCH,
}


def check(properties: Mapping[str, Any], required: Sequence[str]) -> dict[str, Any]:
    """A check type's fields, as the grading schema's ``$defs`` holds them: ``properties`` and the
    matchers, nothing else."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(required),
        "properties": {**properties, **MATCHERS},
    }


def obj(properties: Mapping[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    }
