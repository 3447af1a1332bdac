"""A golden test's own project name, and its goldens removed after it: the same in every golden test."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from forgelib.runner import Runner
from forgelib.stacks.snapshots import store


def goldens_of(runner: Runner, project: str) -> list[store.Golden]:
    return [g for g in store.list_goldens(runner) if g.part("project") == project]


@contextmanager
def own_project(runner: Runner, prefix: str) -> Iterator[str]:
    """A project name of its own (``prefix`` and a random part); every golden taken under it is removed
    afterwards, and proven gone."""
    name = f"{prefix}{secrets.token_hex(3)}"
    yield name
    for g in goldens_of(runner, name):
        store.remove(runner, g, force_untag=True)
    assert not goldens_of(runner, name)


def misstate(runner: Runner, golden: store.Golden, workdir: Path, **parts: str) -> None:
    """Rebuild ``golden`` under its own tag with the fingerprint it records changed in ``parts``: a golden
    that starts but restores other state than it says, which its check must catch."""
    state = json.loads(golden.labels[store.STATE])
    state.update(parts)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "Dockerfile").write_text(
        f"FROM {golden.id}\nLABEL {json.dumps(store.STATE)}={json.dumps(json.dumps(state))}\n"
    )
    runner.run(
        ["docker", "build", "-q", "-t", store.tag_of(golden.key), str(workdir)],
        timeout=300,
        env={"DOCKER_BUILDKIT": "0"},
    )
