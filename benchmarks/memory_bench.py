"""Memory: peak RSS of the forge process over a short and a long run (≤ 100 MB, and not growing with the
number of trials), and constant memory when stamping or applying a large seed (streamed, never read whole).

- forge: ``forge run`` with N1 and N2 trials (default 5 and 20); the forge process's own high-water mark
  (``VmHWM``, sampled) and, for context, the largest of it and its children (``wait4`` ``ru_maxrss``, which
  includes the ``docker`` CLI processes it ran).
- seed: a generated file of ``FORGE_BENCH_SEED_MB`` (default 1024) MB in a temporary directory (deleted
  afterwards). Each probe is a fresh Python child reporting its own ``ru_maxrss``: ``seed_digest`` on it
  and on a 1 MB file, and an apply through ``SubprocessRunner().run(["cat"], stdin=big,
  stdout_path=/dev/null)`` on both (the runner streams stdin from the file, as the sql_dump recipe does into
  ``psql``). Constant memory means the 1 GB probe's peak equals the 1 MB probe's. A control probe that reads
  the file whole shows the measurement would catch a non-streamed implementation.
- psql: the real ``sql_dump`` recipe (``docker compose exec -T app-db psql ... < dump`` through the runner)
  into the postgres pack's app-db, with a COPY dump and an INSERT-per-row dump of 1 MB and
  ``FORGE_BENCH_PSQL_MB`` MB.

Size: ``FORGE_BENCH_MEMORY_TRIALS`` (default ``5,20``), ``FORGE_BENCH_MEMORY_WORKERS`` (default 4),
``FORGE_BENCH_SEED_MB`` (default 1024; 0 skips the seed probes), ``FORGE_BENCH_PSQL_MB`` (default 16;
0 skips the real psql apply), or ``--trials 5,20 --workers 4 --seed-mb N``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness as bs

NAME = "memory"
FORGE_LIMIT_MB = 100.0
MB = 1024 * 1024

# Each probe runs in a fresh interpreter and prints JSON: maxrss_kb (the process's high-water mark),
# heap_peak_kb (tracemalloc's peak of Python allocations during the operation only: not masked by what the
# imports left in the heap), captured_kb (output the runner held in memory), seconds.
_PROBE = r"""
import hashlib, json, resource, sys, time, tracemalloc
from pathlib import Path
from forgelib.runner import SubprocessRunner
from forgelib.spec.digest import seed_digest
from forgelib.spec.models import SeedKind

class Recording(SubprocessRunner):
    captured = 0
    def run(self, argv, **kw):
        r = super().run(argv, **kw)
        Recording.captured += len(r.stdout) + len(r.stderr)
        return r

what, path = sys.argv[1], Path(sys.argv[2])
if what == "psql":  # the real sql_dump recipe into app-db: argv[3] project, [4] compose file, [5] image env
    from forgelib.docker.compose import ComposeProject
    from forgelib.docker.resolved import ServiceConfig
    from forgelib.seeds import ApplyContext, sql_dump
    from forgelib.spec.models import Seed, Timeouts
    timeouts = Timeouts(recipe=1800)
    env = json.loads(sys.argv[5])
    compose = ComposeProject(sys.argv[3], (Path(sys.argv[4]),), Recording(), timeouts, env)
    svc = ServiceConfig.of({"environment": {"POSTGRES_USER": "app", "POSTGRES_DB": "app"}}, "app-db")
    ctx = ApplyContext("app-db", Seed("bench", path, SeedKind.SQL_DUMP, "sha256:unchecked"), {},
                       compose=compose, timeouts=timeouts, service_config=svc)
tracemalloc.start()
t = time.monotonic()  # after the imports: the baseline probe is what every probe pays before this
if what == "digest":
    seed_digest(path, SeedKind.SQL_DUMP)
elif what == "apply":
    Recording(default_timeout=600).run(["cat"], stdin=path, stdout_path=Path("/dev/null"))
elif what == "read_whole":
    hashlib.sha256(path.read_bytes()).hexdigest()
elif what == "psql":
    sql_dump.apply(ctx)
seconds = time.monotonic() - t
heap_peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "seconds": seconds,
                  "heap_peak_kb": heap_peak // 1024, "captured_kb": Recording.captured // 1024}))
"""


def probe(what: str, path: Path, *extra: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, what, str(path), *extra],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=bs.REPO,
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def make_dump(path: Path, size_mb: int, style: str) -> None:
    """A sql_dump of ``size_mb`` MiB loading one table: ``insert`` (one INSERT per row, as
    ``pg_dump --inserts`` writes; psql prints a line per statement) or ``copy`` (pg_dump's default)."""
    row = os.urandom(24).hex()
    with path.open("w") as f:
        f.write(
            "DROP TABLE IF EXISTS bench_rows;\nCREATE TABLE bench_rows (id bigint, payload text);\nBEGIN;\n"
        )
        if style == "copy":
            f.write("COPY bench_rows (id, payload) FROM stdin;\n")
        i, written = 0, 0
        while written < size_mb * MB:
            line = f"{i}\t{row}\n" if style == "copy" else f"INSERT INTO bench_rows VALUES ({i}, '{row}');\n"
            f.write(line)
            written += len(line)
            i += 1
        f.write("\\.\nCOMMIT;\n" if style == "copy" else "COMMIT;\n")


def psql_rows(size_mb: int, notes: list[str]) -> list[dict[str, Any]]:
    """The sql_dump recipe for real: ``docker compose exec -T app-db psql ... < dump`` through forgelib's
    runner, into the postgres pack's app-db (its own compose project, downed afterwards)."""
    from benchmarks.baseline import image_env

    compose_file = (bs.PACK / "shared" / "environment.compose.yaml").resolve()
    project = f"forgebench-mem-{uuid.uuid4().hex[:8]}"
    env = image_env()
    dc = ["docker", "compose", "-p", project, "-f", str(compose_file)]
    denv = {**os.environ, **env}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="forge-bench-psql-") as tmp:
        try:
            subprocess.run(
                [*dc, "up", "-d", "--wait", "app-db"], env=denv, check=True, capture_output=True, timeout=300
            )
            for style in ("copy", "insert"):
                for mb in (1, size_mb):
                    dump = Path(tmp) / f"{style}-{mb}.sql"
                    make_dump(dump, mb, style)
                    res = probe("psql", dump, project, str(compose_file), json.dumps(env))
                    label = f"sql_dump apply, {style} dump {mb} MB"
                    if "error" in res:
                        notes.append(f"{label}: {res['error']}")
                        continue
                    rows.append(
                        {
                            "probe": label,
                            "peak_rss_mb": round(res["maxrss_kb"] / 1024, 1),
                            "heap_peak_mb": round(res["heap_peak_kb"] / 1024, 1),
                            "captured_mb": round(res["captured_kb"] / 1024, 1),
                            "seconds": round(res["seconds"], 2),
                            "mb_per_s": round(mb / res["seconds"], 1) if res["seconds"] else "",
                        }
                    )
                    dump.unlink()
        except subprocess.CalledProcessError as e:
            notes.append(f"psql probe: could not start app-db: {e.stderr.decode(errors='replace')[-500:]}")
        finally:
            subprocess.run([*dc, "down", "-v"], env=denv, capture_output=True, timeout=180, check=False)
    by = {r["probe"]: r for r in rows}
    for style in ("copy", "insert"):
        lo, hi = (
            by.get(f"sql_dump apply, {style} dump 1 MB"),
            by.get(f"sql_dump apply, {style} dump {size_mb} MB"),
        )
        if lo is not None and hi is not None:
            grow = hi["heap_peak_mb"] - lo["heap_peak_mb"]
            per_gb = grow / max(size_mb - 1, 1) * 1024
            notes.append(
                f"sql_dump apply ({style} dump): heap peak {grow:+.1f} MB from 1 to {size_mb} MB "
                f"(~{per_gb:.0f} MB per GB of dump); psql output held by the runner: {hi['captured_mb']} MB"
            )
    return rows


def make_file(path: Path, size_mb: int) -> None:
    """``size_mb`` MiB of SQL-looking text (digest and apply do not care what the bytes are)."""
    line = b"INSERT INTO widgets (name) VALUES ('%s');\n"
    block = b"".join(line % os.urandom(24).hex().encode() for _ in range(MB // 80))
    block = (block * 2)[:MB]
    with path.open("wb") as f:
        for _ in range(size_mb):
            f.write(block)


def forge_rows(
    config: Path, trial_counts: Sequence[int], workers: int, notes: list[str]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="forge-bench-memory-") as tmp:
        for n in trial_counts:
            work = Path(tmp) / f"n{n}"
            work.mkdir()
            run = bs.run_forge(config, repeats=n, workers=workers, workdir=work, sample_every=0.02)
            trials = run.trials()
            if run.rc != 0:
                notes.append(f"{n} trials: {run.describe_failure()}")
            if left := bs.leftovers(run.run_id):
                notes.append(f"LEFTOVERS after {run.run_id}: {left}")
            rows.append(
                {
                    "probe": f"forge run, {len(trials)} trials, workers={workers}",
                    "peak_rss_mb": round(run.peak_rss_kb / 1024, 1),
                    "with_children_mb": round(run.tree_maxrss_kb / 1024, 1),
                    "seconds": round(run.wall, 1),
                    "target": f"<= {FORGE_LIMIT_MB:g} MB",
                }
            )
    worst = max((r["peak_rss_mb"] for r in rows), default=0.0)
    if rows:
        verdict = bs.verdict(worst, FORGE_LIMIT_MB)
        notes.insert(0, f"forge peak RSS {worst:.1f} MB  target <= {FORGE_LIMIT_MB:g} MB  {verdict}")
    if len(rows) >= 2:
        first, last = rows[0]["peak_rss_mb"], rows[-1]["peak_rss_mb"]
        growth = last - first
        extra = trial_counts[-1] - trial_counts[0]
        rows.append(
            {
                "probe": f"forge growth {trial_counts[0]} -> {trial_counts[-1]} trials",
                "peak_rss_mb": round(growth, 1),
                "with_children_mb": "",
                "seconds": "",
                "target": f"~0 ({growth * 1024 / max(extra, 1):.0f} KB/trial)",
            }
        )
    return rows


def seed_rows(size_mb: int, notes: list[str], control: bool) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="forge-bench-seed-") as tmp:
        small, big = Path(tmp) / "small.sql", Path(tmp) / "big.sql"
        make_file(small, 1)
        make_file(big, size_mb)
        base = probe("baseline", small)
        probes = [("baseline", "python + forgelib imports", small)]
        probes += [("digest", "seed_digest 1 MB", small), ("digest", f"seed_digest {size_mb} MB", big)]
        probes += [("apply", "runner apply (cat < seed) 1 MB", small)]
        probes += [("apply", f"runner apply (cat < seed) {size_mb} MB", big)]
        if control:
            probes += [("read_whole", f"control: read {size_mb} MB whole", big)]
        results: dict[str, dict[str, Any]] = {}
        for what, label, path in probes:
            res = base if what == "baseline" else probe(what, path)
            results[label] = res
            if "error" in res:
                notes.append(f"{label}: {res['error']}")
                continue
            size = path.stat().st_size / MB
            rows.append(
                {
                    "probe": label,
                    "peak_rss_mb": round(res["maxrss_kb"] / 1024, 1),
                    "over_baseline_mb": round((res["maxrss_kb"] - base.get("maxrss_kb", 0)) / 1024, 1),
                    "heap_peak_mb": round(res["heap_peak_kb"] / 1024, 1),
                    "seconds": round(res["seconds"], 2),
                    "mb_per_s": round(size / res["seconds"], 1)
                    if what != "baseline" and res["seconds"]
                    else "",
                }
            )
        for what in ("seed_digest", "runner apply (cat < seed)"):
            lo, hi = results.get(f"{what} 1 MB", {}), results.get(f"{what} {size_mb} MB", {})
            if "maxrss_kb" in lo and "maxrss_kb" in hi:
                delta = (hi["maxrss_kb"] - lo["maxrss_kb"]) / 1024
                heap = (hi["heap_peak_kb"] - lo["heap_peak_kb"]) / 1024
                notes.append(
                    f"{what}: the {size_mb} MB seed peaks {delta:+.1f} MB RSS / {heap:+.1f} MB heap over the "
                    "1 MB seed (~0: streamed)"
                )
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory_bench", description=__doc__)
    p.add_argument("--trials", default=os.environ.get("FORGE_BENCH_MEMORY_TRIALS") or "5,20")
    p.add_argument("--workers", type=int, default=bs.env_int("FORGE_BENCH_MEMORY_WORKERS", 4))
    p.add_argument("--seed-mb", type=int, default=bs.env_int("FORGE_BENCH_SEED_MB", 1024))
    p.add_argument("--psql-mb", type=int, default=bs.env_int("FORGE_BENCH_PSQL_MB", 16))
    p.add_argument("--no-control", action="store_true", help="skip the read-it-whole control probe")
    p.add_argument("--config", type=Path, default=None, help="run config (default: the postgres pack's dev)")
    return p.parse_args(list(argv) if argv is not None else [])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    config = (args.config or bs.config_path()).resolve()
    counts = [int(x) for x in str(args.trials).split(",") if x.strip() and int(x) > 0]
    meta = bs.start_meta(
        config=str(config),
        trial_counts=counts,
        workers=args.workers,
        seed_mb=args.seed_mb,
        psql_mb=args.psql_mb,
    )
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    if args.seed_mb > 0:
        rows += seed_rows(args.seed_mb, notes, control=not args.no_control)
    if args.psql_mb > 0:
        rows += psql_rows(args.psql_mb, notes)
    if counts:
        rows += forge_rows(config, counts, args.workers, notes)
    return bs.report(NAME, rows, meta=meta, notes=notes)


if __name__ == "__main__":
    main(sys.argv[1:])
