"""Running a grading ``judge``: the hook where a team plugs in its (model-based) scorer.

The judge is a user-supplied argv, exec'd in a compose service or run on the host through the runner seam
(cwd: the grading file's directory), with a timeout. ``input`` (a file read from a service, e.g. the
agent's note) arrives on its stdin; ``FORGE_TASK`` and ``FORGE_INSTRUCTION`` in its environment. It prints
one JSON object, ``{"score": <0..1>, "reason": "<why>"}``, on stdout (the last non-empty line counts, so it
may log before it). Anything else — a non-zero exit, a timeout, unreadable JSON, a score outside [0, 1] —
is a ``JudgeError``: a named grading error, retryable (``GRADING_ERROR``), never a silent 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from forgelib.errors import CommandTimeout, ForgeError, Interrupted
from forgelib.grading.checks import exec_failure, read_argv
from forgelib.grading.score import Verdict
from forgelib.runner import Result
from forgelib.spec.models import Judge
from forgelib.stacks.stack import ServiceAccess


class JudgeError(ForgeError):
    """The judge gave no usable verdict; the message names the component and why."""


class HostRun(Protocol):
    """Running a command on the host (the backend's runner seam)."""

    def __call__(
        self, argv: Sequence[str], *, timeout: float, cwd: Path, env: Mapping[str, str], input: str | None
    ) -> Result: ...


def parse_verdict(stdout: str) -> Verdict:
    """The verdict in a judge's stdout; ``ValueError`` saying what is wrong with it."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise ValueError('printed nothing; expected {"score": <0..1>, "reason": "..."} on stdout')
    try:
        doc = json.loads(lines[-1])
    except ValueError:
        raise ValueError(f"last line of stdout is not JSON: {lines[-1][:200]!r}") from None
    score = doc.get("score") if isinstance(doc, dict) else None
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise ValueError(f'no numeric "score" in {lines[-1][:200]!r}')
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"score {score} is outside [0, 1]")
    reason = doc.get("reason", "")
    return Verdict(float(score), reason if isinstance(reason, str) else json.dumps(reason))


def run_judge(
    component: str,
    judge: Judge,
    *,
    stack: ServiceAccess,
    host: HostRun,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
) -> Verdict:
    """Run ``judge`` (``timeout``: its own, capped by the run's grading budget) and read its verdict."""
    what = f"judge {component!r}"
    text = None
    if judge.input_service is not None and judge.input_path is not None:
        try:
            argv = read_argv(judge.input_path)
            got = stack.exec(judge.input_service, argv, timeout=timeout, check=False)
        except Interrupted:  # the stop's doing: no JudgeError (a grading error the judge never made)
            raise
        except ForgeError as e:
            failure = exec_failure("cat", judge.input_service, e)
            raise JudgeError(f"{what}: cannot read its input: {failure}") from None
        if got.rc != 0:
            shown = f"cat {judge.input_path}"
            raise JudgeError(
                f"{what}: cannot read its input: {exec_failure(shown, judge.input_service, got)}"
            )
        text = got.stdout
    env = {**env, **judge.env}
    shown = " ".join(judge.command)
    where = judge.service or "host"
    try:
        if judge.service is not None:
            r = stack.exec(judge.service, judge.command, input=text, timeout=timeout, env=env, check=False)
        else:
            r = host(judge.command, timeout=timeout, cwd=cwd, env=env, input=text)
    except Interrupted:
        raise
    except CommandTimeout:
        raise JudgeError(f"{what} (`{shown}` on {where}) timed out after {timeout:g}s") from None
    except ForgeError as e:
        raise JudgeError(f"{what} (`{shown}` on {where}) could not run: {e}") from None
    if r.rc != 0:
        out = (r.stderr or r.stdout).strip().splitlines()[-5:]
        raise JudgeError(f"{what} (`{shown}` on {where}) exited {r.rc}: {' | '.join(out) or '(no output)'}")
    try:
        return parse_verdict(r.stdout)
    except ValueError as e:
        raise JudgeError(f"{what} (`{shown}` on {where}) {e}") from None
