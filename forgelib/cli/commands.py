"""The bodies of the stack and engine commands (``forge provision``, ``teardown``, ``reap``, ``engine``,
``images``): each loads what it needs, calls the library, prints. ``forgelib/cli/tasks.py`` binds them to the
command line; the spec commands live with the spec (``spec/validate.py``, ``spec/stamp.py``) and
``forge run`` with the run (``run/cli.py``)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from forgelib.docker import argv as dk
from forgelib.docker import labels as lab
from forgelib.docker.builds import built_images
from forgelib.docker.compose import ComposeProject, is_valid_name
from forgelib.docker.engine import ensure_engine
from forgelib.docker.images import STAND_INS, ensure_images
from forgelib.errors import ForgeError, ProvisionError, UsageError
from forgelib.run.ids import new_run_id
from forgelib.runner import SubprocessRunner
from forgelib.spec.loader import load_project_config
from forgelib.spec.models import Task, Timeouts
from forgelib.spec.validate import print_notices
from forgelib.stacks import DockerBackend
from forgelib.stacks.live import LiveStacks, interruptible
from forgelib.stacks.provision import DEFAULT_TASK, SERVICES_DIR, ProvisionCache, StackContext
from forgelib.stacks.reaper import PROVISION_DIR, reap, remove_work_dir
from forgelib.table import align


def main_provision(
    project: str, task: str | None, keep: bool, as_json: bool, profiles: Sequence[str] = ()
) -> int:
    """``forge provision``: one trial stack with its seeds; torn down again unless ``keep``.

    An environment whose services are all ``shared`` gets a stack of its own here too (there is no run to
    share it with), so it is torn down — or kept and labelled as kept — like any other. The temporary
    directory (override file, service logs) goes with the stack, unless a failure points the user at
    its logs or ``keep`` leaves the stack up. ``profiles``: compose profiles to enable (``--profile``)."""
    proj = load_project_config(Path(project))
    print_notices(proj.notices, prefix="forge: ")
    chosen = proj.task(task) if task else Task(DEFAULT_TASK, proj.path, "", proj.environment)
    timeouts = Timeouts()
    runner = SubprocessRunner(default_timeout=timeouts.command)
    run_id = "prov-" + new_run_id().lower()  # as before: prov-<date>t<time>z-<hex>
    # Named after this process and on the stack's labels: `forge teardown` removes it with a kept stack,
    # `forge reap` once this process is gone (SIGKILL; a failure's logs, kept for the user to read).
    trial_dir = lab.owned_temp_dir(PROVISION_DIR)
    keep_dir = keep
    stacks = LiveStacks()
    cache = ProvisionCache()
    try:
        # Ctrl-C/SIGTERM while provisioning: provisioning's own failure path tears the stack down; the
        # registry covers everything after it returned, until the stack is down (or kept, as asked).
        with interruptible(stacks) as stop:
            ctx = StackContext(
                proj,
                timeouts,
                stop.guard(runner),
                cache,
                profiles=tuple(profiles),
                kept=keep,
                work_dir=trial_dir,
            )
            backend = DockerBackend(ctx, shared=None)  # no run to share a stack with: this one is its own
            try:
                trial = backend.provision(chosen, run_id=run_id, trial_index=0, trial_dir=trial_dir)
            except ProvisionError:
                if not stop.requested:  # a failure, not Ctrl-C: its logs are what the user reads next
                    keep_dir = True
                    print(
                        f"forge: service logs: {trial_dir / SERVICES_DIR} (kept until `forge reap`)",
                        file=sys.stderr,
                    )
                raise
            if not keep:
                stacks.add(trial.name, lambda graceful: backend.teardown(trial, graceful=graceful))
            report: dict[str, Any] = {
                "name": trial.name,
                "run_id": run_id,
                "trial_dir": str(trial_dir),
                "services": {**{svc: [] for svc in trial.environment.services}, **trial.ports},
                "timings": {k: round(v, 3) for k, v in trial.timings.items()},
                "bare_seeds": {k: m.record() for k, m in trial.bare_seeds.items()},
                "kept": keep,
            }
            if keep:
                report["teardown_command"] = f"forge teardown --name {trial.name}"
            else:
                t0 = time.monotonic()
                failed = stacks.teardown(trial.name)
                if failed is not None:
                    raise ForgeError(f"tearing down {trial.name} failed: {failed}; `forge reap` removes it")
                report["timings"]["teardown"] = round(time.monotonic() - t0, 3)
                del report["trial_dir"]  # removed below
    finally:
        if not keep_dir:
            shutil.rmtree(trial_dir, ignore_errors=True)
        if not keep:  # a kept stack keeps the image it runs; removing the stack is the user's call
            cache.builds.finish(runner, timeouts.command)
    print(json.dumps(report, indent=2) if as_json else render_report(report))
    return 0


def render_report(report: Mapping[str, Any]) -> str:
    rows = [
        ("", svc, ", ".join(ports) or "(no published ports)")
        for svc, ports in sorted(report["services"].items())
    ]
    rows += [
        ("", svc, f"bare seed: {m['host_path']} at {m['path']} (${m['env']}, read-only)")
        for svc, m in sorted(report["bare_seeds"].items())
    ]
    lines = [f"compose project: {report['name']}", "services:", *align(rows, ragged_last=True)]
    lines.append("timings:")
    for phase, seconds in report["timings"].items():
        lines.append(f"  {phase:<24} {seconds:7.2f}s")
    if report["kept"]:
        lines.append(f"left up; tear it down with: {report['teardown_command']}")
    else:
        lines.append("torn down")
    return "\n".join(lines)


def main_teardown(name: str) -> int:
    """``forge teardown --name``: remove a stack ``forge provision --keep`` left up."""
    if not name:
        raise UsageError("--name is required: the compose project name `forge provision --keep` printed")
    if not is_valid_name(name):
        raise ForgeError(f"{name!r} is not a compose project name")
    runner = SubprocessRunner()
    mine = {lab.COMPOSE_PROJECT: name, lab.MANAGED: "true"}
    if lab.is_empty(lab.resources_with_labels(runner, mine)):
        raise ForgeError(f"no forge stack named {name!r} on this engine (nothing is labelled with it)")
    t0 = time.monotonic()
    # An empty working directory: no compose file anywhere near can retarget the call; compose finds the
    # project's containers, networks and volumes by its own labels.
    work_dirs = lab.label_values(runner, mine, lab.WORK_DIR)
    with tempfile.TemporaryDirectory(prefix="forge-teardown-") as empty:
        ComposeProject(name, (), runner, cwd=Path(empty)).down()
    left = lab.resources_with_labels(runner, mine)
    if not lab.is_empty(left):
        raise ForgeError(f"{name}: still present after down: {json.dumps(left)}")
    for d in work_dirs:  # the override and logs `forge provision` wrote for it
        remove_work_dir(d)
    built = built_images(runner, mine)  # what it built for `build:` services, kept with the stack
    if built:
        res = runner.run(dk.rm(built, kind="image"), timeout=120, check=False)
        if res.rc != 0 and "No such image" not in res.stderr:
            raise ForgeError(f"{name}: removing its built image(s) failed: {res.stderr.strip()}")
    print(f"removed {name} in {time.monotonic() - t0:.2f}s")
    return 0


def main_reap(dry_run: bool, run_id: str | None, as_json: bool) -> int:
    """``forge reap``: 0 when every removal succeeded (kept projects are not failures), 1 otherwise."""
    report = reap(SubprocessRunner(), run_id=run_id, dry_run=dry_run)
    if as_json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(report.table())
    return 1 if report.failed else 0


def main_engine() -> int:
    """``forge engine``."""
    status = ensure_engine(SubprocessRunner())
    print(f"engine: ready: docker engine {status.server}, compose {status.compose}")
    return 0


def main_images(force: bool) -> int:
    """``forge images``: make sure an engine answers, then build or reuse the stand-ins."""
    runner = SubprocessRunner()
    ensure_engine(runner)
    # flushed: a CI log shows each image as it finishes, not all at the end
    ensure_images(runner, force=force, say=lambda line: print(line, flush=True))
    print(
        "images: compose calls made by forge now use these (unless you set the variable yourself): "
        + ", ".join(f"{s.var}={s.tag}" for s in STAND_INS.values())
    )
    return 0
