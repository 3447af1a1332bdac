"""inspect_ai's own ``docker`` sandbox against forge's (fresh, with goldens, warm) on the postgres pack's
compose file, in one process, one run: the same 8 samples (a one-command solver: the sandbox's cost, not
a model's) per arm, one sample at a time.

Per arm: each sample's sandbox time (``sample_init`` + ``sample_cleanup``, timed around the provider's own
classmethods), its median and p95, and the whole eval's wall; ratios against the ``docker`` arm. inspect's
docker sandbox brings the compose file up as written (no seed: it has none to apply), with ``x-default`` on
``runner`` and the offline stand-in images (``FORGE_IMAGE_*`` from ``forgelib.docker.images``, as forge sets
them); forge's arms seed app-db with the pack's ``postgres_baseline`` every sample. The goldens arm captures
its golden in ``task_init`` (outside the per-sample figure); the benchmark removes it at the end. Needs
``.[inspect]``.

    python -m benchmarks inspect [--samples 8] [--arms docker,fresh,goldens,warm]
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from benchmarks.harness import median, percentile, ratio, report, start_meta, verdict
from forgelib.docker.images import ImageFacts
from forgelib.runner import SubprocessRunner

REPO = Path(__file__).resolve().parents[1]
PACK = REPO / "examples" / "multi_service_postgres_reset"
ARMS = ("docker", "fresh", "goldens", "warm")
TARGET = 0.2  # warm ÷ docker, per-sample sandbox time


def _docker_compose(dest: Path) -> Path:
    """The pack's compose file for inspect's docker sandbox: ``runner`` marked ``x-default``, relative bind
    paths made absolute (the copy lives elsewhere), and read-write: inspect allows a read-only bind only on
    Docker Engine 25+ with recursive read-only mounts, which this engine (20.10) lacks."""
    src = PACK / "shared" / "environment.compose.yaml"
    doc = yaml.safe_load(src.read_text())
    for svc in doc["services"].values():
        vols = svc.get("volumes") or []
        svc["volumes"] = [
            str((src.parent / v.split(":", 1)[0]).resolve()) + ":" + v.split(":", 1)[1].removesuffix(":ro")
            if v.startswith(".")
            else v
            for v in vols
        ]
    doc["services"]["runner"]["x-default"] = True
    # inspect's switch for writable binds (its own name): the read-only ones cannot be had here
    doc["x-inspect_docker_sandbox"] = {"unsafe_allow_writable_host_mounts": True}
    doc.pop("name", None)
    out = dest / "compose.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def _timed(cls: type, record: list[float]) -> Callable[[], None]:
    """Wrap ``cls``'s sample_init/sample_cleanup to add each sample's seconds to ``record``; the undo."""
    init, cleanup = cls.__dict__["sample_init"], cls.__dict__["sample_cleanup"]
    pending: dict[int, float] = {}

    @functools.wraps(init.__func__)
    async def sample_init(c: type, *args: Any) -> Any:
        t0 = time.monotonic()
        envs = await init.__func__(c, *args)
        pending[id(next(iter(envs.values())))] = time.monotonic() - t0
        return envs

    @functools.wraps(cleanup.__func__)
    async def sample_cleanup(
        c: type, task_name: str, config: Any, envs: dict[str, Any], interrupted: bool
    ) -> None:
        t0 = time.monotonic()
        await cleanup.__func__(c, task_name, config, envs, interrupted)
        first = next(iter(envs.values()), None)
        record.append(pending.pop(id(first), 0.0) + time.monotonic() - t0)

    setattr(cls, "sample_init", classmethod(sample_init))  # noqa: B010
    setattr(cls, "sample_cleanup", classmethod(sample_cleanup))  # noqa: B010

    def undo() -> None:
        setattr(cls, "sample_init", init)  # noqa: B010
        setattr(cls, "sample_cleanup", cleanup)  # noqa: B010

    return undo


def _remove_own_goldens() -> None:
    """The goldens arm's snapshots (this process is their owner): a benchmark leaves nothing behind."""
    runner = SubprocessRunner()
    owned = ["--filter", "label=io.forgelib.golden", "--filter", f"label=io.forgelib.owner.pid={os.getpid()}"]
    ids = runner.run(["docker", "images", "-q", *owned]).stdout.split()
    if ids:
        runner.run(["docker", "image", "rm", "--force", *sorted(set(ids))], check=False)


def _skip_engine_version_check() -> None:
    """inspect's docker sandbox refuses Docker Engine < 24.0.6; this box's is 20.10.24 (docs/ci-environment).
    The compose v2 calls it makes work there (compose 2.40 does the work), so the benchmark skips only
    that check, and says so in its notes."""
    import inspect_ai.util._sandbox.docker.docker as docker_sandbox

    async def no_check() -> None:
        return None

    docker_sandbox.validate_prereqs = no_check


def _arm(name: str, samples: int, compose: Path, log_dir: Path) -> dict[str, Any]:
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.solver import Generate, Solver, TaskState, solver
    from inspect_ai.util import SandboxEnvironmentSpec, sandbox
    from inspect_ai.util._sandbox.docker.docker import DockerSandboxEnvironment

    from forgelib.inspect import ForgeConfig
    from forgelib.inspect.environment import ForgeSandboxEnvironment

    @solver  # type: ignore[untyped-decorator]  # Any without inspect
    def one_command() -> Solver:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            got = await sandbox().exec(["sh", "-c", "ls /work >/dev/null && echo ok"])
            assert got.stdout.strip() == "ok", got
            return state

        return solve

    if name == "docker":
        spec, cls = SandboxEnvironmentSpec("docker", str(compose)), DockerSandboxEnvironment
        _skip_engine_version_check()
    else:
        cfg = ForgeConfig(
            project=str(PACK), task="read_widget", default="runner",
            stacks="warm" if name == "warm" else "fresh", goldens=name == "goldens",
        )  # fmt: skip
        spec, cls = SandboxEnvironmentSpec("forge", cfg), ForgeSandboxEnvironment
    task = Task(
        dataset=[Sample(id=f"s{i}", input="x") for i in range(samples)], solver=one_command(), sandbox=spec
    )
    record: list[float] = []
    undo = _timed(cls, record)
    t0 = time.monotonic()
    try:
        (log,) = eval(task, model="mockllm/model", display="none", log_dir=str(log_dir), max_samples=1)
    finally:
        undo()
    wall = time.monotonic() - t0
    if log.status != "success":
        raise SystemExit(f"arm {name}: the eval ended {log.status}: {log.error}")
    return {
        "arm": name,
        "samples": len(record),
        "sandbox_median_s": median(record),
        "sandbox_p95_s": percentile(record, 95),
        "eval_wall_s": wall,
        "raw": [round(x, 3) for x in record],
    }


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks inspect", description=__doc__)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--arms", default=",".join(ARMS))
    a = p.parse_args(argv)
    arms = [x for x in a.arms.split(",") if x]
    if "docker" not in arms or any(x not in ARMS for x in arms):
        raise SystemExit(f"--arms: a comma list of {', '.join(ARMS)}, with docker (the baseline)")
    meta = start_meta(samples=a.samples)
    for k, v in ImageFacts().env(SubprocessRunner()).items():  # inspect's docker arm: the stand-ins
        os.environ.setdefault(k, v)
    rows = []
    with tempfile.TemporaryDirectory(prefix="forge-bench-inspect-") as tmp:
        compose = _docker_compose(Path(tmp))
        try:
            for arm in arms:
                rows.append(_arm(arm, a.samples, compose, Path(tmp) / "logs"))
        finally:
            _remove_own_goldens()
    base = rows[0]
    raw = {r["arm"]: r.pop("raw") for r in rows}
    for r in rows:
        r["sandbox_vs_docker"] = ratio(r["sandbox_median_s"], base["sandbox_median_s"])
        r["wall_vs_docker"] = ratio(r["eval_wall_s"], base["eval_wall_s"])
    notes = [
        "docker arm on Docker Engine 20.10: inspect's >= 24.0.6 check skipped, the pack's :ro binds made rw "
        "(x-inspect_docker_sandbox.unsafe_allow_writable_host_mounts)"
    ]
    warm = next((r for r in rows if r["arm"] == "warm"), None)
    if warm is not None:
        notes.append(
            f"warm ÷ docker per-sample sandbox time {warm['sandbox_vs_docker']:.3f} "
            f"(target ≤ {TARGET}): {verdict(warm['sandbox_vs_docker'], TARGET)}"
        )
    report("inspect", rows, meta={**meta, "raw_sandbox_seconds": raw}, notes=notes)
