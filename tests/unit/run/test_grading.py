from __future__ import annotations

from types import MappingProxyType

import pytest

from forgelib.grading.score import CheckOutcome, Matcher, failed_grade, grade, matcher_of, matches, render


@pytest.mark.parametrize(
    ("kind", "expected", "observed", "result"),
    [
        ("equals", "baseline", "baseline\n", True),  # trailing newline from cat/psql ignored
        ("equals", "baseline", "Baseline", False),
        ("equals", "a\nb", "a\nb\n", True),
        ("contains", "proc", "processing", True),
        ("contains", "PROC", "processing", False),
        ("icontains", "PROC", "processing", True),
        ("not_contains", "error", "all good", True),
        ("not_contains", "error", "an error", False),
        ("regex", r"^id=\d+$", "x\nid=42\n", True),  # multiline
        ("regex", r"^id=\d+$", "id=x", False),
    ],
)
def test_matchers(kind: str, expected: str, observed: str, result: bool) -> None:
    assert matches(Matcher(kind, expected), observed) is result


def test_matcher_of_renders_non_strings_as_json() -> None:
    assert matcher_of({"service": "x", "equals": 3}) == Matcher("equals", "3")
    assert matcher_of({"equals": True}) == Matcher("equals", "true")
    assert matcher_of({"service": "x"}) is None
    assert render(None) == "null" and render("s") == "s"
    assert render(MappingProxyType({"a": (1, 2)})) == '{"a": [1, 2]}'
    with pytest.raises(ValueError, match="one matcher"):
        matcher_of({"equals": "a", "contains": "b"})


def test_invalid_regex_raises_value_error() -> None:
    with pytest.raises(ValueError, match="invalid regex"):
        matches(Matcher("regex", "("), "x")


def co(name: str, passed: bool, weight: float = 1.0, gate: bool = False) -> CheckOutcome:
    return CheckOutcome(name, "file", weight, gate, passed, "seen", "equals 'x'")


def test_weighted_score_and_components_sum_to_it() -> None:
    g = grade([co("a", True, 1), co("b", False, 3)], threshold=0.2)
    assert g.score == 0.25
    assert g.components == {"a": 0.25, "b": 0.0}
    assert sum(g.components.values()) == g.score
    assert g.binary_pass is True
    assert g.reasons == ("check 'b' failed: expected equals 'x', observed 'seen'",)


def test_threshold_boundary_and_float_tolerance() -> None:
    parts = [co("a", True, 0.1), co("b", True, 0.2), co("c", False, 0.7)]
    assert grade(parts, threshold=0.3).binary_pass is True  # 0.1 + 0.2 is 0.30000000000000004 / 1.0
    below = grade(parts, threshold=0.31)
    assert below.binary_pass is False
    assert below.reasons[-1] == "score 0.300 is below the threshold 0.31"


def test_failed_gate_fails_whatever_the_score() -> None:
    g = grade([co("big", True, 99), co("safety", False, 1, gate=True)], threshold=0.5)
    assert g.score == 0.99
    assert g.binary_pass is False
    assert g.reasons == ("gate 'safety' failed: expected equals 'x', observed 'seen'",)


def test_passed_gate_does_not_help_a_low_score() -> None:
    g = grade([co("g", True, 1, gate=True), co("b", False, 1)], threshold=1.0)
    assert g.binary_pass is False


def test_all_pass() -> None:
    g = grade([co("a", True), co("b", True)], threshold=1.0)
    assert (g.binary_pass, g.score, g.reasons) == (True, 1.0, ())


def test_no_checks_is_red() -> None:
    g = grade([], threshold=1.0)
    assert (g.binary_pass, g.score) == (False, 0.0)
    assert g.reasons == ("the task has no state checks to grade",)


def test_zero_weights_are_red() -> None:
    assert grade([co("a", True, 0)], 0.0).binary_pass is False


def test_failed_grade() -> None:
    g = failed_grade(["Provisioning failed at x: y"])
    assert (g.binary_pass, g.score, g.reasons) == (False, 0.0, ("Provisioning failed at x: y",))


def test_error_reason_wins_over_matcher_text() -> None:
    c = CheckOutcome("db", "sql", 1, False, False, None, "equals '1'", "`psql` exited 2: boom")
    assert c.reason() == "check 'db' failed: `psql` exited 2: boom"
