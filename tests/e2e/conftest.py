"""Helpers for the reference-pack e2e tests: drive the real ``forge`` CLI, read what it left on disk, and
prove it left nothing in Docker.

Every test runs forge as a user would (``python -m forgelib ...`` in a subprocess) against a pack under
``examples/`` and then reads the results directory, never forgelib's internals, so a green e2e means the
shipped command works. Docker is inspected directly (``docker ps``/``exec``) only for observations forge
itself does not report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from forgelib.docker.labels import (
    COMPOSE_PROJECT,
    COMPOSE_SERVICE,
    RUN,
    filters,
    is_empty,
    resources_with_labels,
)
from forgelib.runner import SubprocessRunner

RUN_TIMEOUT = 900  # seconds for one whole `forge run` (a trial is ~10 s; this only bounds a hang)
CLI_TIMEOUT = 300  # seconds for `forge provision` / `forge teardown`


def _forge(*args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``forge ARGS`` through the interpreter running the tests (the editable install under test)."""
    return subprocess.run(
        [sys.executable, "-m", "forgelib", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def forge() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``forge(*args)``: run the CLI, capture its output (no Docker needed for validate/stamp)."""
    return _forge


@dataclass(frozen=True)
class Trial:
    """One trial's directory: ``trial.yaml``, ``grade.yaml``, ``services/<svc>.log``."""

    dir: Path
    trial: Mapping[str, Any]
    grade: Mapping[str, Any]

    @property
    def status(self) -> str:
        return str(self.trial["status"])

    def check(self, name: str) -> Mapping[str, Any]:
        for c in self.grade["checks"]:
            if c["name"] == name:
                return dict(c)
        raise AssertionError(f"{self.dir}/grade.yaml has no check {name!r}: {self.grade['checks']}")

    def observed(self, name: str) -> str:
        """What check ``name`` saw, without the trailing newline ``cat``/``psql`` print."""
        value = self.check(name)["observed"]
        assert value is not None, f"check {name!r} observed nothing: {self.check(name)}"
        return str(value).rstrip("\r\n")

    def service_log(self, service: str) -> str:
        path = self.dir / "services" / f"{service}.log"
        assert path.is_file(), f"no captured log for {service!r} in {self.dir}/services"
        return path.read_text(encoding="utf-8", errors="replace")


@dataclass
class RunResult:
    """A finished ``forge run --json``: exit code, the JSON summary, and the run directory on disk."""

    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    summary: dict[str, Any] = field(default_factory=dict)
    run_dir: Path | None = None

    @property
    def run_id(self) -> str:
        return str(self.summary["run_id"])

    def explain(self) -> str:
        """Everything needed to see why a run went wrong, for assertion messages."""
        return f"$ {' '.join(self.argv)}\nrc={self.rc}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"

    def trials(self, task: str) -> list[Trial]:
        assert self.run_dir is not None
        base = self.run_dir / "trials" / task
        assert base.is_dir(), f"no trials of {task!r} under {self.run_dir}\n{self.explain()}"
        out = []
        for d in sorted((p for p in base.iterdir() if p.is_dir()), key=lambda p: int(p.name)):
            out.append(Trial(d, _yaml(d / "trial.yaml"), _yaml(d / "grade.yaml")))
        return out


def _yaml(path: Path) -> dict[str, Any]:
    assert path.is_file(), f"missing {path}"
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(doc, dict), f"{path} is not a mapping"
    return doc


def _forge_run(config: Path, output: Path, *extra: str) -> RunResult:
    """``forge run --config CONFIG --json --output OUTPUT``; parses the summary and locates the run dir."""
    argv = [sys.executable, "-m", "forgelib", "run", "--config", str(config), "--json"]
    argv += ["--output", str(output), *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    result = RunResult(argv, proc.returncode, proc.stdout, proc.stderr)
    try:
        result.summary = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"`forge run --json` did not print a JSON summary\n{result.explain()}")
    result.run_dir = output / result.run_id
    assert (result.run_dir / "summary.json").is_file(), result.explain()
    return result


@pytest.fixture(params=["fresh", "warm"])
def stacks(request: pytest.FixtureRequest) -> str:
    """The stack mode a pack's runs use (``--stacks``): every pack passes, and fails its control, in both."""
    return str(request.param)


@pytest.fixture(params=["fresh", "warm", "snapshots"])
def dev_stacks(request: pytest.FixtureRequest, runner: SubprocessRunner, tmp_path: Path) -> Iterator[str]:
    """How a pack's dev run gets its stacks: fresh, warm, or fresh from golden snapshots (``--snapshots``:
    the first trial captures the golden, the next restores it). Goldens this test's runs took are removed
    after — only those (by their run label): every golden new since the test began would include other
    sessions' on this engine, even captures still in flight."""
    yield str(request.param)
    if request.param == "snapshots":
        remove_goldens_of_runs(runner, tmp_path)


def remove_goldens_of_runs(runner: SubprocessRunner, tmp_path: Path) -> None:
    """Remove the goldens that this test's runs (under ``tmp_path/runs*``) took, and only those."""
    from forgelib.stacks.snapshots import store

    mine = {d.name for out in tmp_path.glob("runs*") if out.is_dir() for d in out.iterdir() if d.is_dir()}
    for g in store.list_goldens(runner):
        if g.labels.get(RUN) in mine:
            store.remove(runner, g, force_untag=True)


@pytest.fixture
def goldens_removed(runner: SubprocessRunner, tmp_path: Path) -> Iterator[None]:
    """For a test that runs with ``--snapshots`` itself: the goldens its runs took are removed after."""
    yield
    remove_goldens_of_runs(runner, tmp_path)


@pytest.fixture
def forge_run(
    tmp_path: Path, runner: SubprocessRunner, docker_ready: None
) -> Iterator[Callable[..., RunResult]]:
    """``forge_run(config, *extra)`` runs ``forge run`` into a fresh directory under ``tmp_path``.

    After the test, asserts that no container, network or volume carries the label of any run it made —
    checked even when the test body failed, so a red assertion on results never hides a leak.
    """
    outputs: list[Path] = []

    def run(config: Path, *extra: str) -> RunResult:
        output = tmp_path / f"runs{len(outputs)}"
        outputs.append(output)
        return _forge_run(config, output, *extra)

    yield run
    # Run ids from the directories on disk, not the JSON summary: a run that crashed or printed no
    # summary is still checked for leftovers.
    run_ids = [d.name for out in outputs if out.is_dir() for d in out.iterdir() if d.is_dir()]
    leaked = {}
    for run_id in run_ids:
        resources = resources_with_labels(runner, {RUN: run_id})
        if not is_empty(resources):
            leaked[run_id] = resources
    assert not leaked, f"resources left behind by the run(s): {leaked}"


# -------------------------------------------------------------- stacks kept up by `forge provision --keep`


@dataclass(frozen=True)
class KeptStack:
    """A stack `forge provision --keep --json` left up; `exec` runs in its containers via plain docker."""

    name: str  # the compose project
    run_id: str  # its io.forgelib.run label
    services: Mapping[str, list[str]]  # service -> ["127.0.0.1:49153->8000/tcp", ...]

    def url(self, service: str, port: int) -> str:
        """``http://host:published`` for ``service``'s container ``port``, from forge's own report."""
        for mapping in self.services.get(service, []):
            published, _, target = mapping.partition("->")
            if target.split("/")[0] == str(port):
                return f"http://{published}"
        raise AssertionError(f"{service}:{port} is not published in {self.name}: {self.services}")

    def container(self, service: str) -> str:
        proc = subprocess.run(
            ["docker", "ps", "--quiet", *filters({COMPOSE_PROJECT: self.name, COMPOSE_SERVICE: service})],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        ids = proc.stdout.split()
        assert len(ids) == 1, f"expected one running {service!r} container in {self.name}, got {ids}"
        return ids[0]

    def exec(
        self, service: str, argv: list[str], *, input: bytes | None = None, workdir: str | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        cmd = ["docker", "exec", "-i", *(["-w", workdir] if workdir else []), self.container(service), *argv]
        return subprocess.run(cmd, input=input, capture_output=True, timeout=CLI_TIMEOUT, check=False)

    def read(self, service: str, path: str) -> bytes:
        proc = self.exec(service, ["cat", "--", path])
        assert proc.returncode == 0, f"cat {path} in {service}: {proc.stderr.decode(errors='replace')}"
        return proc.stdout


@pytest.fixture
def provision_keep(runner: SubprocessRunner, docker_ready: None) -> Iterator[Callable[..., KeptStack]]:
    """``provision_keep(project_dir, task)`` runs ``forge provision --keep --json`` and returns the stack.

    Afterwards every kept stack is removed with ``forge teardown --name`` (as a user would), which must
    succeed and leave no container, network or volume labelled with its run.
    """
    stacks: list[KeptStack] = []

    def provision(project: Path, task: str) -> KeptStack:
        proc = _forge("provision", "--project", str(project), "--task", task, "--keep", "--json")
        assert proc.returncode == 0, f"forge provision failed (rc={proc.returncode}):\n{proc.stderr}"
        report = json.loads(proc.stdout)
        stack = KeptStack(report["name"], report["run_id"], report["services"])
        stacks.append(stack)
        return stack

    yield provision
    problems = []
    for s in stacks:
        down = _forge("teardown", "--name", s.name)
        if down.returncode != 0:
            problems.append(f"forge teardown --name {s.name}: rc={down.returncode}\n{down.stderr}")
        resources = resources_with_labels(runner, {RUN: s.run_id})
        if not is_empty(resources):
            problems.append(f"{s.name} left {resources}")
    assert not problems, "\n".join(problems)
