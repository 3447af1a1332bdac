"""Digest overhead: forgelib's directory digest against a plain hashlib loop over the same files, as a ratio
measured in the same run (target ≤ 1.25: forge's time ÷ the loop's).

Two generated trees in a temporary directory (deleted afterwards): *large* (few big files: hashing speed)
and *small* (thousands of 4 KiB files in 50 directories: per-file overhead). The page cache is warmed first;
then rounds alternate forge and baseline and the report gives medians. forge = ``dir_sha256`` in process;
baseline = ``hashlib.file_digest`` of each file in a sorted list (the same SHA-256 implementation, OpenSSL
through hashlib, so the ratio is forge's own cost: walking, stat, canonical records), not coreutils'
``sha256sum``, which is a different implementation.

Size: ``FORGE_BENCH_DIGEST_LARGE_MB`` (default 256, in 16 files), ``FORGE_BENCH_DIGEST_SMALL_FILES``
(default 5000), ``FORGE_BENCH_DIGEST_ROUNDS`` (default 5), or ``--large-mb / --small-files / --rounds``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness as bs
from forgelib.spec.digest import dir_sha256

NAME = "digest"
TARGET = 1.25
MB = 1 << 20


def make_large(root: Path, total_mb: int, files: int = 16) -> None:
    root.mkdir(parents=True)
    size = max(total_mb * MB // files, 1)
    for i in range(files):
        (root / f"blob{i:02d}.bin").write_bytes(os.urandom(size))


def make_small(root: Path, count: int, size: int = 4096) -> None:
    for i in range(count):
        d = root / f"d{i % 50:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.txt").write_bytes(os.urandom(size))


def files_of(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if p.is_file())


def hashlib_loop(files: Sequence[str]) -> None:
    """The like-for-like baseline: the same hash over the same bytes, nothing else."""
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            hashlib.file_digest(fh, "sha256")


def timed(fn: Callable[..., object], *args: Any) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def measure(name: str, root: Path, rounds: int) -> dict[str, Any]:
    files = files_of(root)
    total = sum(Path(f).stat().st_size for f in files)
    dir_sha256(root)  # warm the page cache (and both code paths) before measuring
    hashlib_loop(files)
    ours: list[float] = []
    base: list[float] = []
    for r in range(rounds):
        # Alternate which goes first so neither always profits from the other's cache state.
        pair: list[tuple[str, Callable[[], float]]] = [
            ("forge", lambda: timed(dir_sha256, root)),
            ("base", lambda: timed(hashlib_loop, files)),
        ]
        for who, run in pair if r % 2 == 0 else reversed(pair):
            (ours if who == "forge" else base).append(run())
    forge_s, base_s = bs.median(ours), bs.median(base)
    ratio = bs.ratio(forge_s, base_s)
    return {
        "scenario": name,
        "files": len(files),
        "MiB": round(total / MB, 1),
        "forge_s": round(forge_s, 4),
        "hashlib_s": round(base_s, 4),
        "forge_MiB_s": round(total / MB / forge_s, 1) if forge_s else None,
        "hashlib_MiB_s": round(total / MB / base_s, 1) if base_s else None,
        "ratio": round(ratio, 3),
        "target": TARGET,
        "ok": ratio <= TARGET,
        "forge_all_s": [round(x, 4) for x in ours],
        "hashlib_all_s": [round(x, 4) for x in base],
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.digest_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--large-mb", type=int, default=bs.env_int("FORGE_BENCH_DIGEST_LARGE_MB", 256))
    parser.add_argument("--small-files", type=int, default=bs.env_int("FORGE_BENCH_DIGEST_SMALL_FILES", 5000))
    parser.add_argument("--rounds", type=int, default=bs.env_int("FORGE_BENCH_DIGEST_ROUNDS", 5))
    args = parser.parse_args(argv)
    meta = bs.start_meta(rounds=args.rounds)
    with tempfile.TemporaryDirectory(prefix="forge-bench-digest-") as tmp:
        make_large(Path(tmp) / "large", args.large_mb)
        make_small(Path(tmp) / "small", args.small_files)
        rows = [measure(n, Path(tmp) / n, args.rounds) for n in ("large", "small")]
    # every round's seconds go in the JSON, not the table
    meta["rounds_s"] = {r["scenario"]: {k: r.pop(k) for k in ("forge_all_s", "hashlib_all_s")} for r in rows}
    worst = max(r["ratio"] for r in rows)
    note = f"ratio (worst scenario): {worst:.3f}  target <= {TARGET}  {bs.verdict(worst, TARGET)}"
    return bs.report(NAME, rows, meta=meta, notes=[note])


if __name__ == "__main__":
    main()
