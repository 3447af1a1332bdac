"""Trace checks in grading.yaml: what loads, and every mistake as a file:line error that names the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forgelib.mcp.names import TOOL_ARGUMENTS
from forgelib.spec.loader import collect_grading
from forgelib.spec.schema import schema

GOOD = """\
threshold: 0.5
gates:
  - name: no_post
    trace: {not_called: {tool: http_request, args: {method: '(?i)^post$'}}}
components:
  - name: routes
    weight: 1
    alternatives:
      a:
        - name: read
          trace: {called: {tool: read_file, args: {path: '^/x$'}, result: ok, ok: any}}
        - name: before
          trace:
            order: {first: {tool: read_file}, then: {tool: write_file}}
            on_missing: pass
        - name: quotes
          trace:
            bound:
              from: {tool: exec, args: {argv.0: '^cat$'}}
              capture: 'status=(\\w+)'
              into: {tool: write_file, args: {path: note}}
              arg: content
            on_unbound: pass
        - name: state
          file: {service: runner, path: /work/note.md, contains: x}
"""


def load(tmp_path: Path, text: str) -> tuple[object, list[str]]:
    f = tmp_path / "grading.yaml"
    f.write_text(text)
    grading, issues = collect_grading(f, {"runner": {}})
    return grading, [str(i) for i in issues]


def test_trace_checks_load_as_checks_of_type_trace(tmp_path: Path) -> None:
    grading, issues = load(tmp_path, GOOD)
    assert issues == [] and grading is not None
    (gate,) = grading.gates  # type: ignore[attr-defined]
    assert gate.type == "trace" and gate.gate and gate.spec["not_called"]["tool"] == "http_request"
    route = grading.components[0].alternatives["a"]  # type: ignore[attr-defined]
    assert [c.type for c in route] == ["trace", "trace", "trace", "file"]
    assert route[2].spec["bound"]["arg"] == "content" and route[2].spec["on_unbound"] == "pass"


BAD = {
    "unknown_tool": (
        "trace: {not_called: {tool: http_request, args: {method: '(?i)^post$'}}}",
        "trace: {not_called: {tool: http_requests}}",
        4, "$.gates[0].trace.not_called.tool", "did you mean 'http_request'",
    ),
    "unknown_argument": (
        "args: {path: note}", "args: {contents: note}",
        21, "$.components[0].alternatives.a[2].trace.bound.into.args.contents",
        "no argument 'contents'; did you mean 'content'?; its arguments: service, path, content",
    ),
    "unknown_bound_arg": (
        "arg: content", "arg: body",
        22, "$.components[0].alternatives.a[2].trace.bound.arg", "tool write_file has no argument 'body'",
    ),
    "bad_regex": (
        "args: {path: '^/x$'}", "args: {path: '(unclosed'}",
        11, "$.components[0].alternatives.a[0].trace.called.args.path", "invalid regular expression",
    ),
    "capture_without_group": (
        "capture: 'status=(\\w+)'", "capture: 'status=\\w+'",
        20, "$.components[0].alternatives.a[2].trace.bound.capture", "wrap the token in one",
    ),
    "two_questions": (
        "trace: {not_called: {tool: http_request, args: {method: '(?i)^post$'}}}",
        "trace: {not_called: {tool: exec}, called: {tool: exec}}",
        4, "$.gates[0].trace", "exactly one of called, not_called, order, bound; found called, not_called",
    ),
    "option_of_another_question": (
        "            on_missing: pass", "            on_unbound: pass",
        15, "$.components[0].alternatives.a[1].trace.on_unbound", "on_unbound applies to bound only",
    ),
    "matcher_on_a_trace_check": (
        "trace: {called: {tool: read_file, args: {path: '^/x$'}, result: ok, ok: any}}",
        "trace: {called: {tool: read_file}, equals: x}",
        11, "$.components[0].alternatives.a[0].trace.equals", "unknown key 'equals'",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_trace_check_is_a_located_error_naming_the_fix(tmp_path: Path, case: str) -> None:
    old, new, line, json_path, message = BAD[case]
    assert GOOD.count(old) == 1, old
    grading, issues = load(tmp_path, GOOD.replace(old, new))
    assert grading is None
    hit = [i for i in issues if f":{line}:" in i and f" {json_path}: " in i and message in i]
    assert hit, "\n".join(issues)


def test_the_schema_lists_exactly_the_tools_the_models_know() -> None:
    tools = schema("grading")["$defs"]["call"]["properties"]["tool"]["enum"]
    assert tools == list(TOOL_ARGUMENTS), json.dumps(tools)
