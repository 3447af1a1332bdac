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
    retries_after_node_loss,
    should_retry,
    start,
    status_of,
)

WITH_ORACLE = Flow(has_solver=True)


def walk(flow: Flow, steps: list[tuple[Outcome, bool | None]]) -> list[Progress]:
    p = start(flow)
    seen = [p]
    for outcome, passed in steps:
        p = advance(flow, p, outcome, passed=passed)
        seen.append(p)
    return seen


def phases(ps: list[Progress]) -> list[Phase]:
    return [p.phase for p in ps]


OK = (Outcome.OK, None)
P, PROV, OR, GR, CL, REC, TD, DONE = (
    Phase.PENDING, Phase.PROVISIONING, Phase.SOLVE, Phase.GRADING, Phase.CAPTURE_LOGS, Phase.RECORD,
    Phase.TEARDOWN, Phase.DONE,
)  # fmt: skip


def test_green_trial_is_recorded_before_teardown_and_skips_log_capture() -> None:
    ps = walk(WITH_ORACLE, [OK, OK, OK, (Outcome.OK, True), OK, OK])
    assert phases(ps) == [P, PROV, OR, GR, REC, TD, DONE]
    assert ps[-1].termination is Termination.COMPLETED and ps[-1].passed is True
    assert ps[-1].stack_up is False
    assert ps[4].stack_up and not ps[4].recorded  # the evidence is written while the stack still stands
    assert ps[5].recorded and ps[5].stack_up


def test_red_grade_captures_logs() -> None:
    ps = walk(WITH_ORACLE, [OK, OK, OK, (Outcome.OK, False), OK, OK, OK])
    assert phases(ps)[4:] == [CL, REC, TD, DONE]
    assert ps[-1].termination is Termination.COMPLETED and ps[-1].passed is False


def test_capture_logs_on_success() -> None:
    ps = walk(Flow(True, capture_logs_on_success=True), [OK, OK, OK, (Outcome.OK, True), OK, OK, OK])
    assert CL in phases(ps) and ps[-1].passed is True


def test_no_oracle_goes_straight_to_grading() -> None:
    ps = walk(Flow(has_solver=False), [OK, OK])
    assert ps[-1].phase is GR


def test_provision_error_is_recorded_and_not_retryable_even_with_retries() -> None:
    ps = walk(Flow(True, retries=3), [OK, (Outcome.FAILED, None), OK])
    assert phases(ps)[2:] == [REC, DONE]  # no oracle, no teardown: provisioning already tore down
    last = ps[-1]
    assert last.termination is Termination.PROVISION_ERROR and last.attempt == 1
    assert not is_retryable(Termination.PROVISION_ERROR)
    assert is_failed_attempt(Termination.PROVISION_ERROR)
    assert status_of(last.termination, None) == "error"
    assert error_stage(Termination.PROVISION_ERROR, "reset_recipe") == "reset_recipe"


@pytest.mark.parametrize(
    ("outcome", "term", "retryable"),
    [
        (Outcome.FAILED, Termination.AGENT_ERROR, False),
        (Outcome.TIMED_OUT, Termination.AGENT_TIMEOUT, True),
    ],
)
def test_oracle_failure_skips_grading(outcome: Outcome, term: Termination, retryable: bool) -> None:
    ps = walk(WITH_ORACLE, [OK, OK, (outcome, None), OK, OK, OK])
    assert phases(ps)[3:] == [CL, REC, TD, DONE]
    assert ps[-1].termination is term
    assert is_retryable(term) is retryable
    assert error_stage(term) == "solve"


def test_a_retryable_attempt_runs_again_on_a_fresh_stack_until_retries_run_out() -> None:
    flow = Flow(True, retries=2)
    timeout = (Outcome.TIMED_OUT, None)
    # attempt 1 and 2 time out; attempt 3 (the last retry) times out too and is final
    one = [OK, OK, timeout, OK, OK, OK]  # provisioning, oracle, capture, record, teardown -> next
    ps = walk(flow, one + one[1:] + one[1:])
    assert [p.attempt for p in ps if p.phase is PROV] == [1, 2, 3]
    recs = [p for p in ps if p.phase is TD]
    assert [p.retry for p in recs] == [True, True, False]
    assert ps[-1].phase is DONE and ps[-1].termination is Termination.AGENT_TIMEOUT and ps[-1].attempt == 3
    fresh = ps[6]
    assert fresh.phase is PROV and fresh.termination is None and not fresh.stack_up and not fresh.recorded


def test_a_retry_that_passes_ends_completed() -> None:
    ps = walk(
        Flow(True, retries=1),
        [OK, OK, (Outcome.TIMED_OUT, None), OK, OK, OK, OK, OK, (Outcome.OK, True), OK, OK],
    )
    assert ps[-1].phase is DONE and ps[-1].termination is Termination.COMPLETED and ps[-1].attempt == 2


@pytest.mark.parametrize(
    ("phase_steps", "outcome", "term"),
    [
        ([OK, OK], Outcome.LOST, Termination.ENGINE_LOST),  # the engine went away during the oracle
        ([OK, OK, OK], Outcome.FAILED, Termination.GRADING_ERROR),  # a judge failed
        ([OK, OK], Outcome.CRASHED, Termination.INTERNAL_ERROR),  # a bug
    ],
)
def test_retryable_ends(phase_steps: list[tuple[Outcome, None]], outcome: Outcome, term: Termination) -> None:
    ps = walk(Flow(True, retries=1), [*phase_steps, (outcome, None)])
    p = ps[-1]
    if p.phase is CL:
        p = advance(Flow(True, retries=1), p, Outcome.OK)
    assert p.phase is REC and p.termination is term and p.retry
    assert is_retryable(term) and is_failed_attempt(term) and error_stage(term) is not None


def test_an_interruption_is_never_retried_by_retries() -> None:
    ps = walk(Flow(True, retries=5), [OK, OK, (Outcome.INTERRUPTED, None), OK, OK])
    assert phases(ps)[3:] == [REC, TD, DONE]
    assert ps[-1].termination is Termination.INTERRUPTED and not ps[3].retry
    assert not should_retry(Termination.INTERRUPTED, 5)
    assert not is_finished(Termination.INTERRUPTED)  # --resume runs it again
    assert not is_failed_attempt(Termination.INTERRUPTED)
    assert status_of(Termination.INTERRUPTED, None) == "interrupted"


def test_an_interruption_during_a_retried_attempts_teardown_cancels_the_retry() -> None:
    ps = walk(Flow(True, retries=1), [OK, OK, (Outcome.TIMED_OUT, None), OK, OK, (Outcome.INTERRUPTED, None)])
    assert ps[-1].phase is DONE and ps[-1].attempt == 1 and not ps[-1].retry


def test_interrupt_before_provisioning_records_and_ends() -> None:
    ps = walk(WITH_ORACLE, [(Outcome.INTERRUPTED, None), OK])
    assert phases(ps)[1:] == [REC, DONE] and ps[-1].termination is Termination.INTERRUPTED


def test_interrupt_during_teardown_keeps_the_recorded_verdict() -> None:
    ps = walk(WITH_ORACLE, [OK, OK, OK, (Outcome.OK, True), OK, (Outcome.INTERRUPTED, None)])
    assert ps[-1].phase is DONE and ps[-1].termination is Termination.COMPLETED and ps[-1].passed


def test_crash_records_then_tears_down_as_an_internal_error() -> None:
    ps = walk(WITH_ORACLE, [OK, OK, (Outcome.CRASHED, None), OK, OK])
    assert phases(ps)[3:] == [REC, TD, DONE]
    assert ps[-1].termination is Termination.INTERNAL_ERROR
    assert status_of(Termination.INTERNAL_ERROR, None) == "error"


def test_crash_while_recording_still_tears_down_and_leaves_nothing_on_record() -> None:
    ps = walk(Flow(True, retries=1), [OK, OK, OK, (Outcome.OK, True), (Outcome.CRASHED, None), OK])
    assert phases(ps)[5:] == [TD, DONE]
    assert not ps[-1].recorded and not ps[-1].retry and ps[-1].termination is Termination.INTERNAL_ERROR


def test_crash_in_teardown_keeps_the_verdict() -> None:
    ps = walk(WITH_ORACLE, [OK, OK, OK, (Outcome.OK, True), OK, (Outcome.CRASHED, None)])
    assert ps[-1].phase is DONE and ps[-1].termination is Termination.COMPLETED


def test_statuses() -> None:
    assert status_of(None, None) == "pending"
    assert status_of(Termination.COMPLETED, True) == "passed"
    assert status_of(Termination.COMPLETED, False) == "failed"
    assert is_finished(Termination.COMPLETED) and not is_failed_attempt(Termination.COMPLETED)


def test_misuse_is_refused() -> None:
    done = walk(WITH_ORACLE, [OK, (Outcome.FAILED, None), OK])[-1]
    with pytest.raises(ValueError, match="finished"):
        advance(WITH_ORACLE, done, Outcome.OK)
    grading = walk(WITH_ORACLE, [OK, OK, OK])[-1]
    with pytest.raises(ValueError, match="grade"):
        advance(WITH_ORACLE, grading, Outcome.OK)


def test_a_lost_node_is_rerun_once_free_then_under_the_plans_retries() -> None:
    # Without retries (the default) a trial survives one lost node, as before; a second loss is the verdict.
    assert retries_after_node_loss(0, losses=1) == 0
    assert retries_after_node_loss(0, losses=2) is None
    # With retries, the first loss costs none of them; later ones spend one each, like any ENGINE_LOST.
    assert retries_after_node_loss(2, losses=1) == 2
    assert retries_after_node_loss(2, losses=2) == 1
    assert retries_after_node_loss(1, losses=3) == 0
    assert retries_after_node_loss(0, losses=3) is None
    assert should_retry(Termination.ENGINE_LOST, 1)  # the rule it defers to
