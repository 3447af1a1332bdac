"""A container that forge has compose recreate (``up(force_recreate=True)``: an ephemeral service's fallback,
a checkpoint restore of a service in its own layer) takes its anonymous volumes along, on the real engine.
Compose's own recreate removes the old container without them and, with ``--renew-anon-volumes``, leaves
them behind unlabelled, where no reaper can tell them from anyone else's."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
import yaml
from support.stacks import REDIS, TIMEOUTS

from forgelib.docker import argv as dk
from forgelib.docker.compose import ComposeProject
from forgelib.runner import SubprocessRunner

pytestmark = pytest.mark.integration


def _volumes(compose: ComposeProject) -> set[str]:
    """The volumes mounted by the stack's containers (here: the image's anonymous ``/data``)."""
    return {str(m["Name"]) for info in compose.inspect() for m in info["Mounts"] if m["Type"] == "volume"}


def _existing(runner: SubprocessRunner, names: set[str]) -> set[str]:
    return names & set(runner.run(dk.ls("volume", quiet=True), timeout=60).stdout.split())


def test_a_recreated_container_takes_its_anonymous_volumes_along(
    docker_ready: None, runner: SubprocessRunner, tmp_path: Path
) -> None:
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump({"services": {"cache": REDIS}}))
    compose = ComposeProject(
        f"it-recreate-{secrets.token_hex(4)}", (tmp_path / "compose.yaml",), runner, TIMEOUTS
    )
    first: set[str] = set()
    try:
        compose.up(["cache"])
        first = _volumes(compose)
        assert first, "the redis image declares VOLUME /data: its container mounts an anonymous volume"
        compose.up(["cache"], wait=False, no_deps=True, force_recreate=True)
        second = _volumes(compose)
        assert second and not second & first  # renewed, not inherited
        assert _existing(runner, first) == set(), "the replaced container's volume was left behind"
    finally:
        compose.down()
        left = _existing(runner, first)
        if left:  # what a failure left: never on the shared engine
            runner.run(dk.rm(sorted(left), kind="volume"), timeout=60, check=False)
    assert _existing(runner, second) == set()
