"""benchmarks/mysql_bench.py reads a reused trial's reset from where the warm pool records it."""

from __future__ import annotations

from benchmarks.mysql_bench import reset_steps

# A reused trial's `stack` as trial.yaml records it (a warm run of the shop pack's hostile task).
REUSED = {
    "mode": "warm",
    "reuse": 1,
    "reset_ahead": {
        "reset:shop-db": 1.374,
        "successors": 0.029,
        "fingerprint:shop-db": 0.37,
        "recreate": 1.204,
        "ready": 2.083,
        "seconds": 6.457,
        "ended_at": 1796591683.469,
    },
}


def test_the_reset_done_ahead_is_read_from_the_stacks_record() -> None:
    assert reset_steps(REUSED) == {"reset": 1.374, "ahead": 6.457}


def test_every_reset_service_counts_and_a_fresh_stack_has_none() -> None:
    two = {"reset_ahead": {"reset:a": 0.25, "reset:b": 0.5, "fingerprint:a": 1.0, "seconds": 2.0}}
    assert reset_steps(two) == {"reset": 0.75, "ahead": 2.0}
    assert reset_steps({"mode": "warm", "reuse": 0}) == {"reset": 0.0, "ahead": 0.0}
