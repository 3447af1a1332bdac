"""Grading arithmetic: matchers, weighted score, threshold -> ``binary_pass``, gates. Pure, no I/O.

Flat ``checks`` (``grade``): score = sum(weights of passed checks) / sum(all weights); ``components`` holds
each check's share of it (so the components sum to the score).

Weighted ``components`` (``combine``): each component scores in [0, 1] — a list of checks by weight, a set
of ``alternatives`` (each route's checks scored as a whole, by weight; the best route's score counts, the
first declared winning a tie) or a judge's verdict — and score = sum(weight * component score) / sum(weights);
``components`` holds each one's share and ``details`` every route's score, the winner, the judge's reason.

Either way a failed gate fails the trial whatever the score.

A check that *cannot be decided* (``decided`` false: a trace check on a trial without a trace) is neither
passed nor failed: it is left out of the score (out of the numerator and the denominator alike), a
component or route with no decided check is left out of its parent the same way, and an undecided gate
fails nothing. The grade lists each one under ``undecided``. A grade with nothing decided at all is red.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forgelib.spec.models import MATCHERS, Check, Component, Grading

_EPS = 1e-9  # 0.1 + 0.2 weights must still reach a 0.3 threshold


@dataclass(frozen=True)
class Matcher:
    kind: str  # one of MATCHERS
    expected: str

    def describe(self) -> str:
        return f"{self.kind} {self.expected!r}"


def render(value: Any) -> str:
    """A value as the text a matcher compares: strings as-is, everything else as JSON (true, 3, null)."""
    if isinstance(value, str):
        return value
    return json.dumps(_thaw(value), sort_keys=True)


def _thaw(value: Any) -> Any:
    """Loaded specs are deep-frozen (read-only mappings, tuples); JSON wants dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_thaw(v) for v in value]
    return value


def matcher_of(spec: Mapping[str, Any]) -> Matcher | None:
    """The one matcher key in a check's spec, if any (an http check may only assert its status)."""
    found = [k for k in MATCHERS if k in spec]
    if len(found) > 1:
        raise ValueError(f"a check takes one matcher, got {', '.join(found)}")
    if not found:
        return None
    return Matcher(found[0], render(spec[found[0]]))


def matches(m: Matcher, observed: str) -> bool:
    """Does ``observed`` satisfy ``m``? Trailing newlines are ignored (``cat`` and ``psql`` print them)."""
    got = observed.rstrip("\r\n")
    want = m.expected.rstrip("\r\n")
    if m.kind == "equals":
        return got == want
    if m.kind == "contains":
        return want in got
    if m.kind == "icontains":
        return want.casefold() in got.casefold()
    if m.kind == "not_contains":
        return want not in got
    if m.kind == "regex":
        try:
            return re.search(m.expected, observed, re.MULTILINE) is not None
        except re.error as e:  # a spec problem, reported on the check rather than crashing the trial
            raise ValueError(f"invalid regex {m.expected!r}: {e}") from None
    raise ValueError(f"unknown matcher {m.kind!r}; known: {', '.join(MATCHERS)}")


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    type: str
    weight: float
    gate: bool
    passed: bool
    observed: str | None  # what the check saw (None when it could not observe)
    expected: str  # human description, e.g. "equals 'baseline'"
    error: str | None = None  # why it could not observe, or why it failed beyond the matcher
    decided: bool = True  # False: neither passed nor failed; ``error`` says why ("cannot be decided: ...")
    # A state check's observation, as what it asked for (every field but the matcher): `forge grade`
    # re-decides the check from ``observed`` only when the new rubric asks for the same observation.
    observes: str | None = None

    def reason(self) -> str:
        kind = "gate" if self.gate else "check"
        if not self.decided:
            return f"{kind} {self.name!r} {self.error or 'cannot be decided'}"
        if self.error is not None:
            return f"{kind} {self.name!r} failed: {self.error}"
        return f"{kind} {self.name!r} failed: expected {self.expected}, observed {_short(self.observed)}"


@dataclass(frozen=True)
class Grade:
    binary_pass: bool
    score: float
    threshold: float
    components: Mapping[str, float] = field(default_factory=dict)
    checks: tuple[CheckOutcome, ...] = ()
    reasons: tuple[str, ...] = ()
    # Weighted components only: name -> {kind, weight, score, and routes + winner | reason}
    details: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    undecided: tuple[str, ...] = ()  # each check that cannot be decided, with why (left out of the score)


@dataclass(frozen=True)
class Verdict:
    """A judge's answer: ``score`` in [0, 1] and why."""

    score: float
    reason: str


@dataclass(frozen=True)
class ComponentResult:
    name: str
    kind: str  # checks | alternatives | judge
    weight: float
    score: float | None  # None: nothing in it could be decided (left out of the grade's score)
    checks: tuple[CheckOutcome, ...] = ()  # every check the component ran (all routes')
    routes: Mapping[str, float | None] = field(default_factory=dict)
    winner: str | None = None
    reason: str | None = None  # the judge's, or why the best route fell short

    def detail(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "weight": self.weight, "score": _round(self.score)}
        if self.kind == "alternatives":
            out["routes"] = {r: _round(s) for r, s in self.routes.items()}
            out["winner"] = self.winner
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def _round(score: float | None) -> float | None:
    return None if score is None else round(score, 6)


def checks_score(outcomes: Sequence[CheckOutcome]) -> float | None:
    """Passed weight over decided weight; None when no check could be decided."""
    decided = [o for o in outcomes if o.decided]
    if not decided:
        return None
    total = sum(o.weight for o in decided)
    return sum(o.weight for o in decided if o.passed) / total if total > 0 else 0.0


def checks_component(name: str, weight: float, outcomes: Sequence[CheckOutcome]) -> ComponentResult:
    return ComponentResult(name, "checks", weight, checks_score(outcomes), tuple(outcomes))


def alternatives_component(
    name: str, weight: float, routes: Mapping[str, Sequence[CheckOutcome]]
) -> ComponentResult:
    """Each route scored as a whole; the component scores its best route (the first declared on a tie),
    never a sum of parts of several. A route with no decided check takes no part."""
    scores = {r: checks_score(outs) for r, outs in routes.items()}
    flat = tuple(o for outs in routes.values() for o in outs)
    decided = {r: s for r, s in scores.items() if s is not None}
    if not decided:
        return ComponentResult(
            name, "alternatives", weight, None, flat, scores, None, "no route could be decided"
        )
    winner = max(decided, key=lambda r: decided[r])  # max keeps the first of equal scores
    best = decided[winner]
    reason = None
    if best + _EPS < 1.0:
        failed = [o.reason() for o in routes[winner] if o.decided and not o.passed]
        listed = ", ".join(f"{r} {'undecided' if s is None else f'{s:.2f}'}" for r, s in scores.items())
        reason = f"no route held whole; best {winner!r} ({listed}): " + "; ".join(failed)
    return ComponentResult(name, "alternatives", weight, best, flat, scores, winner, reason)


def judge_component(name: str, weight: float, verdict: Verdict) -> ComponentResult:
    return ComponentResult(name, "judge", weight, verdict.score, reason=verdict.reason)


def combine(gates: Sequence[CheckOutcome], components: Sequence[ComponentResult], threshold: float) -> Grade:
    """The weighted form: components against the threshold, behind the gates. A component that could not
    be decided is left out (its weight too); an undecided gate fails nothing."""
    checks = (*gates, *(o for c in components for o in c.checks))
    undecided = _undecided(checks) + tuple(
        f"judge {c.name!r} {c.reason}" for c in components if c.kind == "judge" and c.score is None
    )
    if not components:
        return failed_grade(["the grading has no weighted components to score"], threshold, checks)
    total = sum(c.weight for c in components if c.score is not None)
    if total <= 0:
        reasons = ["no component could be decided", *undecided]
        return failed_grade(reasons, threshold, checks, undecided=undecided)
    shares = {c.name: c.weight * c.score / total if c.score is not None else 0.0 for c in components}
    score = sum(shares.values())
    reasons = [o.reason() for o in gates if o.decided and not o.passed]
    for c in components:
        if c.score is None:
            continue
        if c.kind == "checks":
            reasons += [o.reason() for o in c.checks if o.decided and not o.passed]
        elif c.score + _EPS < 1.0:
            what = "judge" if c.kind == "judge" else "component"
            reasons.append(f"{what} {c.name!r} scored {c.score:.2f}: {c.reason}")
    above = score + _EPS >= threshold
    if not above:
        reasons.append(f"score {score:.3f} is below the threshold {threshold:g}")
    return Grade(
        binary_pass=above and all(o.passed for o in gates if o.decided),
        score=round(score, 6),
        threshold=threshold,
        components={k: round(v, 6) for k, v in shares.items()},
        checks=checks,
        reasons=tuple(reasons),
        details={c.name: c.detail() for c in components},
        undecided=undecided,
    )


def grade(outcomes: Sequence[CheckOutcome], threshold: float) -> Grade:
    if not outcomes:
        # A trial with nothing to check proves nothing: red, with the reason, rather than a vacuous pass.
        return failed_grade(["the task has no state checks to grade"], threshold)
    undecided = _undecided(outcomes)
    decided = [o for o in outcomes if o.decided]
    if not decided:
        return failed_grade(
            ["no check could be decided", *undecided], threshold, outcomes, undecided=undecided
        )
    total = sum(o.weight for o in decided)
    if total <= 0:
        return failed_grade(["the state checks' weights sum to 0"], threshold, outcomes)
    components = {o.name: (o.weight / total if o.passed and o.decided else 0.0) for o in outcomes}
    score = sum(components.values())
    reasons = [o.reason() for o in decided if not o.passed]
    gates_ok = all(o.passed for o in decided if o.gate)
    above = score + _EPS >= threshold
    if not above:
        reasons.append(f"score {score:.3f} is below the threshold {threshold:g}")
    return Grade(
        binary_pass=above and gates_ok,
        score=round(score, 6),
        threshold=threshold,
        components={k: round(v, 6) for k, v in components.items()},
        checks=tuple(outcomes),
        reasons=tuple(reasons),
        undecided=undecided,
    )


Observe = Callable[[Sequence[Check]], list[CheckOutcome]]


def _in_turn(parts: Sequence[Callable[[], Any]]) -> list[Any]:
    return [p() for p in parts]


def grade_by(
    grading: Grading | None,
    observe: Observe,
    judge: Callable[[Component], ComponentResult],
    *,
    together: Callable[[Sequence[Callable[[], Any]]], list[Any]] = _in_turn,
) -> Grade:
    """The grade ``grading`` gives (no grading: nothing to pass, red), every check decided by ``observe``
    and every judge component by ``judge``: the one walk over a grading.yaml, for a live stack (``forge
    run``, the inspect scorer) and for recorded evidence (``forge grade``). ``together`` runs the gates
    and each component (one after another by default; ``forge run`` runs them at once)."""
    if grading is None or not grading.components:
        return grade(observe((*grading.checks, *grading.gates) if grading else ()), threshold_of(grading))
    g = grading

    def part(c: Component) -> ComponentResult:
        if c.judge is not None:
            return judge(c)
        if c.alternatives:
            return alternatives_component(
                c.name, c.weight, {r: observe(cs) for r, cs in c.alternatives.items()}
            )
        return checks_component(c.name, c.weight, observe(c.checks))

    gates, *parts = together([lambda: observe(g.gates), *(lambda c=c: part(c) for c in g.components)])
    return combine(gates, parts, g.threshold)


def threshold_of(grading: Grading | None) -> float:
    return grading.threshold if grading is not None else 1.0


def mutates(grading: Grading) -> bool:
    """Whether any check of ``grading`` is an HTTP request that may change state (not GET/HEAD): then the
    checks run one by one, in the order the pack wrote them, and every read is made anew."""
    checks = [*grading.checks, *grading.gates]
    for c in grading.components:
        checks += [*c.checks, *(x for alt in c.alternatives.values() for x in alt)]
    return any(
        c.type == "http" and str(c.spec.get("method", "GET")).upper() not in ("GET", "HEAD") for c in checks
    )


def _undecided(outcomes: Sequence[CheckOutcome]) -> tuple[str, ...]:
    return tuple(o.reason() for o in outcomes if not o.decided)


def failed_grade(
    reasons: Sequence[str],
    threshold: float = 1.0,
    outcomes: Sequence[CheckOutcome] = (),
    *,
    undecided: tuple[str, ...] = (),
) -> Grade:
    """The grade of a trial that could not be graded (provisioning or oracle failed): red, score 0."""
    return Grade(
        binary_pass=False,
        score=0.0,
        threshold=threshold,
        components={o.name: 0.0 for o in outcomes},
        checks=tuple(outcomes),
        reasons=tuple(reasons),
        undecided=undecided,
    )


def _short(value: str | None, limit: int = 200) -> str:
    if value is None:
        return "nothing"
    v = value.rstrip("\r\n")
    return repr(v if len(v) <= limit else v[:limit] + "...")
