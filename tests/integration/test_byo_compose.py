"""Bring your own compose file, on the real engine (tests/fixtures/byo_compose): fixed host ports and
container names, a build: section, and what compose combines (a list of files, include, extends, .env,
env_file, a profile from the run config, YAML anchors).

One run of --workers 4 --repeats 4 proves most of it at once: every trial passes (each grading check is one
compose feature), the host ports differ per trial and are on 127.0.0.1, the image is built once and removed
with the run. A broken Dockerfile fails every trial at stage build after one build.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from forgelib.cli.commands import main_provision, main_teardown
from forgelib.cli.run import build_plan
from forgelib.docker import labels as lab
from forgelib.pytest_plugin.stacks import StackPool
from forgelib.run.events import summarize
from forgelib.run.execute import run_project
from forgelib.runner import Result, SubprocessRunner
from forgelib.spec.loader import load_project_config, load_run_config
from forgelib.stacks import DockerBackend
from forgelib.stacks.provision import StackContext

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "byo_compose"


class RecordingRunner(SubprocessRunner):
    """The real runner, remembering every argv (to count builds)."""

    def __init__(self) -> None:
        super().__init__(default_timeout=60)
        self.argvs: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], **kw: Any) -> Result:
        self.argvs.append(tuple(argv))
        return super().run(argv, **kw)

    def builds(self) -> list[tuple[str, ...]]:
        return [a for a in self.argvs if a[:2] == ("docker", "compose") and "build" in a]


def _run(root: Path, runner: RecordingRunner) -> tuple[str, Path, dict[str, Any]]:
    cfg = load_run_config(root / "run_configs" / "parallel.yaml")
    project = load_project_config(cfg.project)
    backend = DockerBackend(StackContext(project, cfg.timeouts, runner, profiles=tuple(cfg.profiles)))
    run_dir, state = run_project(build_plan(cfg, project), backend, lambda line: None)
    return str(state.run_id), run_dir, summarize(state)


def _images(runner: SubprocessRunner, run_id: str) -> list[str]:
    out = runner.run(["docker", "image", "ls", "-q", *lab.filters({lab.RUN: run_id})]).stdout
    return out.split()


def test_fixed_ports_and_names_run_four_at_once_with_every_compose_feature(
    tmp_path: Path, runner: SubprocessRunner
) -> None:
    root = tmp_path / "byo"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("runs"))
    rec = RecordingRunner()
    run_id, run_dir, summary = _run(root, rec)
    try:
        tot = summary["totals"]
        assert (tot["trials"], tot["passed"]) == (4, 4), json.dumps(summary["trials"], indent=1)
        ports: dict[str, list[str]] = {"web": [], "cache": []}
        for trial in sorted(run_dir.glob("trials/byo/*/trial.yaml")):
            doc = yaml.safe_load(trial.read_text())
            for svc, published in doc["ports"].items():
                ports[svc] += published
        for svc, target in (("web", 8000), ("cache", 6379)):
            assert len(ports[svc]) == 4 and len(set(ports[svc])) == 4, ports  # one distinct host port each
            assert all(p.startswith("127.0.0.1:") and p.endswith(f"->{target}/tcp") for p in ports[svc])
        # Built once for the run's four trials, labelled with the run, removed when it ended.
        assert len(rec.builds()) == 1, rec.builds()
        assert _images(runner, run_id) == []
    finally:
        leftovers = lab.resources_with_labels(runner, {lab.RUN: run_id})
        assert lab.is_empty(leftovers), leftovers


def test_a_failing_build_fails_every_trial_at_stage_build_after_one_attempt(
    tmp_path: Path, runner: SubprocessRunner
) -> None:
    root = tmp_path / "byo"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("runs"))
    (root / "tool" / "Dockerfile").write_text(
        "FROM forgelib/python:3.11\nRUN echo no-such-step >&2; exit 3\n"
    )
    cfg = root / "run_configs" / "parallel.yaml"
    cfg.write_text(cfg.read_text().replace("repeats: 4", "repeats: 2").replace("workers: 4", "workers: 2"))
    rec = RecordingRunner()
    run_id, _, summary = _run(root, rec)
    tot = summary["totals"]
    assert (tot["trials"], tot["passed"], tot["errors_by_stage"]) == (2, 0, {"build": 2}), summary
    for trial in summary["trials"]:
        (reason,) = trial["reasons"]
        assert reason.startswith("Provisioning failed at build: building service(s) tool failed"), reason
        assert "fix the Dockerfile" in reason
    assert len(rec.builds()) == 1, rec.builds()
    assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))
    assert _images(runner, run_id) == []


def test_forge_provision_shows_the_loopback_mapping_enables_profiles_and_teardown_removes_all(
    tmp_path: Path, runner: SubprocessRunner, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "byo"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("runs"))
    assert main_provision(str(root), None, keep=True, as_json=True, profiles=["extra"]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    name, run_id, work_dir = report["name"], report["run_id"], Path(report["trial_dir"])
    try:
        assert [p.split(":")[0] for p in report["services"]["web"]] == ["127.0.0.1"]
        assert report["services"]["web"][0].endswith("->8000/tcp") and report["services"]["probe"] == []
        assert "container_name 'byo-web' is dropped" in out.err  # what forge changed, said once
        # --profile extra: the profile's service runs (without it compose would not start `probe`)
        service = ["--format", f'{{{{.Label "{lab.COMPOSE_SERVICE}"}}}}']
        ps = ["docker", "ps", *lab.filters({lab.COMPOSE_PROJECT: name}), *service]
        running = runner.run(ps).stdout.split()
        assert sorted(running) == ["cache", "probe", "tool", "web"]
        # kept: its built image and its directory stay with it...
        assert len(_images(runner, run_id)) == 1 and (work_dir / "compose.forge.yaml").exists()
    finally:
        assert main_teardown(name) == 0
    # ...until `forge teardown` removes them with it
    assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: run_id}))
    assert _images(runner, run_id) == [] and not work_dir.exists()


def test_the_pytest_plugins_session_removes_the_images_it_built(
    tmp_path: Path, runner: SubprocessRunner
) -> None:
    """A pytest session's stacks build a ``build:`` service's image once, as a run does, and the session's
    end removes it, as a run's end does (it was left behind before)."""
    root = tmp_path / "byo"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("runs"))
    pool = StackPool(run_id=f"pytest-byo-{os.getpid()}")
    try:
        for _ in range(2):
            stack = pool.provision(root, None)
            assert "tool" in stack.services
            pool.teardown(stack)
        assert len(_images(runner, pool.run_id)) == 1  # built once for the session, still there
    finally:
        assert pool.close() == []
    assert _images(runner, pool.run_id) == []
    assert lab.is_empty(lab.resources_with_labels(runner, {lab.RUN: pool.run_id}))
