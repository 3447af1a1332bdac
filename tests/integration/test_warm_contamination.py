"""The contamination suite: ``forge run --stacks warm --repeats 4`` on tests/fixtures/contamination.

Each trial's oracle first records everything it observes, as a hostile agent would list it (postgres
rows, schema, tables, every database in ``pg_database``, roles, ALTER SYSTEM and role settings,
tablespaces, extensions; every redis index's keys and values, a config value and the ACL users; the
workspace tree with modes and hashes, dotfiles included; stray background processes), then hunts forge's
own databases (opens and changes any it finds), vandalises all of it (postgres: a new role, database,
extension, ALTER SYSTEM too; redis: an ACL user, the default user's rules, a function and a script) and
leaves a background process writing into the workspace. ``beyond_reach`` also sets a password on redis's
default user, which locks forge's reset out.

Every trial must observe exactly what the first (freshly provisioned) trial observed, and that is what
a trial of a fresh stack (``stacks: fresh``) observes too. The observation includes what the server's own
OS user sees of postgres's container (through COPY … FROM PROGRAM: PID 1 and its children, ``ls -la /``,
the stat of ``/forge``): the exact reset restarts the server in place under forge's loop, which runs the
same in a fresh stack, so fresh and restored are equal there as well. With postgres's default (exact)
reset there are no databases of forge's to find and everything on postgres is undone: the within-reach
trials run on the reset stack (reuse 1, 2, 3); every trial after a beyond-reach one runs on a replaced
stack, its redis reset refused by the server. The template strategy (an opt-in): its two databases
show, the hunt changes them, and the next trial runs on a replaced stack. Nothing is left on the engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from forgelib.cli.run import RunOptions, main_run
from forgelib.docker import labels as lab
from forgelib.runner import SubprocessRunner

pytestmark = pytest.mark.integration

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "contamination" / "run_configs"
CONFIG = CONFIGS / "warm.yaml"


def _trial(run_dir: Path, task: str, index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    d = run_dir / "trials" / task / str(index)
    return yaml.safe_load((d / "trial.yaml").read_text()), json.loads((d / "oracle.stdout").read_text())


def test_every_warm_trial_observes_what_the_first_fresh_one_did(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    with _engine_events(runner, tmp_path / "engine-events.jsonl") as engine_events:
        rc = main_run(RunOptions(str(CONFIG), output=str(tmp_path / "runs"), as_json=True))
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    try:
        assert rc == 0, (run_dir / "summary.json").read_text()
        first_trial, first = _trial(run_dir, "within_reach", 0)
        assert first["t_rows"] == [["seeded"]] and first["redis"] and first["tree"]
        # what a fresh stack lists: the seeded database and postgres's own, nothing of forge's
        assert [d[0] for d in first["databases"]] == ["app", "postgres", "template0", "template1"]
        assert first["extensions"] == [["plpgsql"]] and first["system_settings"] == []
        assert first["runner_addresses"] == 1  # and so in every trial: one endpoint answers for `runner`
        # postgres runs under forge's loop (PID 1), its data directory's copy in root-only /forge
        pid1 = first["db_container"][0].rstrip()
        assert pid1.endswith(" forge-supervise docker-entrypoint.sh postgres"), pid1
        assert "forge: 700 root:root 3 4096 directory" in first["db_container"], first
        assert first_trial["stack"]["reuse"] == 0 and first_trial["stack"]["replaced"] is None
        assert "recipe:db" in first_trial["timings"]

        stacks = []
        for task in ("within_reach", "beyond_reach"):
            for i in range(4):
                trial, observed = _trial(run_dir, task, i)
                assert observed == first, f"{task}[{i}] observed something the first trial did not"
                stacks.append(trial["stack"])
                if trial["stack"]["reuse"]:
                    # reset in place (when the trial before gave it back): every reset service restored,
                    # then verified
                    steps = set(trial["stack"]["reset_ahead"])
                    assert {"reset:db", "reset:cache", "reset:ws", "fingerprint:db"} <= steps, trial["stack"]
                # workers 1: a stack is always free, and the record says the trial queued ~0 s for it
                assert 0 <= trial["timings"]["stack_wait"] <= trial["wall_seconds"]

        # within_reach[1..3] and beyond_reach[0] reuse the first stack, reset in place each time ...
        assert [s["reuse"] for s in stacks[:5]] == [0, 1, 2, 3, 4], stacks
        assert all(s["name"] == stacks[0]["name"] and s["replaced"] is None for s in stacks[:5]), stacks
        # ... and after each beyond-reach trial redis's reset cannot get in: a new stack (postgres's role,
        # database, settings and extension, redis's ACL users and functions were undone by their resets).
        for s in stacks[5:]:
            assert s["reuse"] == 0 and "'cache'" in s["replaced"], s
            assert "the seeded credentials no longer open the server" in s["replaced"], s
        assert len({s["name"] for s in stacks}) == 4

        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["stacks"] == {"mode": "warm", "replaced": 3}
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        assert sum(e["kind"] == "stack_replaced" for e in events) == 3
    finally:
        left = lab.resources_with_labels(runner, {lab.RUN: run_dir.name})
        assert lab.is_empty(left), f"leaked: {left}"
    # A fresh stack's trial (no warm pool, nothing prepared) observes what the restored ones did.
    rc = main_run(RunOptions(str(CONFIGS / "fresh.yaml"), output=str(tmp_path / "fresh"), as_json=True))
    (fresh_dir,) = [p for p in (tmp_path / "fresh").iterdir() if p.is_dir()]
    try:
        assert rc == 0, (fresh_dir / "summary.json").read_text()
        fresh_trial, fresh = _trial(fresh_dir, "within_reach", 0)
        assert fresh_trial["stack"]["reuse"] == 0 and fresh_trial["stack"]["mode"] == "fresh", fresh_trial
        assert fresh == first
    finally:
        left = lab.resources_with_labels(runner, {lab.RUN: fresh_dir.name})
        assert lab.is_empty(left), f"leaked: {left}"
    # Nor an unlabelled volume (the labels above cannot see one): the exact reset's helper once kept its
    # pristine copy on an anonymous volume that `down --remove-orphans` left behind, one per warm stack.
    # Every volume the run's own containers mounted (the engine's events say which) must be gone.
    mounted = _volumes_mounted_by_run(engine_events, run_dir.name)
    assert len(mounted) >= 4, mounted  # each of the 4 stacks' postgres data, at least: the stream saw them
    left = [v for v in sorted(mounted) if runner.run(["docker", "volume", "inspect", v], check=False).rc == 0]
    assert not left, f"volumes of the run's containers left behind: {left}"


@contextmanager
def _engine_events(runner: SubprocessRunner, path: Path) -> Iterator[Path]:
    """The engine's container-create and volume events while the block runs, streamed to ``path`` (the
    daemon keeps only its last 256 events, and other tests share the engine). On leaving, a sentinel
    volume's own event proves the stream caught up before it is stopped."""
    sentinel = f"forgetest-events-{os.getpid()}-{path.parent.name}"
    argv = ["docker", "events", "--format", "{{json .}}"]
    argv += ["--filter", "type=container", "--filter", "type=volume", "--filter", "event=create"]
    argv += ["--filter", "event=mount"]
    with path.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL)
        try:
            yield path
            runner.run(["docker", "volume", "create", sentinel], timeout=60)
            runner.run(["docker", "volume", "rm", sentinel], timeout=60)
            deadline = time.monotonic() + 120
            with path.open() as seen:  # follows the file as docker writes it, line by line
                while sentinel not in (line := seen.readline()):
                    assert proc.poll() is None, "docker events ended before the sentinel came"
                    assert time.monotonic() < deadline, "the sentinel's event never came"
                    if not line:
                        time.sleep(0.05)  # at the end of what docker wrote so far
        finally:
            proc.kill()
            proc.wait()


def _volumes_mounted_by_run(events: Path, run: str) -> set[str]:
    """The volumes that containers labelled with ``run`` mounted, from an ``_engine_events`` file."""
    ours: set[str] = set()
    mounted: dict[str, set[str]] = {}
    for line in events.read_text().splitlines():
        e = json.loads(line)
        attrs = e.get("Actor", {}).get("Attributes", {})
        if e.get("Type") == "container" and e.get("Action") == "create" and attrs.get(lab.RUN) == run:
            ours.add(e["Actor"]["ID"])
        if e.get("Type") == "volume" and e.get("Action") == "mount":
            mounted.setdefault(attrs.get("container", ""), set()).add(e["Actor"]["ID"])
    return {v for c in ours for v in mounted.get(c, ())}


def test_the_template_strategy_shows_its_databases_and_a_changed_copy_replaces_the_stack(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    rc = main_run(RunOptions(str(CONFIGS / "template.yaml"), output=str(tmp_path), as_json=True))
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    try:
        assert rc == 0, (run_dir / "summary.json").read_text()
        first_trial, first = _trial(run_dir, "template_hunt", 0)
        second_trial, second = _trial(run_dir, "template_hunt", 1)
        assert first_trial["stack"]["reuse"] == 0 and first_trial["stack"]["replaced"] is None
        forge = [d for d in first["databases"] if d[0].startswith("forge_")]
        # the trace the opt-in leaves, as a trial lists it: the template and the ready copy, both closed
        assert [(d[0][:10], d[1], d[2]) for d in forge] == [
            ("forge_pool", False, False),
            ("forge_tpl_", True, False),
        ]
        # the hunt opened and changed them: the reset refuses the copy, the trial gets a new stack
        assert second_trial["stack"]["reuse"] == 0, second_trial["stack"]
        assert "was changed or removed since it was made" in second_trial["stack"]["replaced"], second_trial
        assert second == first
        assert "replaced:" in (run_dir / "trials" / "template_hunt" / "1" / "trial.yaml").read_text()
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        assert [e["kind"] for e in events].count("stack_replaced") == 1
    finally:
        left = lab.resources_with_labels(runner, {lab.RUN: run_dir.name})
        assert lab.is_empty(left), f"leaked: {left}"
