"""Weighted components, alternatives (best route wins), gates outside routes, the judge's verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from forgelib.grading.judge import JudgeError, parse_verdict, run_judge
from forgelib.grading.score import (
    CheckOutcome,
    Verdict,
    alternatives_component,
    checks_component,
    combine,
    judge_component,
)
from forgelib.runner import Result
from forgelib.spec.loader import collect_grading
from forgelib.spec.models import Judge

from .fakes import FakeStack, ok


def out(name: str, passed: bool, weight: float = 1.0, gate: bool = False) -> CheckOutcome:
    return CheckOutcome(name, "file", weight, gate, passed, "x", "equals 'y'")


def test_the_best_route_wins_and_every_route_is_recorded() -> None:
    routes = {"a": [out("a1", True), out("a2", False)], "b": [out("b1", True), out("b2", True)]}
    g = combine(
        [out("gate", True, gate=True)],
        [
            judge_component("judge", 0.5, Verdict(0.8, "good")),
            checks_component("note", 0.25, [out("n1", True), out("n2", False)]),
            alternatives_component("routes", 0.25, routes),
        ],
        0.6,
    )
    assert g.binary_pass and g.score == pytest.approx(0.5 * 0.8 + 0.25 * 0.5 + 0.25 * 1.0)
    assert g.details["routes"] == {"kind": "alternatives", "weight": 0.25, "score": 1.0,
                                   "routes": {"a": 0.5, "b": 1.0}, "winner": "b"}  # fmt: skip
    assert g.details["judge"]["reason"] == "good"
    assert sum(g.components.values()) == pytest.approx(g.score)
    assert [c.name for c in g.checks] == ["gate", "n1", "n2", "a1", "a2", "b1", "b2"]


def test_a_failed_gate_outside_the_routes_fails_whatever_won() -> None:
    g = combine(
        [out("gate", False, gate=True)], [alternatives_component("r", 1.0, {"a": [out("a1", True)]})], 0.5
    )
    assert not g.binary_pass and g.score == 1.0 and g.reasons[0].startswith("gate 'gate' failed")


def test_deterministic_parts_alone_do_not_carry_a_weak_diagnosis() -> None:
    g = combine(
        [],
        [
            judge_component("judge", 0.5, Verdict(0.2, "no evidence")),
            checks_component("note", 0.25, [out("n1", True)]),
            alternatives_component("routes", 0.25, {"a": [out("a1", False)], "b": [out("b1", False)]}),
        ],
        0.6,
    )
    assert not g.binary_pass and g.score == pytest.approx(0.35)
    assert g.details["routes"]["winner"] == "a"  # a tie: the first declared
    assert any("judge 'judge' scored 0.20: no evidence" in r for r in g.reasons)
    assert g.reasons[-1] == "score 0.350 is below the threshold 0.6"


@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        ("", "printed nothing"),
        ("thinking...\nnot json", "not JSON"),
        ('{"reason": "x"}', 'no numeric "score"'),
        ('{"score": 1.5}', "outside [0, 1]"),
        ('{"score": true}', 'no numeric "score"'),
    ],
)
def test_bad_verdicts_are_named(stdout: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_verdict(stdout)


def test_a_verdict_may_follow_log_lines() -> None:
    assert parse_verdict('loading\n{"score": 0.5, "reason": "half"}\n') == Verdict(0.5, "half")


def test_a_host_judge_reads_its_input_from_the_service_and_a_failing_one_is_a_judge_error(
    tmp_path: Path,
) -> None:
    stack = FakeStack(lambda s, a, k: ok("the note\n"))
    seen: list[Any] = []

    def host(argv: Any, *, timeout: float, cwd: Path, env: Any, input: str | None) -> Result:
        seen.append((tuple(argv), cwd, dict(env), input))
        return ok('{"score": 1, "reason": "fine"}')

    judge = Judge(("python3", "judge.py"), input_service="runner", input_path="/n.md", env={"K": "v"})
    v = run_judge("j", judge, stack=stack, host=host, cwd=tmp_path, env={"FORGE_TASK": "t"}, timeout=5)
    assert v == Verdict(1.0, "fine")
    assert stack.calls[0][:2] == ("runner", ("cat", "--", "/n.md"))
    assert seen == [(("python3", "judge.py"), tmp_path, {"FORGE_TASK": "t", "K": "v"}, "the note\n")]

    def broken(argv: Any, **kw: Any) -> Result:
        return ok("", rc=2, stderr="Traceback\nKeyError: x")

    with pytest.raises(JudgeError, match=r"judge 'j' \(`python3 judge.py` on host\) exited 2: .*KeyError"):
        run_judge("j", judge, stack=stack, host=broken, cwd=tmp_path, env={}, timeout=5)


def test_grading_file_with_components_loads_and_refuses_misplaced_gates(tmp_path: Path) -> None:
    f = tmp_path / "grading.yaml"
    check = "{service: runner, path: /n, contains: x}"
    f.write_text(
        f"""threshold: 0.6
gates:
  - {{name: g, file: {check}}}
components:
  - {{name: judge, weight: 0.5, judge: {{command: [python3, j.py], input: {{service: runner, path: /n}}}}}}
  - name: routes
    weight: 0.5
    alternatives:
      a: [{{name: a1, file: {check}}}]
      b: [{{name: b1, severity: gate, file: {check}}}, {{name: g, file: {check}}}]
"""
    )
    grading, issues = collect_grading(f, {"runner": {}})
    assert grading is None
    text = "\n".join(str(i) for i in issues)
    assert "move the check to the top-level `gates:` list" in text
    assert "duplicate check name 'g' (also gates[0])" in text
    fixed = f.read_text().replace("severity: gate, ", "").replace(", {name: g, file", ", {name: b2, file")
    f.write_text(fixed)
    grading, issues = collect_grading(f, {"runner": {}})
    assert grading is not None, issues
    assert [c.kind for c in grading.components] == ["judge", "alternatives"]
    assert grading.gates[0].gate and grading.components[0].judge == Judge(
        ("python3", "j.py"), input_service="runner", input_path="/n"
    )


@pytest.mark.parametrize("where", ["input", "service", "host"])
def test_a_stop_killing_the_judge_or_its_input_read_is_no_judge_error(tmp_path: Path, where: str) -> None:
    """Interrupted propagates unwrapped (before: JudgeError "could not run: stop requested ...", a grading
    error the judge never made)."""
    from forgelib.errors import Interrupted

    stop = Interrupted("stop requested (SIGINT): `exec` was stopped")

    def answer(service: str, argv: Any, kw: Any) -> Result:
        if where == "input" or service == "grader":
            raise stop
        return ok("the note\n")

    def host(argv: Any, **kw: Any) -> Result:
        raise stop

    judge = Judge(
        ("python3", "judge.py"), service="grader" if where == "service" else None,
        input_service="runner", input_path="/n.md",
    )  # fmt: skip
    with pytest.raises(Interrupted):
        run_judge("j", judge, stack=FakeStack(answer), host=host, cwd=tmp_path, env={}, timeout=5)
