"""The agent seam on the fake backend: the manifest a command agent gets, how its ends are recorded
(AGENT_ERROR / AGENT_TIMEOUT under the retry rules), and what forge hands it."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from forgelib.errors import CommandTimeout, ForgeError, ProgramNotFound, SpecError
from forgelib.run import manifest
from forgelib.run.execute import RunPlan, run_project
from forgelib.runner import Result
from forgelib.spec.loader import load_agent, load_run_config
from forgelib.spec.models import Agent, EnvironmentManifest
from forgelib.stacks.stack import Stack

from .fakes import FakeBackend, good_answer, ok, widget_task

CONFIG = {
    "services": {
        "app-db": {
            "image": "forgelib/postgres:15",
            "environment": {"POSTGRES_USER": "app", "POSTGRES_DB": "shop", "POSTGRES_PASSWORD": "s3cret"},
        },
        "cache": {"image": "redis:7-alpine", "command": ["redis-server", "--requirepass", "pw"]},
        "api": {"image": "forgelib/python:3.11"},
        "runner": {"image": "forgelib/python:3.11"},
    }
}  # fmt: skip
PORTS = {
    "app-db": ["127.0.0.1:49153->5432/tcp"],
    "cache": ["127.0.0.1:49154->6379/tcp"],
    "api": ["127.0.0.1:49155->8000/tcp"],
}


class Ports:
    def port(self, service: str, container_port: int) -> tuple[str, int]:
        published = {("app-db", 5432): 49153, ("cache", 6379): 49154}
        return "127.0.0.1", published[(service, container_port)]


def stack(ports: Mapping[str, list[str]], compose: Any) -> Stack:
    """A stack of CONFIG's services publishing ``ports``, its ports looked up on ``compose``."""
    env = EnvironmentManifest(compose_files=(Path("/p/c.yaml"),), services={}, compose=CONFIG)
    return Stack("p", env, compose, {}, {}, Path("/t"), config=CONFIG, ports=ports)


def build(where: str, mcp: manifest.Access | None = None) -> dict[str, Any]:
    return manifest.build(
        trial=manifest.TrialIdent("r1", "read_widget", 2, 1), instruction="do it", where=where,
        stack=stack(PORTS, Ports()), files={"manifest": "/m.json"}, mcp=mcp,
    )  # fmt: skip


def test_a_host_agent_reaches_services_at_their_published_loopback_ports() -> None:
    m = build("host", manifest.Access("http://127.0.0.1:5000/mcp", "tok"))
    assert m["trial"] == {"id": "r1/read_widget.2.a1", "run_id": "r1", "task": "read_widget", "index": 2,
                          "attempt": 1}  # fmt: skip
    api, db, cache = m["services"]["api"], m["services"]["app-db"], m["services"]["cache"]
    assert api == {
        "host": "127.0.0.1",
        "ports": {"8000/tcp": 49155},
        "urls": {"8000": "http://127.0.0.1:49155"},
    }
    assert db["kind"] == "postgres" and db["urls"] == {}  # postgres does not speak HTTP
    assert db["postgres"]["url"] == "postgresql://app:s3cret@127.0.0.1:49153/shop"
    assert "host=127.0.0.1" in db["postgres"]["dsn"] and "port=49153" in db["postgres"]["dsn"]
    assert cache["redis"] == {"url": "redis://:pw@127.0.0.1:49154/0"}
    assert m["services"]["runner"] == {"host": "127.0.0.1", "ports": {}, "urls": {}}
    assert m["mcp"] == {"url": "http://127.0.0.1:5000/mcp", "token": "tok"}
    json.dumps(m)  # a JSON document


def test_an_agent_in_the_stack_reaches_services_by_name_and_container_port() -> None:
    m = build("runner")
    assert m["services"]["api"]["urls"] == {"8000": "http://api:8000"}
    assert m["services"]["app-db"]["postgres"]["url"] == "postgresql://app:s3cret@app-db:5432/shop"
    assert m["services"]["cache"]["redis"] == {"url": "redis://:pw@cache:6379/0"}
    assert m["mcp"] is None


def test_a_postgres_service_without_a_published_port_says_why_it_has_no_connection_string() -> None:
    class Unpublished:
        def port(self, service: str, container_port: int) -> tuple[str, int]:
            from forgelib.errors import ForgeError

            raise ForgeError(f"{service}:{container_port} is not published")

    m = manifest.build(
        trial=manifest.TrialIdent("r", "t", 0, 1), instruction="", where="host",
        stack=stack({}, Unpublished()), files={}, mcp=None,
    )  # fmt: skip
    assert m["services"]["app-db"]["postgres"] is None
    assert "app-db:5432 is not published" in m["services"]["app-db"]["note"]


# ------------------------------------------------------------------------------------- in the orchestrator


def agent(**kw: Any) -> Agent:
    return Agent(command=("my-agent", "--fast"), timeout=kw.pop("timeout", 30), **kw)


def run(tmp_path: Path, backend: FakeBackend, a: Agent, **kw: Any) -> tuple[Path, Any]:
    task = replace(widget_task(), instruction="Write the widget's name.", oracle=None)
    plan = RunPlan(tasks=[task], repeats=1, output=tmp_path / "runs", agent=a, **kw)
    return run_project(plan, backend, lambda line: None)


def test_a_host_agent_is_given_the_instruction_and_the_manifest(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def launch(argv: tuple[str, ...], options: Mapping[str, Any]) -> Result:
        seen.update(options, argv=argv, stdin_text=options["stdin"].read_text())
        seen["manifest"] = json.loads(Path(options["env"]["FORGE_MANIFEST"]).read_text())
        options["stdout_path"].write_text("solved\n")
        return ok()

    backend = FakeBackend(good_answer, launch_answer=launch)
    run_dir, state = run(tmp_path, backend, agent(env={"MY_KEY": "v"}))
    assert [r.status for r in state.records()] == ["passed"]
    d = run_dir / "trials" / "read_widget" / "0"
    assert seen["argv"] == ("my-agent", "--fast") and seen["timeout"] == 30
    assert seen["stdin_text"] == "Write the widget's name."
    assert seen["env"]["FORGE_INSTRUCTION"] == str(d / "instruction.txt") and seen["env"]["MY_KEY"] == "v"
    assert seen["stdout_path"] == d / "agent.stdout" and seen["stderr_path"] == d / "agent.stderr"
    assert seen["manifest"]["trial"]["task"] == "read_widget" and seen["manifest"]["where"] == "host"
    assert (d / "agent.stdout").read_text() == "solved\n"
    # The trial's MCP server: its URL and token in the env and the manifest, the token kept out of logs.
    token = seen["env"]["FORGE_MCP_TOKEN"]
    assert seen["env"]["FORGE_MCP_URL"].startswith("http://127.0.0.1:") and set(seen["secrets"]) == {
        token,
        "v",
    }  # MY_KEY too
    assert seen["manifest"]["mcp"] == {"url": seen["env"]["FORGE_MCP_URL"], "token": token}
    assert (d / "trace.jsonl").is_file()
    trial = yaml.safe_load((d / "trial.yaml").read_text())
    assert trial["solver"]["kind"] == "command" and trial["solver"]["rc"] == 0 and "solve" in trial["timings"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solver"]["kind"] == "command" and summary["solver"]["name"] == "my-agent"
    # The task's oracle did not run: the agent replaced it (no exec of an oracle in the stack).
    assert not any(argv[0] == "python3" for _, argv, _ in backend.stacks[("read_widget", 0)].calls)


@pytest.mark.parametrize(
    ("answer", "termination", "retryable", "reason"),
    [
        (ok(rc=1, stderr="boom\n"), "AGENT_ERROR", False, "`my-agent --fast` on the host exited 1: boom"),
        (ok(rc=-9), "AGENT_ERROR", False, "`my-agent --fast` on the host was killed by SIGKILL"),
        (ProgramNotFound("my-agent"), "AGENT_ERROR", False, "agent program 'my-agent' not found on the host"),
        (CommandTimeout(("my-agent",), 30, "", ""), "AGENT_TIMEOUT", True,
         "`my-agent --fast` on the host outlived its timeout of 30s and was killed (its whole process"),
    ],
)  # fmt: skip
def test_an_agent_that_fails_is_an_agent_error_or_timeout(
    tmp_path: Path, answer: Any, termination: str, retryable: bool, reason: str
) -> None:
    def launch(argv: tuple[str, ...], options: Mapping[str, Any]) -> Result:
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    backend = FakeBackend(good_answer, launch_answer=launch)
    _, state = run(tmp_path, backend, agent())
    (rec,) = state.records()
    assert (rec.termination.value if rec.termination else None, rec.retryable) == (termination, retryable)
    assert rec.error_stage == "solve" and rec.reasons[0].startswith(f"Agent failed: {reason}")
    assert len(backend.torn_down) == 1  # and nothing left up


def test_an_agent_timeout_is_retried_on_a_fresh_stack(tmp_path: Path) -> None:
    calls: list[int] = []

    def launch(argv: tuple[str, ...], options: Mapping[str, Any]) -> Result:
        calls.append(1)
        if len(calls) == 1:
            raise CommandTimeout(tuple(argv), 30, "", "")
        return ok()

    backend = FakeBackend(good_answer, launch_answer=launch)
    _, state = run(tmp_path, backend, agent(), retries=1)
    (rec,) = state.records()
    assert rec.status == "passed" and rec.attempts == 2
    assert [a["termination_reason"] for a in rec.earlier] == ["AGENT_TIMEOUT"]


def test_an_agent_in_a_service_is_execd_there_with_its_files_copied_in(tmp_path: Path) -> None:
    backend = FakeBackend(good_answer)
    run(tmp_path, backend, agent(where="runner", workdir="/work"))
    calls = backend.stacks[("read_widget", 0)].calls
    copies = [c for c in calls if c[1][:2] == ("sh", "-c")]
    assert [c[1][-1] for c in copies] == ["instruction.txt", "manifest.json"]
    (svc, _, kw) = next(c for c in calls if c[1][0] == "my-agent")
    assert svc == "runner" and kw["workdir"] == "/work" and kw["timeout"] == 30
    assert kw["env"]["FORGE_MANIFEST"] == "/tmp/forge-agent/manifest.json"


# ------------------------------------------------------------------------------------------- the spec


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write(tmp_path / "p" / "project.yaml", "name: p\n")
    return tmp_path / "p"


def test_a_run_config_names_its_agent(project: Path) -> None:
    cfg = load_run_config(write(
        project / "run_configs" / "agent.yaml",
        "project: ..\nagent:\n  command: [./agents/solve.py, --x]\n  timeout: 90\n  env: {A: 1}\n",
    ))  # fmt: skip
    assert cfg.agent is not None and cfg.agent.on_host and cfg.agent.timeout == 90
    assert cfg.agent.command == (str(project / "run_configs" / "agents" / "solve.py"), "--x")
    assert dict(cfg.agent.env) == {"A": "1"} and cfg.agent.source == project / "run_configs" / "agent.yaml"
    oracle = load_run_config(write(project / "run_configs" / "o.yaml", "project: ..\nagent: oracle\n"))
    assert oracle.agent is None
    py = load_agent(write(project / "agents" / "py.yaml", 'command: ["{python}", ./a.py]\n'))
    assert py.command == (sys.executable, "./a.py")  # forge's own Python; its arguments are left alone


def test_a_bad_agent_is_a_file_line_error(project: Path) -> None:
    bad = write(project / "run_configs" / "bad.yaml", "project: ..\nagent:\n  command: []\n  timeout: -1\n")
    with pytest.raises(SpecError) as e:
        load_run_config(bad)
    assert "bad.yaml:3" in str(e.value) or "bad.yaml:2" in str(e.value)
    with pytest.raises(SpecError) as e2:
        load_agent(write(project / "agents" / "a.yaml", "command: [x]\nwher: host\n"))
    assert "a.yaml:2" in str(e2.value) and "where" in str(e2.value)  # "did you mean"
    with pytest.raises(SpecError, match="no such agent file"):
        load_agent(project / "agents" / "missing.yaml")


def test_the_command_line_chooses_the_solver_over_the_run_config(project: Path) -> None:
    from forgelib.cli.run import choose_agent
    from forgelib.errors import ForgeError
    from forgelib.spec.models import Project

    write(project / "run_configs" / "agents" / "solve.sh", "#!/bin/sh\n").chmod(0o755)
    cfg = load_run_config(
        write(project / "run_configs" / "a.yaml", "project: ..\nagent: {command: [./agents/solve.sh]}\n")
    )
    env = EnvironmentManifest(compose_files=(project / "c.yaml",), services={})
    proj = Project("p", project, project / "project.yaml", "", {}, env, ())
    assert choose_agent(None, cfg, proj) == cfg.agent
    assert choose_agent("oracle", cfg, proj) is None  # --agent oracle: each task's own
    other = write(project / "agents" / "b.yaml", "command: [sh, -c, 'exit 0']\nname: b\n")
    chosen = choose_agent(str(other), cfg, proj)
    assert chosen is not None and chosen.name == "b"
    missing = write(project / "agents" / "c.yaml", "command: [./nope]\n")
    with pytest.raises(ForgeError, match=r"c.yaml: the agent's program '.*/agents/nope' was not found"):
        choose_agent(str(missing), cfg, proj)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("orcale", "$.agent: 'orcale' is not one of: oracle; did you mean 'oracle'?"),
        ("{comand: [x]}", "$.agent.comand: unknown key 'comand'; did you mean 'command'?"),
        ("{command: [x], where: ''}", "$.agent.where:"),
    ],
)
def test_an_inline_agent_with_a_typo_is_named_at_its_line(project: Path, value: str, message: str) -> None:
    bad = write(project / "run_configs" / "typo.yaml", f"project: ..\nagent: {value}\n")
    with pytest.raises(SpecError) as e:
        load_run_config(bad)
    assert "typo.yaml:2:" in str(e.value) and message in str(e.value)


def test_a_run_resumes_only_with_the_solver_it_started_with(tmp_path: Path) -> None:
    def launch(argv: tuple[str, ...], options: Mapping[str, Any]) -> Result:
        raise KeyboardInterrupt  # Ctrl-C while the agent runs: the trial stays pending

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, FakeBackend(good_answer, launch_answer=launch), agent())
    (run_dir,) = (tmp_path / "runs").iterdir()
    task = replace(widget_task(), instruction="Write the widget's name.", oracle=None)
    oracle_plan = RunPlan(tasks=[task], repeats=1, output=tmp_path / "runs", resume=run_dir.name)
    with pytest.raises(ForgeError, match=r"solved by the agent 'my-agent' .* not each task's oracle"):
        run_project(oracle_plan, FakeBackend(good_answer), lambda line: None)
    _, state = run(tmp_path, FakeBackend(good_answer), agent(), resume=run_dir.name)
    assert [r.status for r in state.records()] == ["passed"]
