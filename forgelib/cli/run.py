"""``forge run``: load the run config, let command-line options override it, run, report.

Progress goes to stderr; the final table to stdout, or with ``--json`` the summary as JSON on stdout.
Exit 0 when every trial passed, 1 when any did not (2 for usage errors, raised as ``UsageError``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forgelib import clients, stacks
from forgelib.cli import live
from forgelib.errors import EXIT_OK, EXIT_USER, ForgeError, UsageError
from forgelib.run import tools
from forgelib.run.events import RunState, summarize
from forgelib.run.execute import RunPlan, run_project
from forgelib.run.options import RunOptions
from forgelib.runner import SubprocessRunner, merged_env
from forgelib.spec.loader import load_agent, load_project_config, load_run_config
from forgelib.spec.models import Agent, Project, RunConfig, Task
from forgelib.spec.validate import print_notices
from forgelib.stacks.live import LiveStacks, interruptible
from forgelib.table import align

if TYPE_CHECKING:
    from forgelib.cluster.connect import Joining


def main_run(options: RunOptions) -> int:
    """``forge run``: the run ``options`` describe (with the run config they name)."""
    options.check()
    joining = _start_joining(options.cluster)  # --cluster: Ray's import and the join start now, on a thread
    cfg = load_run_config(Path(options.config))
    address = options.cluster or cfg.cluster
    if address and joining is None:  # the run config's `cluster:`
        joining = _start_joining(address)
    project = load_project_config(cfg.project)
    solver = choose_agent(options.agent, cfg, project)
    if solver is not None or any(tools.declares_tools(t) for t in project.tasks):
        tools.preload()  # every trial serves tools: load the server now, not in the first trial
    plan = build_plan(cfg, project, options, agent=solver)
    use_snapshots = options.use_snapshots(cfg.snapshots)
    if joining is not None:
        state = _run_on_cluster(joining, plan, project, cfg.profiles, use_snapshots)
    else:
        if plan.stacks == "warm" or use_snapshots:
            # Resets, fingerprints and golden checks talk to the services over psycopg/redis: load them
            # now, not inside the first trial's steps. A fresh run without goldens never uses them (a
            # plugin or a check that does use them loads them then).
            clients.load()
        # What forge changes in the compose stacks (and what stays risky), once per run, before any trial.
        print_notices(project.notices, prefix="forge: ")
        # SIGINT/SIGTERM: stop launching, tear down live stacks, record it, exit 130 (signals.Interrupted).
        with stacks.open(
            project,
            mode="warm" if plan.stacks == "warm" else "fresh",
            runner=SubprocessRunner(default_timeout=cfg.timeouts.command),
            timeouts=plan.timeouts,
            log_tail_lines=plan.log_tail_lines,
            profiles=cfg.profiles,
            goldens=use_snapshots,
            workers=plan.workers,
            # A plan without its count (a resume) does not tell the warm pool how many trials come.
            trials=None if plan.resume or not plan.tasks else len(plan.tasks) * plan.repeats,
            memory_budget_mb=options.memory_budget_mb or cfg.memory_budget_mb,
            heal=progress,
            say=progress,
        ) as opened:
            backend = opened.backend
            if live.wanted(options.as_json):
                with live.LiveProgress(sys.stderr, workers=plan.workers) as display:
                    _, state = run_project(
                        plan, backend, display.say, stacks=opened.live, stop=opened.stop,
                        observer=display.observe,
                    )  # fmt: skip
            else:
                _, state = run_project(plan, backend, progress, stacks=opened.live, stop=opened.stop)
    summary = summarize(state)
    if state.unknown_kinds or state.unreadable_lines:
        skipped = sum(state.unknown_kinds.values()) + state.unreadable_lines
        progress(f"note: skipped {skipped} event(s) this version cannot read (see summary.json)")
    if options.as_json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_table(summary))
    return EXIT_OK if summary["all_passed"] else EXIT_USER


def write_report(run_dir: Path, state: RunState) -> Path:
    """``--report``: report.html beside summary.json (``RunPlan.report``)."""
    from forgelib.report.page import write_report as write  # only a run that asks for the page loads it

    return write(run_dir, state)


def _start_joining(address: str | None) -> Joining | None:
    """``forgelib.cluster.connect.Joining`` (the only code that imports Ray), or None without a cluster."""
    if not address:
        return None
    from forgelib.cluster.connect import Joining

    return Joining.started(address) or Joining(address)


def _run_on_cluster(
    joining: Joining, plan: RunPlan, project: Project, profiles: tuple[str, ...], snapshots: bool
) -> RunState:
    """The same run on a Ray cluster's nodes (``forgelib.cluster``)."""
    if plan.agent is not None:
        raise UsageError("--cluster runs each task's oracle; a command agent is not supported there yet")
    # Ray prints what it learns about the cluster (a raylet that died...) on stdout, which belongs to the
    # summary (`--json`): while the run lasts, stdout is stderr. (The joining thread's Ray messages go to
    # stderr by connect._ray_messages_to_stderr and Ray's loggers.)
    with contextlib.redirect_stdout(sys.stderr):
        return _cluster_run(joining, plan, project, profiles, snapshots)


def _cluster_run(
    joining: Joining, plan: RunPlan, project: Project, profiles: tuple[str, ...], snapshots: bool
) -> RunState:
    from forgelib.cluster.driver import Cluster, ClusterBackend, ClusterExecutor

    nodes = joining.result()  # before `interruptible`, so its handlers own SIGINT/SIGTERM
    cl = Cluster(project, plan.output, nodes)
    # The stacks live on the nodes; the executor stops them there (this process registers none).
    with interruptible(LiveStacks()):
        _, state = run_project(
            plan,
            ClusterBackend(cl),
            progress,
            executor=lambda log, settings: ClusterExecutor(
                cl, log, settings, progress, profiles, stacks=plan.stacks, snapshots=snapshots
            ),
        )
    return state


def build_plan(
    cfg: RunConfig, project: Project, options: RunOptions | None = None, *, agent: Agent | None = None
) -> RunPlan:
    """The run config with the command line's ``options`` on top; ``agent``: the run's solver
    (``choose_agent``)."""
    options = options or RunOptions()
    tasks: tuple[Task, ...] = (
        tuple(project.task(n) for n in cfg.tasks) if cfg.tasks else project.tasks
    )  # project.task() names the known tasks when one is misspelt
    if not tasks and not options.resume:
        raise UsageError(f"{project.path}: the project has no tasks to run")
    out = Path(options.output).resolve() if options.output else (cfg.output or project.root / "runs")
    return RunPlan(
        tasks=project.tasks if options.resume else tasks,
        repeats=options.repeats or cfg.repeats,
        output=out,
        workers=options.workers or cfg.workers,
        resume=options.resume,
        timeouts=cfg.timeouts,
        capture_logs_on_success=cfg.capture_logs_on_success,
        log_tail_lines=cfg.log_tail_lines,
        retries=cfg.retries if options.retries is None else options.retries,
        project=str(project.root),
        config=str(cfg.path),
        junit=Path(options.junit).resolve() if options.junit else None,
        report=write_report if options.report else None,
        stacks=options.stacks or cfg.stacks,
        agent=agent,
    )


ORACLE = "oracle"


def choose_agent(option: str | None, cfg: RunConfig, project: Project) -> Agent | None:
    """The run's solver: ``--agent oracle`` / ``--agent FILE.yaml``, else the run config's ``agent:``;
    None: each task's oracle. An agent in a service must find it in every task's stack (file:line)."""
    if option == ORACLE:
        return None
    if option:
        agent: Agent | None = load_agent(option, project, cfg.tasks)
    else:
        agent = cfg.agent
        if agent is not None and not agent.on_host:
            load_run_config(cfg.path, project)  # raises the `where:` problem at its line
    if agent is not None and agent.on_host:
        program = agent.command[0]
        if shutil.which(program, path=merged_env(dict(agent.env)).get("PATH")) is None:
            # Before any stack exists: every trial would fail the same way.
            raise ForgeError(
                f"{agent.source}: the agent's program {program!r} was not found (or is not executable); "
                "fix `command:` (a relative path is relative to that file) or install it"
            )
    return agent


def progress(line: str) -> None:
    print(f"forge: {line}", file=sys.stderr, flush=True)


def render_table(summary: Mapping[str, Any]) -> str:
    """One row per trial, then each undecided check with the trials it was undecided in and why, then
    the run's totals. A trial's reason says how many of its checks were undecided: it passed or failed
    on the others alone."""
    rows = [("TASK", "IDX", "STATUS", "SCORE", "TERMINATION", "REASON")]
    for t in summary["trials"]:
        score = "-" if t["score"] is None else f"{t['score']:.2f}"
        reason = (t["reasons"] or [""])[0]
        undecided = sum(c.get("result") == "undecided" for c in t.get("checks") or ())
        if undecided:
            reason = f"{undecided} undecided" + (f"; {reason}" if reason else "")
        reason = reason if len(reason) <= 80 else reason[:77] + "..."
        rows.append((t["task"], str(t["index"]), t["status"], score, t["termination_reason"] or "-", reason))
    lines = align(rows, ragged_last=True)
    lines += undecided_lines(summary["trials"])
    tot = summary["totals"]
    errors = ", ".join(f"{k}: {v}" for k, v in tot["errors_by_stage"].items()) or "none"
    lines.append(
        f"run {summary['run_id']}: {tot['passed']}/{tot['trials']} passed, {tot['failed']} failed "
        f"({tot['failed_attempts']} failed attempts; errors by stage: {errors})"
        + (f", {tot['not_finished']} not finished" if tot["not_finished"] else "")
    )
    return "\n".join(line.rstrip() for line in lines)


def undecided_lines(trials: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each check that could not be decided, once per task, check and reason, with its trials' indexes."""
    seen: dict[tuple[str, str, str, str], list[int]] = {}
    for t in trials:
        for c in t.get("checks") or ():
            if c.get("result") == "undecided":
                key = (str(t["task"]), str(c.get("kind")), str(c.get("name")), str(c.get("reason") or ""))
                seen.setdefault(key, []).append(int(t["index"]))
    if not seen:
        return []
    out = ["undecided (neither passed nor failed; left out of the score):"]
    for (task, kind, name, reason), indexes in seen.items():
        which = ",".join(map(str, indexes)) if len(indexes) <= 6 else f"{len(indexes)} trials"
        out.append(f"  {task}[{which}] {kind} {name!r}: {reason}")
    return out


__all__ = ["RunOptions", "build_plan", "main_run", "progress", "render_table"]
