"""``python -m benchmarks [NAME ...]``: run every ``benchmarks/*_bench.py`` module's ``main()``, or only the
named ones (``digest`` runs ``digest_bench``). ``--list`` prints the names. Each benchmark prints its table
and writes ``benchmarks/results/<name>.json``; one failing does not stop the others (exit 1 at the end)."""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def available() -> list[str]:
    return sorted(p.stem.removesuffix("_bench") for p in HERE.glob("*_bench.py"))


def main(argv: list[str]) -> int:
    names = available()
    if "--list" in argv:
        print("\n".join(names))
        return 0
    unknown = [a for a in argv if a not in names]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    failed = []
    for name in argv or names:
        try:
            importlib.import_module(f"benchmarks.{name}_bench").main([])
        except (Exception, SystemExit):  # noqa: BLE001 - report and go on to the next benchmark
            failed.append(name)
            print(f"\n== {name} == FAILED\n{traceback.format_exc()}", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
