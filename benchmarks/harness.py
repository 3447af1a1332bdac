"""The benchmarks' shared library: running ``forge run`` as a child (wall time, sampled peak RSS, machine CPU
busy, its own debug log), reading what the run wrote with forge's own readers (``forgelib.run.results``,
the event log's fold), the commands forge's runner logged, statistics, and the table + JSON report.
Unit-tested in tests/unit/test_bench_harness.py; each ``*_bench.py`` is one benchmark on top of it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from forgelib.docker.labels import RUN, proc_stat, resources_with_labels
from forgelib.run.events import EVENTS_FILE, RunState
from forgelib.run.execute import load_state
from forgelib.run.results import RecordedTrial, read_trials
from forgelib.runner import SubprocessRunner
from forgelib.table import align

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PACK = REPO / "examples" / "multi_service_postgres_reset"
DEFAULT_CONFIG = PACK / "run_configs" / "dev.yaml"
FORGE_TIMEOUT_PER_TRIAL = 180.0  # generous: a trial is seconds; this only bounds a hung run
# How the benchmarks start forge (the program, then `run ...` is appended); a list so tests can substitute.
FORGE_ARGV = [sys.executable, "-m", "forgelib"]


# --------------------------------------------------------------------------------------------- settings
def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def config_path() -> Path:
    return Path(os.environ.get("FORGE_BENCH_CONFIG") or DEFAULT_CONFIG).resolve()


def with_strategy(config: Path, strategy: str, root: Path) -> Path:
    """``config`` with every sql_dump reset binding of its pack set to ``strategy``: a copy of the pack
    under ``root`` (the pack itself when ``strategy`` is the default, ``exact``)."""
    if strategy == "exact":
        return config
    pack = config.parents[1]
    copy = root / f"{pack.name}-{strategy}"
    if not copy.exists():
        shutil.copytree(pack, copy, symlinks=True, ignore=shutil.ignore_patterns("runs"))
        doc = yaml.safe_load((copy / "project.yaml").read_text())
        seeds = doc["assets"]["seeds"]
        for svc in (doc.get("default_environment") or {}).get("services", {}).values():
            reset = (svc or {}).get("reset")
            seed = seeds.get(reset["seed"]) if isinstance(reset, dict) else None
            if isinstance(reset, dict) and isinstance(seed, dict) and seed.get("kind") == "sql_dump":
                reset["strategy"] = strategy
        (copy / "project.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return copy / config.relative_to(pack)


# ------------------------------------------------------------------------------------------------ stats
def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); NaN for no values."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def verdict(r: float, target: float) -> str:
    return "OK" if r <= target else "OVER TARGET"


# ---------------------------------------------------------------------------------------------- machine
def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user/nice
    return total - idle, total


def busy_now(seconds: float = 2.0) -> float:
    """Cores busy over the next ``seconds`` (before a benchmark starts: is someone else using the machine?).
    Unlike the load average, it does not remember the previous benchmark's own work."""
    b0, t0 = cpu_times()
    time.sleep(seconds)
    b1, t1 = cpu_times()
    return round((os.cpu_count() or 1) * ratio(b1 - b0, t1 - t0), 2)


def machine() -> dict[str, Any]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    docker = "?"
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        docker = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout.strip()
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "mem_gb": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "docker": docker,
    }


def start_meta(**extra: Any) -> dict[str, Any]:
    """A report's ``meta`` as a benchmark starts: the load average and the cores someone else keeps busy."""
    return {"loadavg_start": loadavg(), "busy_before": busy_now(), **extra}


# --------------------------------------------------------------------------------------------- forge run
@dataclass
class ForgeRun:
    """One ``forge run`` child process and what it left on disk."""

    argv: list[str]
    rc: int
    wall: float  # seconds, spawn to exit
    output: Path
    log: Path  # this run's own forge debug log (FORGE_LOG)
    pid: int
    stdout: str
    stderr: str
    cpu_busy: float  # machine-wide busy cores, averaged over the run
    peak_rss_kb: int  # the forge process's own VmHWM (sampled), 0 when not sampled
    tree_maxrss_kb: int  # wait4 ru_maxrss: the largest of forge and its waited-for children
    client_cpu_s: float  # user+system CPU of forge and its waited-for children (docker/compose CLIs)
    self_cpu_s: float = 0.0  # user+system CPU of the forge process alone (last /proc sample before exit)

    @property
    def run_dir(self) -> Path | None:
        dirs = [p for p in self.output.iterdir() if p.is_dir()] if self.output.is_dir() else []
        return dirs[0] if len(dirs) == 1 else None

    @cached_property
    def state(self) -> RunState | None:
        """The run's event log folded by forge (``load_state``), None when forge never started the run."""
        started = self.run_dir is not None and (self.run_dir / EVENTS_FILE).is_file()
        return load_state(self.run_dir) if started and self.run_dir else None

    @property
    def run_id(self) -> str:
        return (self.state.run_id if self.state else None) or "?"

    @cached_property
    def summary(self) -> dict[str, Any]:
        """``summary.json`` as forge wrote it ({} when it did not)."""
        path = self.run_dir / "summary.json" if self.run_dir else None
        return json.loads(path.read_text()) if path and path.is_file() else {}

    def trials(self) -> list[RecordedTrial]:
        return read_trials(self.run_dir) if self.run_dir else []

    def passed(self) -> int:
        return sum(1 for t in self.trials() if t.binary_pass)

    def describe_failure(self) -> str:
        tail = "\n".join((self.stderr or self.stdout).strip().splitlines()[-15:])
        return f"forge run exited {self.rc}; log {self.log}\n{tail}"


def forge_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


_TICK = os.sysconf("SC_CLK_TCK")


def _self_cpu(pid: int) -> float | None:
    """utime + stime of ``pid`` in seconds (/proc/<pid>/stat fields 14 and 15), None once it is gone."""
    with contextlib.suppress(OSError):
        if (fields := proc_stat(pid)) is not None:
            return (int(fields[11]) + int(fields[12])) / _TICK  # fields[0] is field 3
    return None


def _vm_hwm_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def run_forge(
    config: Path,
    *,
    repeats: int,
    workers: int | None = None,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    sample_every: float = 0.05,
    extra: Sequence[str] = (),
) -> ForgeRun:
    """``python -m forgelib run --config CONFIG --repeats N [--workers W] --json --output DIR`` as a child.

    Everything the run writes goes under ``workdir`` (results and its own debug log). The child gets its own
    process group; on timeout it is sent SIGINT (forge tears its stacks down), then SIGKILL.
    """
    output = workdir / "out"
    log = workdir / "forge.log"
    argv = [*FORGE_ARGV, "run", "--config", str(config), "--repeats", str(repeats)]
    if workers:
        argv += ["--workers", str(workers)]
    argv += [*extra, "--json", "--output", str(output)]  # extra: e.g. ["--stacks", "warm"]
    limit = timeout if timeout is not None else FORGE_TIMEOUT_PER_TRIAL * max(repeats, 1)
    out_f = (workdir / "stdout.txt").open("w+b")
    err_f = (workdir / "stderr.txt").open("w+b")
    busy0, total0 = cpu_times()
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=out_f,
        stderr=err_f,
        env=forge_env({**(env or {}), "FORGE_LOG": str(log)}),
        cwd=REPO,
        start_new_session=True,
    )
    # A thread blocks in wait4 (exact exit time, and its rusage covers forge *and* the children it waited
    # for) while this one samples forge's /proc entry until it is gone.
    reaped: dict[str, Any] = {}
    done = threading.Event()

    def reap() -> None:
        _, status, usage = os.wait4(proc.pid, 0)
        reaped.update(end=time.monotonic(), status=status, usage=usage)
        done.set()

    threading.Thread(target=reap, daemon=True).start()
    peak, self_cpu = 0, 0.0
    deadline = start + limit
    signalled = False
    try:
        while not done.wait(sample_every):
            peak = max(peak, _vm_hwm_kb(proc.pid))
            self_cpu = _self_cpu(proc.pid) or self_cpu
            now = time.monotonic()
            if now > deadline and not signalled:
                os.killpg(proc.pid, signal.SIGINT)
                signalled, deadline = True, now + 120
            elif now > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
    except BaseException:
        _stop(proc, done)
        raise
    proc.returncode = os.waitstatus_to_exitcode(reaped["status"])
    usage = reaped["usage"]
    tree, client_cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    wall = reaped["end"] - start
    busy1, total1 = cpu_times()
    out_f.seek(0)
    err_f.seek(0)
    stdout = out_f.read().decode(errors="replace")
    stderr = err_f.read().decode(errors="replace")
    out_f.close()
    err_f.close()
    cores = os.cpu_count() or 1
    run = ForgeRun(
        argv=argv,
        rc=proc.returncode,
        wall=wall,
        output=output,
        log=log,
        pid=proc.pid,
        stdout=stdout,
        stderr=stderr,
        cpu_busy=cores * ratio(busy1 - busy0, total1 - total0),
        peak_rss_kb=peak,
        tree_maxrss_kb=tree,
        client_cpu_s=client_cpu,
        self_cpu_s=self_cpu,
    )
    return run


def _stop(proc: subprocess.Popen[bytes], done: threading.Event) -> None:
    """Ctrl-C during a benchmark: let forge tear its stacks down, then make sure it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    if not done.wait(120):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        done.wait(10)


def phase_medians(
    trials: Sequence[RecordedTrial], kinds: Sequence[str], *, each: Sequence[str] = ()
) -> dict[str, float]:
    """Median seconds per phase kind over ``trials``: a trial's ``recipe:db`` and ``recipe:cache`` count as
    one ``recipe`` sample (their sum); kinds in ``each`` are also reported per service (``reset:db``)."""
    per: dict[str, list[float]] = {}
    for t in trials:
        sums: dict[str, float] = {}
        # A reused warm stack's reset steps ran ahead, when the last trial gave it back: on its stack record.
        ahead = {k: v for k, v in (t.stack.get("reset_ahead") or {}).items() if ":" in k}
        for name, secs in {**t.timings, **ahead}.items():
            kind = name.split(":", 1)[0]
            if kind in kinds:
                sums[kind] = sums.get(kind, 0.0) + secs
            if kind in each and name != kind:
                sums[name] = secs
        for k, v in sums.items():
            per.setdefault(k, []).append(v)
    order = {k: i for i, k in enumerate(kinds)}
    return {k: round(median(per[k]), 3) for k in sorted(per, key=lambda k: (order[k.split(":", 1)[0]], k))}


def checked_run(
    config: Path,
    *,
    repeats: int,
    workers: int,
    root: Path,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> ForgeRun:
    """``run_forge`` in a fresh directory under ``root`` for a benchmark arm that must not fail: every trial
    passed and nothing of the run is left on the engine, or the benchmark stops (SystemExit) saying what.
    ``env``: more variables for the forge child (an arm's switch)."""
    label = "-".join(a.strip("-") for a in extra) or "run"
    work = Path(tempfile.mkdtemp(prefix=f"{label}-w{workers}-", dir=root))
    run = run_forge(config, repeats=repeats, workers=workers, workdir=work, extra=extra, env=env)
    if run.rc != 0 or run.passed() != len(run.trials()) or not run.trials():
        raise SystemExit(f"{config} {' '.join(extra)} --workers {workers}: {run.describe_failure()}")
    if left := leftovers(run.run_id):
        raise SystemExit(f"{run.run_id} left {left}")
    return run


def leftovers(run_id: str) -> list[str]:
    """Containers, networks and volumes still labelled with this run (should be none)."""
    found = resources_with_labels(SubprocessRunner(), {RUN: run_id})
    return [f"{kind} {name}" for kind, names in found.items() for name in names]


# ------------------------------------------------------------------------------------------- forge log
LOG_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?P<pid>\d+) \S+ \w+ rc=(?P<rc>\S+) in "
    r"(?P<secs>[\d.]+)s: (?P<cmd>.*)$"
)
_COMPOSE_OPTS_WITH_VALUE = {
    "-p",
    "--project-name",
    "-f",
    "--file",
    "--env-file",
    "--project-directory",
    "--profile",
    "--ansi",
    "--progress",
    "--parallel",
}


@dataclass(frozen=True)
class Command:
    end: float  # epoch seconds
    seconds: float
    rc: str
    argv: tuple[str, ...]

    @property
    def start(self) -> float:
        return self.end - self.seconds

    @property
    def kind(self) -> str:
        return command_kind(self.argv)


def read_commands(log: Path, pid: int | None = None) -> list[Command]:
    """Every finished external command in a forge debug log (the runner logs ``rc=N in S.SSs: argv``)."""
    commands: list[Command] = []
    if not log.is_file():
        return commands
    for line in log.read_text(errors="replace").splitlines():
        m = LOG_LINE.match(line)
        if not m or (pid is not None and int(m["pid"]) != pid):
            continue
        ts = dt.datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        commands.append(Command(ts, float(m["secs"]), m["rc"], tuple(m["cmd"].split())))
    return commands


def command_kind(argv: Sequence[str]) -> str:
    """``docker compose -p x -f y up -d --wait svc`` -> ``compose up``; ``... exec -T db psql`` ->
    ``compose exec psql``; ``docker image inspect x`` -> ``docker image inspect``."""
    if not argv:
        return "?"
    prog = Path(argv[0]).name
    if prog != "docker":
        return prog
    rest = list(argv[1:])
    if rest and rest[0] == "compose":
        i = 1
        while i < len(rest) and rest[i].startswith("-"):
            i += 2 if rest[i] in _COMPOSE_OPTS_WITH_VALUE else 1
        verb = rest[i] if i < len(rest) else "?"
        if verb in {"exec", "run"}:
            j = i + 1
            while j < len(rest) and rest[j].startswith("-"):
                j += 2 if rest[j] in {"-e", "--env", "-w", "--workdir", "-u", "--user"} else 1
            tool = Path(rest[j + 1]).name if j + 1 < len(rest) else "?"
            return f"compose {verb} {tool}"
        return f"compose {verb}"
    words = [w for w in rest if not w.startswith("-")][:2]
    if words and words[0] in {"image", "volume", "network", "container", "system"}:
        return "docker " + " ".join(words)
    return "docker " + (words[0] if words else "?")


# ----------------------------------------------------------------------------------------------- report
def fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return str(int(value)) if value.is_integer() and abs(value) >= 100 else f"{value:.3f}"
    return str(value)


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows of dicts as a table: the columns in the order they first appear, a dashed line under them."""
    if not rows:
        return "(no rows)"
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    return "\n".join(align([cols, ["-" * w for w in widths], *cells]))


def report(
    name: str, rows: list[dict[str, Any]], *, meta: Mapping[str, Any], notes: Sequence[str] = ()
) -> dict[str, Any]:
    """Print ``rows`` as a table (and ``notes`` under it) and write ``benchmarks/results/<name>.json``."""
    doc = {
        "benchmark": name,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "loadavg_end": loadavg(),
        **meta,
        "rows": rows,
        "notes": list(notes),
    }
    busy = meta.get("busy_before")
    idle = f"; {busy} cores busy just before it started" if busy is not None else ""
    print(
        f"\n== {name} ==  (loadavg at start {meta.get('loadavg_start', '?')}, end {doc['loadavg_end']}{idle})"
    )
    print(table(rows))
    for note in notes:
        print(f"  * {note}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"  -> {out.relative_to(REPO)}")
    return doc
