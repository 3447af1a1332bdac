"""Plain-text tables for the terminal: the one column aligner behind ``forge run``'s result table,
``forge reap``, ``forge snapshots ls`` and the benchmarks' reports."""

from __future__ import annotations

from collections.abc import Sequence


def align(rows: Sequence[Sequence[str]], *, ragged_last: bool = False) -> list[str]:
    """``rows`` of cells (the first usually the header) as lines of left-aligned columns two spaces apart.

    ``ragged_last``: the last column is free text (a reason) that neither is padded nor widens the table.
    Trailing spaces are dropped.
    """
    if not rows:
        return []
    n = len(rows[0]) - 1 if ragged_last else len(rows[0])
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    cells = ([*(c.ljust(w) for c, w in zip(r[:n], widths, strict=True)), *r[n:]] for r in rows)
    return ["  ".join(line).rstrip() for line in cells]
