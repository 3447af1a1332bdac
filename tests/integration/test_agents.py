"""Command agents solving trials on the real engine (the postgres pack's read_widget).

A host agent that is the SDK's MCP client (``ClientSession`` over Streamable HTTP) solves it on fresh and
warm stacks through the trial's tools, its calls in trace.jsonl, and the warm reset undoes what its tools
changed; an agent inside the stack (``where: runner``) reaches the services by name and the tool server on
the trial's network. Bad agents, each with a clear result and nothing left behind: not found, exits 1,
outlives its timeout (its grandchild gone too), killed by a signal, and Ctrl-C while it runs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cluster import wait_for

from forgelib.cli.run import main_run
from forgelib.docker import labels as lab
from forgelib.errors import ForgeError
from forgelib.mcp import read_trace
from forgelib.run import events as ev
from forgelib.runner import SubprocessRunner

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

ROOT = Path(__file__).resolve().parents[2]
PACK = ROOT / "examples" / "multi_service_postgres_reset"
DEV = PACK / "run_configs" / "dev.yaml"
README_AGENT = PACK / "agents" / "mcp_agent.py"
AGENTS = ROOT / "tests" / "fixtures" / "agents"


def agent_file(tmp: Path, stem: str, **spec: Any) -> Path:
    path = tmp / f"{stem}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def host_agent(tmp: Path, script: Path, **spec: Any) -> Path:
    """A host agent running ``script`` with this interpreter (it has the mcp SDK)."""
    return agent_file(tmp, script.stem, command=[sys.executable, str(script)], **spec)


def forge(agent: Path, output: Path, **kw: Any) -> tuple[int, Path]:
    rc = main_run(str(DEV), output=str(output), agent=str(agent), **{"repeats": 1, **kw})
    (run_dir,) = [p for p in output.iterdir() if p.is_dir()]
    return rc, run_dir


def trial(run_dir: Path, index: int = 0) -> tuple[dict[str, Any], Path]:
    d = run_dir / "trials" / "read_widget" / str(index)
    return yaml.safe_load((d / "trial.yaml").read_text()), d


def nothing_left(runner: SubprocessRunner, run_dir: Path) -> None:
    left = lab.resources_with_labels(runner, {lab.RUN: run_dir.name})
    assert lab.is_empty(left), f"leaked: {left}"


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for whoever inherited it to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_the_readme_agent_solves_the_task_through_the_tools(tmp_path: Path, runner: SubprocessRunner) -> None:
    rc, run_dir = forge(host_agent(tmp_path, README_AGENT, name="readme"), tmp_path / "runs")
    t, d = trial(run_dir)
    assert rc == 0 and t["status"] == "passed", (d / "agent.stderr").read_text()[-2000:]
    assert t["solver"]["kind"] == "command" and t["solver"]["name"] == "readme" and t["solver"]["rc"] == 0
    calls = read_trace(d / "trace.jsonl")
    assert [(c["tool"], c["ok"]) for c in calls] == [("http_request", True), ("write_file", True)]
    assert calls[1]["arguments"]["content"] == "baseline"
    assert "tools: http_request" in (d / "agent.stdout").read_text()  # its output, streamed to the trial
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["services"]["widgets-api"]["urls"]["8000"].startswith("http://127.0.0.1:")
    assert manifest["services"]["app-db"]["postgres"]["url"].startswith("postgresql://app:")
    # The token is in no log forge wrote (its own log redacts it; the agent never printed it).
    token = manifest["mcp"]["token"]
    assert all(token not in p.read_text() for p in d.rglob("*.log"))
    assert json.loads((run_dir / "summary.json").read_text())["solver"]["name"] == "readme"
    nothing_left(runner, run_dir)


def test_a_warm_reset_undoes_what_the_agents_tools_changed(tmp_path: Path, runner: SubprocessRunner) -> None:
    agent = host_agent(tmp_path, AGENTS / "vandal_agent.py")
    rc, run_dir = forge(agent, tmp_path / "runs", repeats=2, stacks="warm")
    assert rc == 1  # read_widget's gate fails an agent that writes to the database (a trace check)
    (first, d0), (second, d1) = trial(run_dir, 0), trial(run_dir, 1)
    for d in (d0, d1):
        grade = yaml.safe_load((d / "grade.yaml").read_text())
        gate = next(c for c in grade["checks"] if c["name"] == "no_database_writes")
        assert not gate["passed"] and not grade["binary_pass"], grade
    assert first["termination_reason"] == second["termination_reason"] == "COMPLETED"
    assert (
        second["stack"]["mode"] == "warm"
        and second["stack"]["reuse"] == 1
        and not second["stack"]["replaced"]
    )
    seen = [json.loads(read_trace(d / "trace.jsonl")[0]["result"])["rows"] for d in (d0, d1)]
    assert seen == [[[0]], [[0]]]  # the second trial's first read: the first one's update was undone
    assert read_trace(d0 / "trace.jsonl")[1]["ok"]  # ... and it did happen
    nothing_left(runner, run_dir)


def test_an_agent_inside_the_stack(tmp_path: Path, runner: SubprocessRunner) -> None:
    code = (AGENTS / "stack_agent.py").read_text()
    agent = agent_file(tmp_path, "in-stack", command=["python3", "-c", code], where="runner", timeout=120)
    rc, run_dir = forge(agent, tmp_path / "runs")
    t, d = trial(run_dir)
    assert rc == 0 and t["status"] == "passed", (d / "agent.stderr").read_text()[-2000:]
    assert "-> wrote 8 bytes to /work/submission.txt" in (d / "agent.stdout").read_text()
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["where"] == "runner" and manifest["services"]["app-db"]["postgres"]["url"].endswith(
        "@app-db:5432/app"
    )
    assert not manifest["mcp"]["url"].startswith("http://127.0.0.1")  # the trial network's gateway
    assert [c["tool"] for c in read_trace(d / "trace.jsonl")] == ["http_request", "write_file"]
    nothing_left(runner, run_dir)


def test_an_agent_that_is_not_found_fails_the_run_before_any_stack(tmp_path: Path) -> None:
    agent = agent_file(tmp_path, "missing", command=["./no-such-agent"])
    with pytest.raises(
        ForgeError, match=r"missing.yaml: the agent's program '.*no-such-agent' was not found"
    ):
        main_run(str(DEV), output=str(tmp_path / "runs"), agent=str(agent))
    assert not (tmp_path / "runs").exists()


def test_agents_that_fail_exit_time_out_and_die(tmp_path: Path, runner: SubprocessRunner) -> None:
    pidfile = tmp_path / "pids"
    agent = host_agent(tmp_path, AGENTS / "misbehave.py", timeout=8, env={"PIDFILE": str(pidfile)})
    rc, run_dir = forge(agent, tmp_path / "runs", repeats=3, stacks="warm")
    assert rc == 1
    got = [(t["termination_reason"], t["error"]["reason"]) for t, _ in (trial(run_dir, i) for i in range(3))]
    shown = f"`{sys.executable} {AGENTS / 'misbehave.py'}` on the host"
    assert got[0] == ("AGENT_ERROR", f"{shown} exited 1: cannot solve this: giving up")
    assert got[1][0] == "AGENT_TIMEOUT" and got[1][1] == (
        f"{shown} outlived its timeout of 8s and was killed (its whole process group)"
    )
    assert got[2][0] == "AGENT_ERROR" and got[2][1].startswith(f"{shown} was killed by SIGKILL")
    agent_pid, grandchild = map(int, pidfile.read_text().split())
    assert gone(agent_pid) and gone(grandchild)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["totals"]["errors_by_stage"] == {"solve": 3}
    nothing_left(runner, run_dir)


def test_ctrl_c_kills_the_agents_process_group_and_records_the_trial_interrupted(
    tmp_path: Path, runner: SubprocessRunner
) -> None:
    pidfile = tmp_path / "pids"
    agent = host_agent(tmp_path, AGENTS / "sleeper.py", env={"PIDFILE": str(pidfile)})
    out = tmp_path / "runs"
    argv = [sys.executable, "-m", "forgelib", "run", "--config", str(DEV), "--repeats", "1"]
    proc = subprocess.Popen(
        [*argv, "--output", str(out), "--agent", str(agent)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for("the agent's pids", pidfile.exists, proc, timeout=300)
        agent_pid, grandchild = map(int, pidfile.read_text().split())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=300) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (run_dir,) = list(out.iterdir())
    state = ev.fold(ev.read_events(run_dir / ev.EVENTS_FILE))
    (rec,) = state.records()
    assert rec.status == "interrupted" and state.interrupted
    assert gone(agent_pid) and gone(grandchild)
    nothing_left(runner, run_dir)
