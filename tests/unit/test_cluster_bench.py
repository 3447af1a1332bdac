"""The cluster benchmark's summary: the ratio per run size, and each mode's start-up + exit and idle slot
time per trial beside it."""

from __future__ import annotations

import pytest

from benchmarks import cluster_bench as cb

ARM = {"cluster cold": "cold", "local --workers 4": "local", "cluster warm": "cluster", "fresh": "fresh"}


def _row(
    run: str, trials: int, per_trial: float, pre: float = 0.5, idle: float = 1.5, wall: float = 100.0
) -> dict[str, object]:
    return {"run": run, "arm": ARM[run], "trials": trials, "wall_s": wall, "overhead_per_trial_s": per_trial,
            "pre_s": pre, "idle_per_trial_s": idle, "post_s": 0.05}  # fmt: skip


def test_ratio_per_size_start_up_and_idle_of_each_mode() -> None:
    # 4 slots: the cluster's extra 1 s of start-up costs 4 slot-seconds per run, 0.5 s a trial at 8 trials
    # and 0.125 s at 32, over the same 1.5 s of idle slot time per trial.
    rows = [_row("cluster cold", 8, 3.0, pre=1.5, idle=2.5)]
    for n in (8, 32):
        local, warm = 1.5 + 4 * 0.55 / n, 1.5 + 4 * 1.55 / n
        rows += [
            _row("local --workers 4", n, local + 0.1, pre=0.4),
            _row("cluster warm", n, warm, pre=1.4),
            _row("local --workers 4", n, local - 0.1, pre=0.6),
            _row("cluster warm", n, warm, pre=1.6),
        ]
    got = cb.summarize(rows, [8, 32])
    assert got["ratio_by_trials"] == {
        8: pytest.approx((1.5 + 0.775) / (1.5 + 0.275), abs=1e-3),
        32: pytest.approx((1.5 + 0.19375) / (1.5 + 0.06875), abs=1e-3),
    }
    assert got["ratio"] == got["ratio_by_trials"][32]
    assert got["start_exit_s"] == {"local": pytest.approx(0.55), "cluster": pytest.approx(1.55)}
    assert got["idle_per_trial_s"] == {8: {"local": 1.5, "cluster": 1.5}, 32: {"local": 1.5, "cluster": 1.5}}
    assert got["idle_ratio_by_trials"] == {8: 1.0, 32: 1.0}
    assert got["ratio_cold"] == pytest.approx(3.0 / (1.5 + 0.275), abs=1e-3)


def test_cold_run_is_not_averaged_with_the_warm_ones() -> None:
    rows = [
        _row("cluster cold", 8, 9.0, pre=5.0),
        _row("local --workers 4", 8, 2.0),
        _row("cluster warm", 8, 2.2),
    ]
    got = cb.summarize(rows, [8])
    assert got["ratio"] == pytest.approx(1.1)
    assert got["start_exit_s"]["cluster"] == pytest.approx(0.55)


def test_idle_ratio_is_the_per_trial_part_without_start_up() -> None:
    # Same start-up in both modes, the cluster 10 % more idle slot time per trial: the idle ratio says 1.1
    # whatever the run's size, while the all-in ratio also carries each run's start-up.
    rows = [
        _row("cluster cold", 8, 9.0),
        _row("local --workers 4", 8, 2.0, idle=2.0),
        _row("cluster warm", 8, 2.2, idle=2.2),
        _row("local --workers 4", 32, 2.0, idle=1.0),
        _row("cluster warm", 32, 2.5, idle=1.1),
    ]
    got = cb.summarize(rows, [8, 32])
    assert got["idle_ratio_by_trials"] == {8: pytest.approx(1.1), 32: pytest.approx(1.1)}
    assert got["ratio_by_trials"] == {8: pytest.approx(1.1), 32: pytest.approx(1.25)}


def test_trials_that_run_slower_on_the_nodes_show_in_trial_seconds_and_wall_not_in_overhead() -> None:
    # Same overhead per trial; the cluster's 8 trials take 12 s each against 10 s locally (4 slots).
    rows = [
        _row("cluster cold", 8, 3.0),
        _row("local --workers 4", 8, 2.0, wall=(10 + 2.0) * 8 / 4),
        _row("cluster warm", 8, 2.0, wall=(12 + 2.0) * 8 / 4),
    ]
    got = cb.summarize(rows, [8])
    assert got["ratio"] == pytest.approx(1.0)
    assert got["trial_s"] == {8: {"local": pytest.approx(10.0), "cluster": pytest.approx(12.0)}}
    assert got["wall_ratio_by_trials"] == {8: pytest.approx(14 / 12, abs=1e-3)}


def test_warm_over_fresh_stacks_only_at_the_sizes_with_a_fresh_arm() -> None:
    # 32 trials on 4 slots: warm 40 s of wall (5 s of slot time per trial), fresh 160 s (20 s); trials 4 s
    # against 18 s (overhead 1 s against 2 s per trial).
    rows = [_row("cluster cold", 32, 3.0)]
    for n in (32, 150):
        rows += [_row("local --workers 4", n, 1.0), _row("cluster warm", n, 1.0, wall=40.0 * n / 32)]
    rows.append(_row("fresh", 32, 2.0, wall=160.0))
    got = cb.summarize(rows, [32, 150])
    assert got["fresh_ratio_by_trials"] == {32: 0.25}
    assert got["fresh_slot_s_per_trial"] == {32: {"cluster": 5.0, "fresh": 20.0}}
    assert got["fresh_trial_ratio_by_trials"] == {32: pytest.approx(4 / 18, abs=1e-3)}
    assert "fresh_ratio_by_trials" not in cb.summarize(rows[:-1], [32, 150])


def test_rounds_alternate_the_order_of_the_arms() -> None:
    assert [cb.order(["local", "cluster", "fresh"], i) for i in range(3)] == [
        ["local", "cluster", "fresh"],
        ["fresh", "cluster", "local"],
        ["local", "cluster", "fresh"],
    ]


def test_a_cold_run_of_a_size_no_local_run_has_gets_no_ratio() -> None:
    rows = [_row("cluster cold", 4, 5.0), _row("local --workers 4", 32, 1.0), _row("cluster warm", 32, 1.1)]
    got = cb.summarize(rows, [32])
    assert got["ratio_cold"] is None and got["ratio"] == pytest.approx(1.1)
