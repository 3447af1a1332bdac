"""A sample's forge grade: the task's grading.yaml run on the sample's stack, with forge run's own pieces
(``run.checks.evaluate`` observes, ``run.grading`` scores: checks, gates, weighted components, alternatives;
``run.judge`` for a judge). No inspect here; ``forgelib.inspect.scorer`` turns the grade into a Score.

The walk over grading.yaml is ``run.grading.grade_by``, the one ``forge run`` uses. Checks run one after
another (a sample's grading is a handful of reads; ``forge run`` runs them on a thread pool, a speed-up
this adapter does not need), each a ``ReadOnce`` read unless a check may change state.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from forgelib.errors import ForgeError
from forgelib.grading.checks import ReadOnce, evaluate
from forgelib.grading.judge import run_judge
from forgelib.grading.score import CheckOutcome, ComponentResult, Grade, grade_by, judge_component, mutates
from forgelib.runner import Result, Runner
from forgelib.spec.models import Check, Component, Task, Timeouts
from forgelib.stacks.stack import ServiceAccess, Stack


def grade_stack(
    stack: Stack, task: Task, runner: Runner, *, env: Mapping[str, str], timeouts: Timeouts
) -> Grade:
    """``task``'s grading.yaml on ``stack``; ``ForgeError`` when the task has none. Trace checks are left
    undecided (an inspect sample's tool calls are inspect's, not a forge trace.jsonl)."""
    g = task.grading
    if g is None:
        raise ForgeError(
            f"forge task {task.name!r} has no grading.yaml to score with; name a task that has one "
            "(ForgeConfig(task=...) or the sample's metadata forge_task)"
        )
    deadline = time.monotonic() + timeouts.grading  # one budget for the sample's checks

    def budget() -> float:
        return max(1.0, deadline - time.monotonic())

    view: ServiceAccess = stack.compose if mutates(g) else ReadOnce(stack.compose)

    def observe(checks: Sequence[Check]) -> list[CheckOutcome]:
        return [evaluate(view, c, stack.resolved, timeout=budget()) for c in checks]

    def host(
        argv: Sequence[str], *, timeout: float, cwd: Path, env: Mapping[str, str], input: str | None
    ) -> Result:
        return runner.run(argv, timeout=timeout, cwd=cwd, env=env, input=input, check=False)

    def judge(c: Component) -> ComponentResult:
        assert c.judge is not None
        verdict = run_judge(
            c.name, c.judge, stack=view, host=host, cwd=g.path.parent,
            env={"FORGE_TASK": task.name, "FORGE_INSTRUCTION": task.instruction, **env},
            timeout=min(c.judge.timeout, budget()),
        )  # fmt: skip
        return judge_component(c.name, c.weight, verdict)

    return grade_by(g, observe, judge)


def explain(g: Grade) -> str:
    """Every check's result (passed, failed or undecided) with its reason, one per line (the Score's
    explanation)."""
    lines = [
        f"forge grade: {'pass' if g.binary_pass else 'fail'}, score {g.score:.3f} (threshold {g.threshold:g})"
    ]
    for o in g.checks:
        kind = "gate" if o.gate else "check"
        if not o.decided:  # neither passed nor failed: left out of the score
            lines.append(f"- {kind} {o.name}: undecided: {o.why()}")
        elif o.passed:
            lines.append(f"- {kind} {o.name}: passed (observed {o.observed!r})")
        else:
            lines.append(f"- {o.reason()}")
    for name, d in g.details.items():
        if d.get("reason"):
            lines.append(f"- {d['kind']} {name}: {d['score']:.2f}: {d['reason']}")
    lines += [f"- {r}" for r in g.reasons if r.startswith("score ")]
    return "\n".join(lines)
