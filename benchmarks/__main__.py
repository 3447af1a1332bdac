"""``python -m benchmarks [NAME ...]``: run every ``benchmarks/*_bench.py`` module's ``main()``, or only the
named ones (``digest`` runs ``digest_bench``). ``python -m benchmarks NAME [ARG ...]``: one benchmark
with its arguments (everything from the first argument that cannot be a name on goes to that one: one
starting with ``-``, or any other that is not a word, such as ``5`` or ``8,150``; with several names
arguments are refused). ``--list`` prints the names. Each benchmark prints its table and writes
``benchmarks/results/<name>.json``; one failing does not stop the others (exit 1 at the end)."""

from __future__ import annotations

import importlib
import re
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what a benchmark's name looks like (a module's)


def available() -> list[str]:
    return sorted(p.stem.removesuffix("_bench") for p in HERE.glob("*_bench.py"))


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """The benchmark names (the arguments before the first one that cannot be a name: ``--rounds``, ``5``)
    and the rest (a word that names no benchmark stays a name: unknown, and refused)."""
    first = next((i for i, a in enumerate(argv) if not NAME.fullmatch(a)), len(argv))
    return argv[:first], argv[first:]


def main(argv: list[str]) -> int:
    names = available()
    chosen, options = split(argv)
    if not chosen and "--list" in options:
        print("\n".join(names))
        return 0
    unknown = [a for a in chosen if a not in names]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    if options and len(chosen) != 1:
        where = " ".join(options)
        print(f"arguments ({where}) go to one benchmark: name exactly one before them", file=sys.stderr)
        return 2
    failed = []
    for name in chosen or names:
        try:
            importlib.import_module(f"benchmarks.{name}_bench").main(options)
        except SystemExit as e:  # argparse's usage error (printed already) or the benchmark's message
            if e.code not in (0, None):
                failed.append(name)
                print(f"\n== {name} == FAILED: {e.code}", file=sys.stderr)
        except Exception:  # noqa: BLE001 - report and go on to the next benchmark
            failed.append(name)
            print(f"\n== {name} == FAILED\n{traceback.format_exc()}", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
