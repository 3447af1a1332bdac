"""``forge checkpoint STACK``, ``forge restore STACK ID`` and ``forge provision --from-checkpoint ID``: the
checkpoint API (``forgelib.stacks.checkpoints``) on stacks ``forge provision --keep`` left up."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from forgelib import stacks
from forgelib.docker import labels as lab
from forgelib.docker.compose import ComposeProject, is_valid_name
from forgelib.errors import ForgeError, UsageError
from forgelib.runner import SubprocessRunner
from forgelib.spec.loader import load_project_config
from forgelib.spec.models import Project, Timeouts
from forgelib.stacks import checkpoints
from forgelib.stacks.provision import OVERRIDE_FILE
from forgelib.stacks.reaper import PROVISION_DIR
from forgelib.stacks.stack import Stack


def kept_stack(project: Project, name: str, runner: SubprocessRunner, timeouts: Timeouts) -> Stack:
    """The live stack ``name`` (``forge provision --keep``'s) of ``project``, as provisioning returned it:
    its compose files and the override in its work directory (and the images a restore recreated services
    from)."""
    if not name or not is_valid_name(name):
        raise UsageError(f"{name!r} is not a compose project name (the one `forge provision --keep` printed)")
    mine = {lab.COMPOSE_PROJECT: name, lab.MANAGED: "true"}
    dirs = sorted(lab.label_values(runner, mine, lab.WORK_DIR))
    override = Path(dirs[0]) / OVERRIDE_FILE if dirs else None
    if override is None or not override.is_file():
        raise ForgeError(
            f"no forge stack named {name!r} with its files on this host (`forge provision --keep` prints it)"
        )
    env = project.environment
    restored = override.parent / checkpoints.RESTORE_FILE  # a service `forge restore` recreated
    files = (*env.compose_files, override, *([restored] if restored.is_file() else []))
    compose = ComposeProject(name, files, runner, timeouts)
    config = compose.config()
    compose = compose.with_secrets(config)
    return Stack(
        name=name, environment=env, compose=compose, timings={}, bare_seeds={}, trial_dir=override.parent,
        config=config, ports=compose.published_ports(),
    )  # fmt: skip


def main_checkpoint(stack: str, project: str, as_json: bool) -> int:
    proj = load_project_config(Path(project))
    runner, timeouts = SubprocessRunner(), Timeouts()
    trial = kept_stack(proj, stack, runner, timeouts)
    ck = checkpoints.capture(proj, trial, runner, timeouts)
    print(json.dumps(ck.record(), indent=2) if as_json else ck.id)
    return 0


def main_restore(stack: str, checkpoint: str, project: str) -> int:
    proj = load_project_config(Path(project))
    runner, timeouts = SubprocessRunner(), Timeouts()
    trial = kept_stack(proj, stack, runner, timeouts)
    checkpoints.roll_back(proj, trial, checkpoint, runner, timeouts)
    print(f"restored {stack} to {checkpoint}")
    return 0


def main_fork(project: str, checkpoint: str, count: int | None, as_json: bool) -> int:
    """``forge provision --from-checkpoint ID --count N``: N kept stacks at the checkpoint."""
    count = 1 if count is None else count
    if count < 1:
        raise UsageError(f"--count must be at least 1, not {count}")
    proj = load_project_config(Path(project))
    work = lab.owned_temp_dir(PROVISION_DIR)
    try:
        with stacks.open(proj, scope="stack", kept=True, work_dir=work) as opened:
            forks = checkpoints.fork(opened, checkpoint, count, trial_dir=work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    out: list[dict[str, Any]] = [
        {"name": f.name, "services": dict(f.ports), "teardown_command": f"forge teardown --name {f.name}"}
        for f in forks
    ]
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        for f in out:
            print(f"{f['name']}  (forge teardown --name {f['name']})")
    return 0
