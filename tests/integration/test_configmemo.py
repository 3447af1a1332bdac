"""``ConfigMemo`` against the real compose: a later stack's answer from the memo equals what ``docker
compose config`` prints for that stack's own project name, for every example environment's compose files
(no container is created)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from forgelib.docker.compose import ComposeProject
from forgelib.docker.configmemo import ConfigMemo, key
from forgelib.docker.images import ImageFacts
from forgelib.runner import Result, SubprocessRunner

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("docker_ready")]

REPO = Path(__file__).resolve().parents[2]
FILES = sorted(REPO.glob("examples/*/shared/environment.compose.yaml"))


@pytest.mark.parametrize("compose_file", FILES, ids=[f.parts[-3] for f in FILES])
def test_memo_answers_what_compose_prints_for_the_later_project(
    compose_file: Path, runner: SubprocessRunner
) -> None:
    env = ImageFacts().env(runner)
    asked: list[Sequence[str]] = []

    class Counting(SubprocessRunner):
        def run(self, argv: Sequence[str], **options: Any) -> Result:
            asked.append(argv)
            return super().run(argv, **options)

    def project(name: str) -> ComposeProject:
        return ComposeProject(name, (compose_file,), Counting(), image_env=env)

    memo = ConfigMemo()
    first, later = project("forge-memo-a-0-1a2b3c4d"), project("forge-memo-b-1-5e6f7a8b")
    assert key(first) is not None and key(first) == key(later)  # one environment, two stacks
    from_memo = [memo.config(first), memo.config(later)]
    assert len(asked) == 1  # compose was asked for the first stack only
    assert from_memo == [first.config(), later.config()]
