"""Trace checks on hand-written traces: reading trace.jsonl (torn, broken, missing), call patterns, the four
questions, and how an undecidable check is scored (left out, never a pass or a fail)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from forgelib.grading.gradedoc import grade_doc
from forgelib.grading.score import (
    CheckOutcome,
    Verdict,
    alternatives_component,
    checks_component,
    combine,
    grade,
    judge_component,
)
from forgelib.grading.traces import (
    NO_TRACE,
    Call,
    Trace,
    argument,
    decide,
    matches_call,
    parse_trace,
    read_trace,
)
from forgelib.spec.loader import deep_freeze
from forgelib.spec.models import Check


def call(
    seq: int,
    tool: str,
    at: float | None = None,
    *,
    ok: bool = True,
    result: str | None = "",
    **arguments: Any,
) -> Call:
    """A call that started at ``at`` (default: its seq) and took half a second."""
    start = float(seq if at is None else at)
    return Call(seq, tool, arguments, start, start + 0.5, ok, result if ok else None, None if ok else "boom")


def trace(*calls: Call) -> Trace:
    return Trace(tuple(calls))


def check(name: str, spec: dict[str, Any], *, gate: bool = False, weight: float = 1.0) -> Check:
    return Check(name, "trace", deep_freeze(spec), weight, gate)


def record(c: Call) -> str:
    fields = {"seq": c.seq, "tool": c.tool, "arguments": dict(c.arguments), "started": c.started}
    fields |= {"ended": c.ended, "ok": c.ok, "result": c.result, "error": c.error}
    return json.dumps({**fields, "result_bytes": 0, "result_sha256": "", "truncated": False})


# ------------------------------------------------------------------------------------------- the reader


def test_a_torn_last_line_is_left_out_and_the_rest_read(tmp_path: Path) -> None:
    p = tmp_path / "trace.jsonl"
    p.write_text(record(call(1, "read_file", path="/a")) + "\n" + record(call(2, "list_dir"))[:30])
    t = read_trace(p)
    assert t.undecidable is None and t.torn and [c.seq for c in t.calls] == [1]


def test_a_broken_line_before_the_last_makes_the_trace_undecidable_naming_the_line() -> None:
    text = record(call(1, "read_file")) + "\n{not json\n" + record(call(3, "read_file")) + "\n"
    t = parse_trace(text)
    assert t.calls == () and t.undecidable is not None and "line 2" in t.undecidable


def test_a_record_without_its_fields_is_not_a_call() -> None:
    t = parse_trace('{"seq": 1, "tool": "read_file"}\n')
    assert t.undecidable is not None and "line 1" in t.undecidable and "arguments" in t.undecidable


def test_no_file_is_no_trace_and_an_empty_file_is_an_empty_trace(tmp_path: Path) -> None:
    assert read_trace(tmp_path / "trace.jsonl").undecidable == NO_TRACE
    (tmp_path / "trace.jsonl").write_text("")
    assert read_trace(tmp_path / "trace.jsonl") == Trace()


def test_calls_are_ordered_by_seq_and_results_kept_as_text() -> None:
    lines = [record(call(2, "read_file", result="b")), record(call(1, "read_file", result="a"))]
    t = parse_trace("\n".join(lines) + "\n")
    assert [(c.seq, c.result) for c in t.calls] == [(1, "a"), (2, "b")]


# ------------------------------------------------------------------------------------------ call patterns


def test_argument_reaches_nested_values_and_renders_non_strings_as_json() -> None:
    args = {"headers": {"X-Id": "7"}, "argv": ["cat", "/x"], "timeout": 5, "body": None}
    assert argument(args, "headers.X-Id") == "7"
    assert argument(args, "argv.1") == "/x" and argument(args, "argv") == '["cat", "/x"]'
    assert argument(args, "timeout") == "5" and argument(args, "body") == "null"
    assert argument(args, "argv.9") is None and argument(args, "headers.nope") is None
    assert argument(args, "path") is None


def test_argument_regexes_are_searched_so_anchors_are_explicit() -> None:
    c = call(1, "http_request", service="orders-api", path="/orders/4021/source")
    assert matches_call({"tool": "http_request", "args": {"path": "/orders/4021"}}, c)  # search
    assert not matches_call({"tool": "http_request", "args": {"path": "^/orders/4021$"}}, c)
    assert not matches_call({"tool": "read_file", "args": {"path": "/orders"}}, c)  # another tool
    assert not matches_call({"tool": "http_request", "args": {"method": "GET"}}, c)  # no such argument


def test_ok_defaults_to_succeeded_calls_and_result_never_matches_an_error() -> None:
    failed = call(1, "read_file", ok=False, path="/x")
    pattern = {"tool": "read_file", "args": {"path": "/x"}}
    assert not matches_call(pattern, failed)
    assert matches_call({**pattern, "ok": "any"}, failed) and matches_call({**pattern, "ok": False}, failed)
    assert not matches_call({**pattern, "ok": "any", "result": ".*"}, failed)
    good = call(2, "read_file", result="status: shipped", path="/x")
    assert matches_call({**pattern, "result": "shipped"}, good)
    assert not matches_call({**pattern, "ok": False}, good)


# ------------------------------------------------------------------------------------------ the questions

READ = {"tool": "http_request", "args": {"path": "^/orders/4021$"}}
NOTE = {"tool": "write_file", "args": {"path": "^/work/note.md$"}}


def test_called_and_not_called() -> None:
    t = trace(call(1, "http_request", path="/orders/4021", method="GET"))
    assert decide(check("c", {"called": READ}), t).passed
    assert not decide(check("c", {"called": NOTE}), t).passed
    post = {"tool": "http_request", "args": {"method": "(?i)^post$"}}
    assert decide(check("n", {"not_called": post}), t).passed
    failed_post = trace(call(1, "http_request", ok=False, path="/orders/4021", method="POST"))
    out = decide(check("n", {"not_called": post}), failed_post)  # an attempt counts, even one that failed
    assert not out.passed and out.observed is not None and "#1 http_request" in out.observed


def test_order_needs_the_first_call_to_end_before_the_then_call_starts() -> None:
    q = check("o", {"order": {"first": READ, "then": NOTE}})
    read, note = (
        call(1, "http_request", 1.0, path="/orders/4021"),
        call(2, "write_file", 2.0, path="/work/note.md"),
    )
    assert decide(q, trace(read, note)).passed
    early_note = call(1, "write_file", 0.0, path="/work/note.md")
    assert not decide(q, trace(early_note, read, note)).passed  # the first note came before any read
    overlapping = call(2, "write_file", 1.2, path="/work/note.md")  # started while the read was running
    assert not decide(q, trace(read, overlapping)).passed


def test_order_on_missing() -> None:
    only_note = trace(call(1, "write_file", path="/work/note.md"))
    assert not decide(check("o", {"order": {"first": READ, "then": NOTE}}), only_note).passed  # default fail
    out = decide(check("o", {"order": {"first": READ, "then": NOTE}, "on_missing": "pass"}), only_note)
    assert out.passed and out.observed is not None and "no call matches 'first'" in out.observed


BOUND = {
    "from": READ,
    "capture": r"status\W+([a-z]+)",
    "into": NOTE,
    "arg": "content",
}


def served(seq: int, status: str = "processing") -> Call:
    return call(seq, "http_request", result=json.dumps({"id": 4021, "status": status}), path="/orders/4021")


def note(seq: int, content: str) -> Call:
    return call(seq, "write_file", path="/work/note.md", content=content)


def test_bound_token_from_the_agents_own_read() -> None:
    out = decide(check("b", {"bound": BOUND}), trace(served(1), note(2, 'served: "processing"')))
    assert out.passed and out.observed is not None and "'processing' bound from #1" in out.observed


def test_a_note_that_guesses_without_any_read_fails_the_bound_token() -> None:
    out = decide(check("b", {"bound": BOUND}), trace(note(1, 'served: "processing"')))
    assert not out.passed and out.decided
    assert out.observed is not None and out.observed.startswith("unbound")
    # on_unbound: pass leaves the missing read to a presence check
    assert decide(check("b", {"bound": BOUND, "on_unbound": "pass"}), trace(note(1, "processing"))).passed


def test_a_note_quoting_another_status_than_the_read_returned_fails() -> None:
    out = decide(check("b", {"bound": BOUND}), trace(served(1, "shipped"), note(2, 'served "processing"')))
    assert not out.passed and out.observed is not None and "'shipped'" in out.observed


def test_the_token_must_come_from_a_read_before_the_write() -> None:
    # The note was written first and the read that returned its word came after: no binding precedes it.
    assert not decide(check("b", {"bound": BOUND}), trace(note(1, "processing"), served(2))).passed


def test_an_errored_read_binds_nothing() -> None:
    failed = call(1, "http_request", ok=False, path="/orders/4021")
    out = decide(check("b", {"bound": BOUND}), trace(failed, note(2, "processing")))
    assert not out.passed and out.observed is not None and "unbound" in out.observed


def test_a_trial_without_a_trace_cannot_decide_any_question() -> None:
    for spec in (
        {"called": READ},
        {"not_called": READ},
        {"order": {"first": READ, "then": NOTE}},
        {"bound": BOUND},
    ):
        out = decide(check("x", spec), Trace(undecidable=NO_TRACE))
        assert not out.decided and not out.passed and out.observed is None
        assert out.error == f"cannot be decided: {NO_TRACE}"
        assert out.reason() == f"check 'x' cannot be decided: {NO_TRACE}"


# ------------------------------------------------------------------------------- scoring undecided checks


def out(
    name: str, passed: bool, *, decided: bool = True, gate: bool = False, weight: float = 1.0
) -> CheckOutcome:
    error = None if decided else "cannot be decided: no trace"
    return CheckOutcome(name, "trace", weight, gate, passed and decided, None, "x", error, decided=decided)


def test_flat_undecided_checks_are_out_of_the_score_and_listed() -> None:
    g = grade(
        [out("state", True), out("t1", False, decided=False), out("gate", False, decided=False, gate=True)],
        1.0,
    )
    assert g.binary_pass and g.score == 1.0 and g.reasons == ()
    assert g.undecided == (
        "check 't1' cannot be decided: no trace",
        "gate 'gate' cannot be decided: no trace",
    )
    doc = grade_doc(g)
    assert doc["undecided"] == list(g.undecided) and doc["checks"][1]["decided"] is False
    half = grade([out("state", True), out("t1", False), out("t2", False, decided=False)], 1.0)
    assert half.score == 0.5 and not half.binary_pass  # a decided failure still counts


def test_nothing_decided_is_red_not_a_vacuous_pass() -> None:
    g = grade([out("t1", False, decided=False)], 1.0)
    assert not g.binary_pass and g.score == 0.0 and g.reasons[0] == "no check could be decided"


def test_an_undecided_route_takes_no_part_and_an_undecided_component_is_left_out() -> None:
    comp = alternatives_component(
        "routes", 1.0,
        {"a": [out("a1", False, decided=False)], "b": [out("b1", True), out("b2", False, decided=False)]},
    )  # fmt: skip
    assert comp.score == 1.0 and comp.winner == "b" and comp.routes == {"a": None, "b": 1.0}
    assert comp.detail()["routes"] == {"a": None, "b": 1.0}
    nothing = checks_component("trace_only", 3.0, [out("t", False, decided=False)])
    assert nothing.score is None
    g = combine([], [nothing, comp, judge_component("judge", 1.0, Verdict(0.5, "meh"))], 0.7)
    assert g.score == 0.75 and g.binary_pass and g.components["trace_only"] is None
    assert g.details["trace_only"]["score"] is None and len(g.undecided) == 3


def test_an_undecided_gate_fails_nothing_but_a_decided_one_fails_whatever_won() -> None:
    routes = alternatives_component("routes", 1.0, {"a": [out("a1", True)]})
    assert combine([out("g", False, decided=False, gate=True)], [routes], 1.0).binary_pass
    g = combine([out("g", False, gate=True)], [routes], 1.0)
    assert g.score == 1.0 and not g.binary_pass and g.reasons[0].startswith("gate 'g' failed")


def test_a_grading_with_nothing_decidable_is_red() -> None:
    comp = alternatives_component("routes", 1.0, {"a": [out("a1", False, decided=False)]})
    assert comp.score is None and comp.winner is None
    g = combine([], [comp], 0.5)
    assert not g.binary_pass and g.reasons[0] == "no component could be decided"


@pytest.mark.parametrize("passed", [True, False])
def test_reason_of_a_decided_check_is_unchanged(passed: bool) -> None:
    o = out("c", passed)
    assert o.reason().startswith("check 'c' failed")
