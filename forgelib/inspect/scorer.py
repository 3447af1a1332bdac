"""``forge_scorer()``: an inspect scorer that grades a sample's forge stack with the task's grading.yaml.

It runs while the sample's sandbox is still up (inspect scores before ``sample_cleanup``), on the stack of
the default ``forge`` sandbox; the Score is CORRECT when forge's grade passes (threshold and gates), its
explanation lists every check with its reason, its metadata carries forge's score and components.
"""

from __future__ import annotations

import anyio
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Scorer, Target, accuracy, scorer, stderr
from inspect_ai.solver import TaskState
from inspect_ai.util import sandbox

from forgelib.errors import ForgeError
from forgelib.inspect.environment import ForgeSandboxEnvironment
from forgelib.inspect.grade import explain, grade_stack
from forgelib.runner import SubprocessRunner


@scorer(metrics=[accuracy(), stderr()])  # type: ignore[untyped-decorator]  # Any without inspect
def forge_scorer() -> Scorer:
    """Grade the sample's forge stack with its forge task's grading.yaml (checks, alternatives, gates)."""

    async def score(state: TaskState, target: Target) -> Score:
        env = sandbox().as_type(ForgeSandboxEnvironment)
        sample = env.stack
        facts = {"FORGE_SAMPLE_ID": str(state.sample_id), "FORGE_EPOCH": str(state.epoch)}
        runner = SubprocessRunner(default_timeout=sample.timeouts.command)
        try:
            g = await anyio.to_thread.run_sync(
                lambda: grade_stack(sample.stack, sample.task, runner, env=facts, timeouts=sample.timeouts)
            )
        except ForgeError as e:
            return Score(value=INCORRECT, explanation=f"forge grading failed: {e}")
        return Score(
            value=CORRECT if g.binary_pass else INCORRECT,
            answer=state.output.completion if state.output else None,
            explanation=explain(g),
            metadata={
                "forge_score": g.score,
                "threshold": g.threshold,
                "components": dict(g.components),
                "reasons": list(g.reasons),
                "stack": sample.name,
                "task": sample.task.name,
            },
        )

    return score
