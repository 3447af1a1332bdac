"""inspect_ai's ``forge`` sandbox on the real engine, driven by inspect itself.

* inspect's own conformance suite (``inspect_ai.util._sandbox.self_check``) against the ``runner`` service of
  one module-scoped postgres-pack stack (its checks are imported below and collected as this module's);
* ``eval()`` of examples/inspect_postgres_reset in warm mode, 4 epochs, a scripted agent that corrupts the
  database and the workspace every epoch: each epoch's first read sees the seed, every score is correct,
  the stacks were reused, nothing is left; the same of examples/inspect_mysql_shop (MariaDB: rows, a user,
  a database and a global variable vandalised every epoch), 3 epochs;
* bad input: an unknown project, a spec that fails validation, a ``default`` that does not exist, a broken
  seed (the sample's error is forge's PROVISION_ERROR, the next sample still runs);
* Ctrl-C of ``inspect eval`` leaves nothing; ``kill -9`` leaves a stack that ``forge reap`` removes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - inspect's checks, collected here

from forgelib.docker import labels as lab
from forgelib.inspect.environment import ForgeSandboxEnvironment
from forgelib.inspect.stacks import SampleStack, Settings, TaskStacks
from forgelib.runner import SubprocessRunner

pytestmark = [
    pytest.mark.integration,
    pytest.mark.anyio,
    # inspect's own dependencies (tenacity's retry options) warn about themselves inside eval(), and its
    # anyio memory streams are left to the garbage collector: neither is this sandbox's doing
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
PG = ROOT / "examples" / "multi_service_postgres_reset"
PG_EXAMPLE = ROOT / "examples" / "inspect_postgres_reset"
MYSQL_EXAMPLE = ROOT / "examples" / "inspect_mysql_shop"

# Checks of inspect's suite this sandbox cannot pass, with why (none today; docs/inspect.md).
XFAIL: dict[str, str] = {}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def pg_stack(docker_ready: None) -> Iterator[tuple[TaskStacks, SampleStack]]:
    stacks = TaskStacks(Settings(project=PG, default="runner"))
    stack = stacks.acquire(None)
    try:
        yield stacks, stack
    finally:
        stacks.close()
        left = lab.resources_with_labels(SubprocessRunner(), {lab.RUN: stacks.run_id})
        assert lab.is_empty(left), f"leaked: {left}"


@pytest.fixture
async def sandbox_env(
    pg_stack: tuple[TaskStacks, SampleStack], request: pytest.FixtureRequest
) -> AsyncIterator[ForgeSandboxEnvironment]:
    why = XFAIL.get(request.node.originalname)
    if why:
        request.node.add_marker(pytest.mark.xfail(reason=why, strict=True))
    _, stack = pg_stack
    yield ForgeSandboxEnvironment(stack, stack.services[0])


async def test_default_is_first_and_every_service_is_an_environment(
    pg_stack: tuple[TaskStacks, SampleStack],
) -> None:
    _, stack = pg_stack
    assert stack.services[0] == "runner"
    assert set(stack.services) == {"runner", "app-db", "widgets-api"}
    db = ForgeSandboxEnvironment(stack, "app-db")
    got = await db.exec(["psql", "-U", "app", "-d", "app", "-Atc", "select name from widgets where id=1"])
    assert got.stdout.strip() == "baseline", got


async def test_exec_timeout_kills_the_command_in_the_container(sandbox_env: ForgeSandboxEnvironment) -> None:
    # inspect's own kill checks look through `ps`, which the runner image lacks (they pass without
    # looking there); /proc says the same thing without it.
    marker = f"forge_timeout_{os.getpid()}"
    with pytest.raises(TimeoutError):
        await sandbox_env.exec(["sh", "-c", f"sleep 30 # {marker} & sleep 30 # {marker}-p; :"], timeout=2)
    await _eventually_gone(sandbox_env, marker)


async def _eventually_gone(env: ForgeSandboxEnvironment, marker: str) -> None:
    import anyio

    probe = f"cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c '{marker}' || true"
    for _ in range(40):
        got = await env.exec(["sh", "-c", probe])
        if got.stdout.strip() == "1":  # the probe's own command line
            return
        await anyio.sleep(0.25)
    raise AssertionError(f"a process with {marker} still runs after the timeout")


def test_inspect_sandbox_cleanup_keeps_a_live_evals_stack(pg_stack: tuple[TaskStacks, SampleStack]) -> None:
    stacks, stack = pg_stack  # this process owns it and is alive: the reaper must keep it
    inspect_cli = Path(sys.executable).parent / "inspect"
    done = subprocess.run(
        [str(inspect_cli), "sandbox", "cleanup", "forge", stacks.run_id],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert stack.name in done.stdout and "kept" in done.stdout, done.stdout
    assert _left(stacks.run_id)["containers"], "the live stack was removed"


async def test_connection_names_the_container(sandbox_env: ForgeSandboxEnvironment) -> None:
    conn = await sandbox_env.connection()
    assert conn.type == "forge" and conn.container
    assert conn.command.startswith(f"docker exec -it {conn.container} ")
    state = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Running}} {{index .Config.Labels \"io.forgelib.run\"}}",
         conn.container], capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    assert state[0] == "true" and state[1].startswith("inspect-")


# ------------------------------------------------------------------------------- inspect eval, end to end


def _load(path: Path, name: str) -> Any:
    """An example's module by path (the two examples both have a task.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _eval(task: Any, log_dir: Path, example: Path = PG_EXAMPLE, **options: Any) -> Any:
    """``task`` evaluated with ``example``'s scripted agent (inspect's mockllm)."""
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import get_model

    scripted = _load(example / "scripted.py", f"forge_example_{example.name}_scripted")
    (log,) = inspect_eval(
        task,
        model=get_model(scripted.MODEL, custom_outputs=scripted.agent),
        display="none",
        log_dir=str(log_dir),
        **options,
    )
    return log


def _forge_info(sample: Any) -> dict[str, Any]:
    (info,) = [e.data for e in sample.events if e.event == "info" and e.source == "forge"]
    return dict(info)


def _left(run_id: str) -> dict[str, list[str]]:
    return lab.resources_with_labels(SubprocessRunner(), {lab.RUN: run_id})


def test_warm_eval_every_epoch_starts_from_the_seed(docker_ready: None, tmp_path: Path) -> None:
    example = _load(PG_EXAMPLE / "task.py", "forge_example_pg_task")
    log = _eval(example.postgres_reset(stacks="warm"), tmp_path, epochs=4, max_samples=1)
    assert log.status == "success", log.error
    samples = sorted(log.samples, key=lambda s: s.epoch)
    assert [s.epoch for s in samples] == [1, 2, 3, 4]
    infos = [_forge_info(s) for s in samples]
    for s in samples:
        first_read = next(m for m in s.messages if m.role == "tool")
        # the seed's one row, an empty workspace: nothing of the last epoch's corruption
        assert first_read.text == "1|baseline\n", (s.epoch, first_read.text)
        assert {k: v.value for k, v in s.scores.items()} == {"match": "C", "forge_scorer": "C"}, s.scores
        corrupt = [m for m in s.messages if m.role == "tool"][2]
        assert "UPDATE 1" in corrupt.text and "corrupted" in corrupt.text  # the agent did corrupt it
    assert "submission_reads_baseline: passed" in samples[0].scores["forge_scorer"].explanation
    assert {i["mode"] for i in infos} == {"warm"}
    assert len({i["stack"] for i in infos}) == 1 and [i["reuse"] for i in infos] == [0, 1, 2, 3], infos
    assert lab.is_empty(_left(infos[0]["run_id"])), _left(infos[0]["run_id"])


def test_warm_mysql_eval_every_epoch_starts_from_the_seed(docker_ready: None, tmp_path: Path) -> None:
    example = _load(MYSQL_EXAMPLE / "task.py", "forge_example_mysql_task")
    log = _eval(example.mysql_shop(stacks="warm"), tmp_path, MYSQL_EXAMPLE, epochs=3, max_samples=1)
    assert log.status == "success", log.error
    samples = sorted(log.samples, key=lambda s: s.epoch)
    assert [s.epoch for s in samples] == [1, 2, 3]
    infos = [_forge_info(s) for s in samples]
    for s in samples:
        reads = [m for m in s.messages if m.role == "tool"]
        # the seed's rows and user, no loot database, the default max_connections: nothing of the last
        # epoch's vandalism
        assert reads[0].text.split("\n") == [
            "1|shipped", "2|pending", "3|cancelled", "user|reporter", "max_connections|151", "",
        ], (s.epoch, reads[0].text)  # fmt: skip
        assert '"item":"kettle"' in reads[1].text.replace(" ", ""), reads[1].text  # order 1 via the api
        assert reads[2].text.strip() == "vandalised", reads[2].text  # the agent did vandalise it
        assert {k: v.value for k, v in s.scores.items()} == {"match": "C", "forge_scorer": "C"}, s.scores
    explanation = samples[0].scores["forge_scorer"].explanation
    assert "order_1_is_still_shipped: passed" in explanation, explanation
    assert {i["mode"] for i in infos} == {"warm"}
    assert len({i["stack"] for i in infos}) == 1 and [i["reuse"] for i in infos] == [0, 1, 2], infos
    assert lab.is_empty(_left(infos[0]["run_id"])), _left(infos[0]["run_id"])


# ---------------------------------------------------------------------------------------------- bad input


def _task(sandbox: Any, samples: list[Any] | None = None) -> Any:
    from inspect_ai import Task
    from inspect_ai.agent import react
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import match
    from inspect_ai.tool import bash

    return Task(
        dataset=samples or [Sample(id="one", input="read widget 1", target="baseline")],
        solver=react(tools=[bash(timeout=60)]),
        scorer=match(),
        sandbox=sandbox,
    )


def _pack_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "pack"
    shutil.copytree(PG, dest, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    return dest


def _eval_error(task: Any, log_dir: Path) -> str:
    """What inspect reports when the eval cannot start: its log's error, or the exception it raised."""
    from inspect_ai._util.error import PrerequisiteError

    try:
        log = _eval(task, log_dir)
    except PrerequisiteError as e:
        return str(e.message)
    assert log.status == "error", log.status
    return str(log.error.message)


def test_unknown_project_is_named(tmp_path: Path) -> None:
    msg = _eval_error(_task(("forge", str(tmp_path / "nowhere" / "project.yaml"))), tmp_path)
    assert "nowhere/project.yaml does not exist" in msg and "Traceback" not in msg, msg


def test_invalid_spec_reads_as_forge_shows_it(tmp_path: Path) -> None:
    pack = _pack_copy(tmp_path)
    text = (pack / "project.yaml").read_text()
    (pack / "project.yaml").write_text(text.replace("kind: sql_dump", "kind: sql_dumpp"))
    msg = _eval_error(_task(("forge", str(pack / "project.yaml"))), tmp_path)
    assert "project.yaml:" in msg and "sql_dumpp" in msg and "Traceback" not in msg, msg


def test_missing_default_names_the_services(tmp_path: Path) -> None:
    from inspect_ai.util import SandboxEnvironmentSpec

    from forgelib.inspect import ForgeConfig

    msg = _eval_error(
        _task(SandboxEnvironmentSpec("forge", ForgeConfig(project=str(PG), default="nope"))), tmp_path
    )
    assert "default service 'nope'" in msg and "app-db, runner, widgets-api" in msg, msg
    msg = _eval_error(_task(("forge", str(PG))), tmp_path)  # none marked, none named default
    assert "no default service" in msg and "x-default" in msg, msg


def test_broken_seed_is_the_samples_error_and_the_eval_goes_on(docker_ready: None, tmp_path: Path) -> None:
    from inspect_ai.dataset import Sample
    from inspect_ai.util import SandboxEnvironmentSpec

    from forgelib.inspect import ForgeConfig
    from forgelib.spec.digest import seed_digest
    from forgelib.spec.models import SeedKind

    pack = _pack_copy(tmp_path)
    broken = pack / "assets" / "broken.sql"
    broken.write_text("INSERT INTO no_such_table VALUES (1);\n")
    text = (
        (pack / "project.yaml")
        .read_text()
        .replace(
            "    widget_order:",
            f"    broken:\n      path: assets/broken.sql\n      kind: sql_dump\n"
            f'      digest: "{seed_digest(broken, SeedKind.SQL_DUMP)}"\n    widget_order:',
        )
    )
    (pack / "project.yaml").write_text(text)
    task_dir = pack / "tasks" / "broken_seed"
    task_dir.mkdir()
    (task_dir / "task.yaml").write_text(
        "name: broken_seed\ndescription: a seed that fails\nenvironment_manifest:\n"
        "  services:\n    app-db: {isolation: reset, reset: {seed: broken}}\n"
    )
    samples = [
        Sample(id="broken", input="x", target="baseline", metadata={"forge_task": "broken_seed"}),
        Sample(id="fine", input="x", target="baseline"),
    ]
    config = ForgeConfig(project=str(pack), task="read_widget", default="runner")
    log = _eval(_task(SandboxEnvironmentSpec("forge", config), samples), tmp_path, fail_on_error=False)
    by_id = {s.id: s for s in log.samples}
    err = by_id["broken"].error
    assert err is not None and "PROVISION_ERROR" in err.message and "no_such_table" in err.message, err
    assert by_id["fine"].error is None and by_id["fine"].scores["match"].value == "C", by_id["fine"]
    run_id = _forge_info(by_id["fine"])["run_id"]
    assert lab.is_empty(_left(run_id)), _left(run_id)


# ---------------------------------------------------------------------------------- Ctrl-C, kill -9, reap

DRIVER = """
import sys
sys.path.insert(0, {example!r})
from inspect_ai import eval
from inspect_ai.model import get_model
import scripted
from task import postgres_reset

def agent(messages, *rest):
    if not any(m.role == "tool" for m in messages):
        return scripted.call("bash", command="echo started > /work/started; sleep 300")
    return scripted.agent(messages, *rest)

eval(postgres_reset(stacks={stacks!r}), model=get_model(scripted.MODEL, custom_outputs=agent),
     display="none", log_dir={log_dir!r})
"""


def _driver(tmp_path: Path, stacks: str) -> subprocess.Popen[bytes]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(example=str(PG_EXAMPLE), stacks=stacks, log_dir=str(tmp_path / "logs")))
    return subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.DEVNULL)


def _owned(pid: int) -> dict[str, list[str]]:
    return lab.resources_with_labels(SubprocessRunner(), {lab.OWNER_PID: str(pid), lab.MANAGED: "true"})


def _wait_for_agent(proc: subprocess.Popen[bytes]) -> None:
    """Until the driver's sample runs its agent's first command (its `started` file)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the eval ended early ({proc.returncode})"
        names = subprocess.run(
            ["docker", "ps", "--filter", f"label={lab.OWNER_PID}={proc.pid}", "--filter",
             "label=com.docker.compose.service=runner", "--format", "{{.Names}}"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout.split()  # fmt: skip
        started = [
            n for n in names
            if subprocess.run(["docker", "exec", n, "test", "-e", "/work/started"], timeout=60).returncode
            == 0
        ]  # fmt: skip
        if started:
            return
        time.sleep(1)
    raise AssertionError("the agents never started")


def test_ctrl_c_of_inspect_eval_leaves_nothing(docker_ready: None, tmp_path: Path) -> None:
    proc = _driver(tmp_path, "warm")
    try:
        _wait_for_agent(proc)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert lab.is_empty(_owned(proc.pid)), _owned(proc.pid)
    assert not list(Path(tempfile.gettempdir()).glob(f"forge-inspect-{proc.pid}-*"))


def test_killed_inspect_eval_is_reaped_by_forge_reap(docker_ready: None, tmp_path: Path) -> None:
    proc = _driver(tmp_path, "fresh")
    try:
        _wait_for_agent(proc)
    finally:
        proc.kill()  # SIGKILL: no cleanup of its own
        proc.wait(timeout=60)
    # (Its stack is usually still there; on a shared engine another forge process may reap it first.)
    reap = subprocess.run(
        [sys.executable, "-m", "forgelib", "reap"], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert reap.returncode == 0, reap.stderr
    assert lab.is_empty(_owned(proc.pid)), (_owned(proc.pid), reap.stdout)
    assert not list(Path(tempfile.gettempdir()).glob(f"forge-inspect-{proc.pid}-*")), reap.stdout


def test_inspect_cache_example_scores_with_forge(docker_ready: None, tmp_path: Path) -> None:
    where = ROOT / "examples" / "inspect_cache_debug"
    example = _load(where / "task.py", "forge_example_cache_task")
    log = _eval(example.diagnose_stale_order(), tmp_path, where)
    assert log.status == "success", log.error
    (sample,) = log.samples
    score = sample.scores["forge_scorer"]
    assert score.value == "C", score.explanation
    assert "gate no_status_update_posted: passed" in score.explanation, score.explanation
    assert "judge judge: 1.00: stand-in rubric: all of it" in score.explanation  # the judge's reason
    assert score.metadata["forge_score"] == 1.0, score.metadata
    run_id = _forge_info(sample)["run_id"]
    assert lab.is_empty(_left(run_id)), _left(run_id)
