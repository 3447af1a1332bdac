"""The forge commands, as one Invoke namespace: ``forge X`` (installed) and ``invoke X`` (in a checkout,
through the top-level tasks.py) are the same tasks. Each task is a thin line over one forgelib function;
``guard.guarded`` maps what it raises to an exit code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from invoke.collection import Collection
from invoke.context import Context
from invoke.tasks import task

from forgelib.cli.args import Command
from forgelib.cli.checkpoints import main_checkpoint, main_fork, main_restore
from forgelib.cli.commands import main_engine, main_images, main_provision, main_reap, main_teardown
from forgelib.cli.exits import Number, guarded
from forgelib.cli.grade import main_grade
from forgelib.cli.run import main_run
from forgelib.cli.snapshots import main_snapshots
from forgelib.report.page import main_report
from forgelib.run.options import RunOptions
from forgelib.scaffold.init import DEFAULT_DIR, main_init
from forgelib.spec.stamp import main_stamp
from forgelib.spec.validate import main_validate

# Numeric options are taken as text and converted by ``guard.Number`` inside the guard: invoke's own int()
# cast raises a traceback on `--repeats x`, and "" tells an option left out from an explicit `--repeats 0`
# (which still reaches the command's own check, a usage error). ``numbers=`` tells forge's program to
# check them while parsing and show them as INT / NUMBER.
# Required options still get a default: invoke makes a parameter without one positional, and a positional
# swallows `--help` as its value (`invoke run --help` would try to load a config named "--help"). forge's
# program takes ``main=`` positionally (`forge run CONFIG`) and its --flag as well.


def command(**kwargs: Any) -> Callable[[Callable[..., None]], Command]:
    """``@task`` making a ``cliargs.Command``: short flags from ``cliargs.SHORT_FLAGS`` only."""
    made: Callable[[Callable[..., None]], Command] = task(klass=Command, **kwargs)
    return made


@command(main="directory", help={"directory": "where to write it: a new or empty directory"})
def init(c: Context, directory: str = DEFAULT_DIR) -> None:
    """Write a new, runnable project: postgres (seeded) and redis, one task with its oracle and grading."""
    guarded(main_init, directory=directory)


@command(
    main="project",
    help={"project": "project directory or its project.yaml", "json": "print a machine-readable report"},
)
def validate(c: Context, project: str = ".", json: bool = False) -> None:
    """Validate a project's spec files: schemas, references, paths, digests."""
    guarded(main_validate, project=project, as_json=json)


@command(
    main="project",
    help={"project": "project directory or its project.yaml", "check": "write nothing; exit 1 if stale"},
)
def stamp(c: Context, project: str = ".", check: bool = False) -> None:
    """Compute seed digests and write them into project.yaml (comments and layout kept)."""
    guarded(main_stamp, project=project, check=check)


@command()
def engine(c: Context) -> None:
    """Install and start a Docker engine and compose v2 if they do not answer (idempotent)."""
    guarded(main_engine)


@command(help={"force": "rebuild even when the content hash is unchanged"})
def images(c: Context, force: bool = False) -> None:
    """Build the offline stand-in images (postgres, redis, python) from Debian packages."""
    guarded(main_images, force=force)


@command(
    main="project",
    help={
        "project": "project directory or its project.yaml",
        "task": "provision this task's environment (default: the project's)",
        "keep": "leave the stack up and print the teardown command",
        "json": "print the result as JSON",
        "profile": "a compose profile to enable in the stack (docker compose --profile NAME), as a run "
        "config's `profiles:` does for `forge run`; repeat for several",
        "from_checkpoint": "start the stacks at this checkpoint (`forge checkpoint` printed it); kept",
        "count": "with --from-checkpoint: how many stacks",
    },
    iterable=["profile"],
    numbers={"count": int},
)
def provision(
    c: Context,
    project: str = ".",
    task: str = "",
    keep: bool = False,
    json: bool = False,
    profile: list[str] | None = None,
    from_checkpoint: str = "",
    count: str = "",
) -> None:
    """Provision one trial stack and apply its seeds; tear it down unless --keep."""
    if from_checkpoint:
        number = Number("--count", count, int)
        guarded(main_fork, project=project, checkpoint=from_checkpoint, count=number, as_json=json)
        return
    guarded(
        main_provision,
        project=project,
        task=task or None,
        keep=keep,
        as_json=json,
        profiles=tuple(profile or ()),
    )


@command(
    main="stack",
    help={
        "stack": "the compose project name `forge provision --keep` printed",
        "project": "the stack's project directory or its project.yaml",
        "json": "print the checkpoint's manifest as JSON",
    },
)
def checkpoint(c: Context, stack: str = "", project: str = ".", json: bool = False) -> None:
    """Capture a live stack's reset services at one moment; print the checkpoint's id."""
    guarded(main_checkpoint, stack=stack, project=project, as_json=json)


@command(
    main=("stack", "id"),
    help={
        "stack": "the compose project name `forge provision --keep` printed",
        "id": "the checkpoint `forge checkpoint` printed",
        "project": "the stack's project directory or its project.yaml",
    },
)
def restore(c: Context, stack: str = "", id: str = "", project: str = ".") -> None:
    """Roll a live stack's reset services back to a checkpoint, in place."""
    guarded(main_restore, stack=stack, checkpoint=id, project=project)


@command(main="name", help={"name": "the compose project name `forge provision --keep` printed"})
def teardown(c: Context, name: str = "") -> None:
    """Tear down a stack left up by `forge provision --keep`."""
    guarded(main_teardown, name=name)


@command(
    main="config",
    numbers={"repeats": int, "workers": int, "retries": int, "memory_budget_mb": int},
    help={
        "config": "a run config, e.g. PACK/run_configs/dev.yaml",
        "repeats": "trials per task (overrides the config)",
        "workers": "trials at once (overrides the config)",
        "stacks": "fresh (a stack per trial) or warm (one per worker, reset in place); overrides the config",
        "output": "results directory (overrides the config)",
        "resume": "a run id: run only the trials that did not finish",
        "json": "print the summary as JSON on stdout",
        "junit": "also write JUnit XML here",
        "report": "also write the run's HTML report (report.html in the run directory)",
        "retries": "rerun a retryable failed attempt on a fresh stack up to N times (overrides the config)",
        "snapshots": "start reset services from golden snapshots: fresh stacks, and each warm stack's first "
        "provisioning (overrides the config's `snapshots`)",
        "no_snapshots": "seed every fresh stack the normal way (overrides the config's `snapshots`)",
        "cluster": "a Ray cluster address: run the trials on its Docker nodes (pip install 'forgelib[ray]')",
        "memory_budget_mb": "MiB the run's stacks may use together (overrides the config; default: 80% free)",
        "agent": "what solves every trial: `oracle` (each task's) or an agent file (overrides the config)",
    },
)
def run(
    c: Context,
    config: str = "",
    repeats: str = "",
    workers: str = "",
    output: str = "",
    resume: str = "",
    stacks: str = "",
    json: bool = False,
    junit: str = "",
    report: bool = False,
    retries: str = "",
    snapshots: bool = False,
    no_snapshots: bool = False,
    cluster: str = "",
    memory_budget_mb: str = "",
    agent: str = "",
) -> None:
    """Run trials: provision, solve (each task's oracle or --agent), state checks, results on disk."""
    guarded(
        lambda: main_run(
            RunOptions(
                config=config,
                repeats=Number("--repeats", repeats).whole(),
                workers=Number("--workers", workers).whole(),
                stacks=stacks or None,
                output=output or None,
                resume=resume or None,
                as_json=json,
                junit=junit or None,
                report=report,
                retries=Number("--retries", retries).whole(),
                snapshots=snapshots,
                no_snapshots=no_snapshots,
                cluster=cluster or None,
                memory_budget_mb=Number("--memory-budget-mb", memory_budget_mb).whole(),
                agent=agent or None,
            )
        )
    )


@command(
    main="run_dir",
    positional=["run_dir"],
    help={
        "run_dir": "a run's directory (the one `forge run` printed: OUTPUT/<run_id>)",
        "output": "write the page here; a directory gets report.html inside it (default: RUN_DIR)",
        "open": "open the page in a web browser",
    },
)
def report(c: Context, run_dir: str | None = None, output: str = "", open: bool = False) -> None:
    """Write a run's report: one self-contained HTML page (results, timeline, where the time went)."""
    guarded(main_report, run_dir=run_dir or "", output=output or None, open_browser=open)


@command(
    main="run_dir",
    positional=["run_dir"],
    help={
        "run_dir": "a finished run's directory (the one `forge run` printed: OUTPUT/<run_id>)",
        "project": "the project whose rubrics grade it (default: the one the run recorded)",
        "json": "print the regrade record as JSON",
    },
)
def grade(c: Context, run_dir: str | None = None, project: str = "", json: bool = False) -> None:
    """Re-score a finished run under its rubrics as they are now, from its traces and recorded evidence."""
    guarded(main_grade, run_dir=run_dir or "", project=project or None, as_json=json)


@command(
    help={
        "dry_run": "only report what would be removed",
        "run": "only this run id",
        "json": "print the report as JSON",
    }
)
def reap(c: Context, dry_run: bool = False, run: str = "", json: bool = False) -> None:
    """Remove stacks whose owning forge process is provably gone; say why for each kept one."""
    guarded(main_reap, dry_run=dry_run, run_id=run or None, as_json=json)


@command(
    main="action",
    positional=["action"],
    numbers={"older_than": float},
    help={
        "action": "ls | prune | verify",
        "all": "prune: every golden and checkpoint",
        "older_than": "prune: goldens and checkpoints taken more than DAYS days ago",
        "unused": "prune: goldens no trial can restore (no tag names their image, or another format)",
        "checkpoint": "prune: only this checkpoint (its id, ck-...)",
        "project": "only the goldens and checkpoints captured for this project (project.yaml's name)",
        "json": "print the result as JSON",
    },
)
def snapshots(
    c: Context,
    action: str,
    all: bool = False,
    older_than: str = "",
    unused: bool = False,
    checkpoint: str = "",
    project: str = "",
    json: bool = False,
) -> None:
    """Goldens and checkpoints on this engine: ls, prune (--all | --older-than DAYS | --unused |
    --checkpoint ID), verify."""
    guarded(
        main_snapshots,
        action=action,
        all=all,
        older_than=Number("--older-than", older_than, float),
        unused=unused,
        as_json=json,
        project=project or None,
        checkpoint=checkpoint or None,
    )


ns = Collection(
    init,
    validate,
    stamp,
    engine,
    images,
    provision,
    checkpoint,
    restore,
    teardown,
    run,
    report,
    grade,
    reap,
    snapshots,
)
