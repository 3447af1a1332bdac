from __future__ import annotations

import pytest

from forgelib.run.lifecycle import (
    Flow,
    Outcome,
    Phase,
    Progress,
    Termination,
    advance,
    error_stage,
    is_failed_attempt,
    is_finished,
    is_retryable,
    start,
    status_of,
)

WITH_ORACLE = Flow(has_oracle=True)


def walk(flow: Flow, steps: list[tuple[Outcome, bool | None]]) -> list[Progress]:
    p = start()
    seen = [p]
    for outcome, passed in steps:
        p = advance(flow, p, outcome, passed=passed)
        seen.append(p)
    return seen


def phases(ps: list[Progress]) -> list[Phase]:
    return [p.phase for p in ps]


OK = (Outcome.OK, None)


def test_green_trial_skips_log_capture() -> None:
    ps = walk(WITH_ORACLE, [OK, OK, OK, (Outcome.OK, True), OK])
    assert phases(ps) == [
        Phase.PENDING, Phase.PROVISIONING, Phase.ORACLE, Phase.GRADING, Phase.TEARDOWN, Phase.DONE,
    ]  # fmt: skip
    assert ps[-1].termination is Termination.COMPLETED and ps[-1].passed is True
    assert ps[-1].stack_up is False


def test_red_grade_captures_logs() -> None:
    ps = walk(WITH_ORACLE, [OK, OK, OK, (Outcome.OK, False), OK, OK])
    assert phases(ps)[4:] == [Phase.CAPTURE_LOGS, Phase.TEARDOWN, Phase.DONE]
    assert ps[-1].termination is Termination.COMPLETED and ps[-1].passed is False


def test_capture_logs_on_success() -> None:
    ps = walk(Flow(True, capture_logs_on_success=True), [OK, OK, OK, (Outcome.OK, True), OK, OK])
    assert Phase.CAPTURE_LOGS in phases(ps)


def test_no_oracle_goes_straight_to_grading() -> None:
    ps = walk(Flow(has_oracle=False), [OK, OK])
    assert ps[-1].phase is Phase.GRADING


def test_provision_error_ends_at_once_and_is_not_retryable() -> None:
    ps = walk(WITH_ORACLE, [OK, (Outcome.FAILED, None)])
    last = ps[-1]
    assert last.phase is Phase.DONE  # no oracle, no teardown: provisioning already tore down
    assert last.termination is Termination.PROVISION_ERROR
    assert not is_retryable(Termination.PROVISION_ERROR)
    assert is_failed_attempt(Termination.PROVISION_ERROR)
    assert status_of(last.termination, None) == "error"
    assert error_stage(Termination.PROVISION_ERROR, "reset_recipe") == "reset_recipe"


@pytest.mark.parametrize(
    ("outcome", "term", "retryable"),
    [
        (Outcome.FAILED, Termination.ORACLE_ERROR, False),
        (Outcome.TIMED_OUT, Termination.ORACLE_TIMEOUT, True),
    ],
)
def test_oracle_failure_skips_grading(outcome: Outcome, term: Termination, retryable: bool) -> None:
    ps = walk(WITH_ORACLE, [OK, OK, (outcome, None), OK, OK])
    assert phases(ps)[3:] == [Phase.CAPTURE_LOGS, Phase.TEARDOWN, Phase.DONE]
    assert ps[-1].termination is term
    assert is_retryable(term) is retryable
    assert error_stage(term) == "oracle"


def test_interrupt_with_a_stack_up_still_tears_down() -> None:
    ps = walk(WITH_ORACLE, [OK, OK, (Outcome.INTERRUPTED, None), OK])
    assert phases(ps)[3:] == [Phase.TEARDOWN, Phase.DONE]
    assert ps[-1].termination is Termination.INTERRUPTED
    assert not is_finished(Termination.INTERRUPTED)  # --resume runs it again
    assert not is_failed_attempt(Termination.INTERRUPTED)
    assert status_of(Termination.INTERRUPTED, None) == "interrupted"


def test_interrupt_before_provisioning_ends_at_once() -> None:
    ps = walk(WITH_ORACLE, [(Outcome.INTERRUPTED, None)])
    assert ps[-1].phase is Phase.DONE and ps[-1].termination is Termination.INTERRUPTED


def test_interrupt_during_teardown_finishes() -> None:
    ps = walk(WITH_ORACLE, [OK, OK, OK, (Outcome.OK, True), (Outcome.INTERRUPTED, None)])
    assert ps[-1].phase is Phase.DONE and ps[-1].termination is Termination.INTERRUPTED


def test_crash_tears_down_and_is_an_internal_error() -> None:
    ps = walk(WITH_ORACLE, [OK, OK, (Outcome.CRASHED, None), OK])
    assert phases(ps)[3:] == [Phase.TEARDOWN, Phase.DONE]
    assert ps[-1].termination is Termination.INTERNAL_ERROR
    assert status_of(Termination.INTERNAL_ERROR, None) == "error"


def test_crash_in_teardown_keeps_the_verdict() -> None:
    ps = walk(WITH_ORACLE, [OK, OK, OK, (Outcome.OK, True), (Outcome.CRASHED, None)])
    assert ps[-1].phase is Phase.DONE and ps[-1].termination is Termination.COMPLETED


def test_statuses() -> None:
    assert status_of(None, None) == "pending"
    assert status_of(Termination.COMPLETED, True) == "passed"
    assert status_of(Termination.COMPLETED, False) == "failed"
    assert is_finished(Termination.COMPLETED) and not is_failed_attempt(Termination.COMPLETED)


def test_misuse_is_refused() -> None:
    done = walk(WITH_ORACLE, [OK, (Outcome.FAILED, None)])[-1]
    with pytest.raises(ValueError, match="finished"):
        advance(WITH_ORACLE, done, Outcome.OK)
    grading = walk(WITH_ORACLE, [OK, OK, OK])[-1]
    with pytest.raises(ValueError, match="grade"):
        advance(WITH_ORACLE, grading, Outcome.OK)
