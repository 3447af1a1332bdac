"""``ConfigMemo``: one ``docker compose config`` per environment, asked under a placeholder name and given
to every stack under its own project name (wherever compose put the name, interpolated values too), and
a new call whenever anything compose reads changed (the key)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from forgelib.docker.compose import ComposeProject
from forgelib.docker.configmemo import ConfigMemo, key
from forgelib.testing import ANY, Call, FakeRunner

COMPOSE = """\
services:
  db:
    image: ${FORGE_IMAGE_POSTGRES:-postgres:16}
    env_file: [db.env]
    volumes: [data:/var/lib/postgresql/data]
volumes:
  data: {}
"""


def answer(project: str, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """What compose prints for COMPOSE above, resolved for ``project``."""
    return {
        "name": project,
        "services": {
            "db": {
                "image": "forgelib/postgres:15",
                "environment": {"POSTGRES_PASSWORD": "pw", **(extra_env or {})},
                "networks": {"default": None},
                "volumes": [{"type": "volume", "source": "data", "target": "/var/lib/postgresql/data"}],
            }
        },
        "networks": {"default": {"name": f"{project}_default"}},
        "volumes": {"data": {"name": f"{project}_data"}},
    }


class Compose:
    """A project directory and a fake compose that answers ``config`` for whichever project asks."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.file = tmp_path / "compose.yaml"
        self.file.write_text(COMPOSE)
        (tmp_path / "db.env").write_text("POSTGRES_PASSWORD=pw\n")
        self.fake = FakeRunner()
        self.extra_env: dict[str, str] = {}
        self.interpolated = False  # a value holds ${COMPOSE_PROJECT_NAME}-x

        def reply(call: Call) -> None:
            project = call.argv[call.argv.index("--project-name") + 1]
            env = {**self.extra_env, **({"STACK": f"{project}-x"} if self.interpolated else {})}
            expectation.stdout = json.dumps(answer(project, env))

        expectation = self.fake.expect("docker", "compose", ANY, ANY, "--project-name", side_effect=reply)

    def project(self, name: str, image_env: dict[str, str] | None = None) -> ComposeProject:
        env = {"FORGE_IMAGE_POSTGRES": "forgelib/postgres:15"} if image_env is None else image_env
        return ComposeProject(name, (self.file,), self.fake, image_env=env)

    def asked(self) -> list[str]:
        return [c.argv[c.argv.index("--project-name") + 1] for c in self.fake.calls]


def test_second_stack_of_the_same_environment_is_answered_from_the_memo_under_its_own_name(
    tmp_path: Path,
) -> None:
    c = Compose(tmp_path)
    memo = ConfigMemo()
    first = memo.config(c.project("proj-r1-t-0-aaaa"))
    second = memo.config(c.project("proj-r1-t-1-bbbb"))
    assert len(c.asked()) == 1 and c.asked()[0].startswith("forgeconfig")  # a name no file can hold
    assert first == answer("proj-r1-t-0-aaaa")
    assert second == answer("proj-r1-t-1-bbbb")  # exactly what compose would have printed for it


def test_answers_are_independent_copies(tmp_path: Path) -> None:
    c = Compose(tmp_path)
    memo = ConfigMemo()
    memo.config(c.project("proj-a")).setdefault("services", {}).clear()
    second = memo.config(c.project("proj-b"))
    second["services"]["db"]["image"] = "changed"
    assert memo.config(c.project("proj-c")) == answer("proj-c")
    assert len(c.asked()) == 1


@pytest.mark.parametrize("change", ["compose file", "env_file", "dotenv", "image env", "process env"])
def test_anything_compose_reads_changing_asks_compose_again(
    tmp_path: Path, change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Compose(tmp_path)
    memo = ConfigMemo()
    memo.config(c.project("proj-a"))
    image_env = None
    if change == "compose file":
        c.file.write_text(COMPOSE.replace("postgres:16", "postgres:17"))
    elif change == "env_file":
        (tmp_path / "db.env").write_text("POSTGRES_PASSWORD=other\n")
    elif change == "dotenv":
        (tmp_path / ".env").write_text("X=1\n")
    elif change == "image env":
        image_env = {"FORGE_IMAGE_POSTGRES": "postgres:16"}
    else:
        monkeypatch.setenv("FORGE_CONFIGMEMO_TEST", "1")  # interpolation may read any variable
    memo.config(c.project("proj-b", image_env))
    memo.config(c.project("proj-c", image_env))
    assert len(c.asked()) == 2  # the new answer is kept in turn


def test_the_project_name_interpolated_in_a_value_is_renamed_with_it(tmp_path: Path) -> None:
    c = Compose(tmp_path)
    c.interpolated = True
    memo = ConfigMemo()
    assert memo.config(c.project("proj-a")) == answer("proj-a", {"STACK": "proj-a-x"})
    assert memo.config(c.project("proj-b")) == answer("proj-b", {"STACK": "proj-b-x"})
    assert len(c.asked()) == 1


def test_a_value_that_only_looks_like_a_stacks_name_is_left_as_it_is(tmp_path: Path) -> None:
    """A value equal to the first stack's name by chance (not compose's doing) stays for every stack."""
    c = Compose(tmp_path)
    c.extra_env = {"PREFIX": "proj-a"}
    memo = ConfigMemo()
    assert memo.config(c.project("proj-a"))["services"]["db"]["environment"]["PREFIX"] == "proj-a"
    assert memo.config(c.project("proj-b"))["services"]["db"]["environment"]["PREFIX"] == "proj-a"
    assert len(c.asked()) == 1


@pytest.mark.parametrize(
    "doc",
    [
        "include: [other.yaml]\nservices: {}\n",
        "services:\n  a: {image: x, extends: {file: base.yaml, service: b}}\n",
        "services:\n  a: {image: x, env_file: ${ENV_DIR}/a.env}\n",
        "services:\n  a: {image: x, env_file: [{required: false}]}\n",
        "services: [a, b]\n",
        "services:\n  a: {image: x\n",  # compose says what is wrong with it
    ],
)
def test_files_it_cannot_follow_are_resolved_by_compose_every_time(tmp_path: Path, doc: str) -> None:
    c = Compose(tmp_path)
    c.file.write_text(doc)
    assert key(c.project("proj-a")) is None
    memo = ConfigMemo()
    memo.config(c.project("proj-a"))
    memo.config(c.project("proj-b"))
    assert c.asked() == ["proj-a", "proj-b"]


def test_env_file_entries_in_every_shape_are_in_the_key(tmp_path: Path) -> None:
    c = Compose(tmp_path)
    c.file.write_text(
        "services:\n  a: {image: x, env_file: [a.env, {path: b.env, required: false}], label_file: l.env}\n"
    )
    before = key(c.project("proj-a"))
    keys = {before}
    for name in ("a.env", "b.env", "l.env"):
        (tmp_path / name).write_text(f"{name}=1\n")
        keys.add(key(c.project("proj-a")))
    assert before is not None and len(keys) == 4
