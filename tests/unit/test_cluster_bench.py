"""The cluster benchmark's arithmetic: a mode's overhead split into a fixed part per run and a marginal part
per trial, and the ratio per run size."""

from __future__ import annotations

import pytest

from benchmarks import cluster_bench as cb


def test_split_recovers_fixed_and_marginal_from_two_run_sizes() -> None:
    # total(N) = 16 s per run + 1.5 s per trial
    fixed, marginal = cb.split({8: 16 + 8 * 1.5, 32: 16 + 32 * 1.5})
    assert fixed == pytest.approx(16.0)
    assert marginal == pytest.approx(1.5)


def test_split_uses_the_extreme_sizes() -> None:
    fixed, marginal = cb.split({32: 4 + 32 * 2.0, 8: 4 + 8 * 2.0, 16: 999.0})
    assert (fixed, marginal) == (pytest.approx(4.0), pytest.approx(2.0))


def test_split_with_one_size_charges_everything_per_trial() -> None:
    assert cb.split({8: 20.0}) == (pytest.approx(0.0), pytest.approx(2.5))


def _row(run: str, trials: int, per_trial: float) -> dict[str, object]:
    return {"run": run, "trials": trials, "overhead_per_trial_s": per_trial}


def test_summarize_ratio_per_size_and_fixed_cost_of_each_mode() -> None:
    # local: 2 s fixed (4 slots x 0.5 s start-up) + 1.5 s per trial; cluster: 6 s fixed + 1.5 s per trial,
    # so the ratio falls from 1.29 at 8 trials to 1.08 at 32, and only the fixed part differs.
    local = {n: (2 + 1.5 * n) / n for n in (8, 32)}
    warm = {n: (6 + 1.5 * n) / n for n in (8, 32)}
    rows = [_row("cluster cold", 8, 3.0)]
    for n in (8, 32):
        rows += [_row("local --workers 4", n, local[n] + 0.1), _row("cluster warm", n, warm[n]),
                 _row("local --workers 4", n, local[n] - 0.1), _row("cluster warm", n, warm[n])]  # fmt: skip
    got = cb.summarize(rows, [8, 32])
    assert got["ratio_by_trials"] == {8: pytest.approx(1.286, abs=1e-3), 32: pytest.approx(1.08, abs=1e-3)}
    assert got["ratio"] == got["ratio_by_trials"][32]
    assert got["fixed_s_per_run"] == {"local": pytest.approx(2.0), "cluster": pytest.approx(6.0)}
    assert got["marginal_s_per_trial"] == {"local": pytest.approx(1.5), "cluster": pytest.approx(1.5)}
    assert got["ratio_cold"] == pytest.approx(3.0 / local[8], abs=1e-3)
