"""Reading an environment's compose files as compose combines them: a list of files, include, extends and
YAML anchors, each value still located (file:line:col)."""

from __future__ import annotations

from pathlib import Path

import pytest

from forgelib.errors import SpecError
from forgelib.spec.composefiles import load_compose_set
from forgelib.spec.loader import load_project_config, load_run_config


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _project(root: Path, compose_file: str, services: str = "") -> None:
    _write(
        root,
        {
            "project.yaml": (
                f"name: p\ndefault_environment:\n  compose_file: {compose_file}\n"
                f"  services:\n    {services or 'app: {isolation: ephemeral}'}\n"
            )
        },
    )


def test_a_list_of_files_include_extends_and_anchors_merge_as_compose_does(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "base.yaml": (
                "x-common: &common\n  image: forgelib/python:3.11\n  environment: {A: '1'}\n"
                "include:\n  - inc/db.yaml\n"
                "services:\n  app:\n    <<: *common\n    ports: ['8000:8000']\n"
                "  worker:\n    extends: {file: lib.yaml, service: tmpl}\n    command: [run]\n"
            ),
            "inc/db.yaml": "services:\n  db:\n    image: forgelib/postgres:15\n",
            "lib.yaml": (
                "services:\n  tmpl:\n    image: forgelib/python:3.11\n"
                "    command: [base]\n    privileged: true\n"
            ),
            "over.yaml": "services:\n  app:\n    ports: ['9000:9000']\n    environment: {B: '2'}\n",
        },
    )
    cset = load_compose_set([tmp_path / "base.yaml", tmp_path / "over.yaml"])
    assert not cset.issues
    assert list(cset.services) == ["db", "app", "worker"]
    app = cset.services["app"].data()
    assert app["image"] == "forgelib/python:3.11"  # from the anchor
    assert app["ports"] == ["8000:8000", "9000:9000"]  # ports accumulate across files
    assert app["environment"] == {"A": "1", "B": "2"}  # mappings merge across files, the later file wins
    worker = cset.services["worker"]
    assert worker.data()["command"] == ["run"] and worker.data()["privileged"] is True
    priv = worker.last("privileged")
    assert priv is not None and priv.doc.file == tmp_path / "lib.yaml" and priv.issue("x").line == 5
    ports = [w.issue("x") for w in cset.services["app"].items("ports")]
    assert [(Path(i.file).name, i.line) for i in ports] == [("base.yaml", 9), ("over.yaml", 3)]


def test_project_with_a_list_of_compose_files_and_an_include_loads(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "compose.yaml": "include: [extra.yaml]\nservices:\n  app: {image: forgelib/python:3.11}\n",
            "extra.yaml": "services:\n  db: {image: forgelib/postgres:15}\n",
            "more.yaml": "services:\n  app: {command: [x]}\n",
        },
    )
    _project(tmp_path, "[compose.yaml, more.yaml]", "db: {isolation: ephemeral}")
    env = load_project_config(tmp_path).environment
    assert env.compose_files == (tmp_path / "compose.yaml", tmp_path / "more.yaml")
    assert env.compose_file == tmp_path / "compose.yaml"
    assert set(env.services) == {"app", "db"}
    assert env.compose["services"]["app"] == {"image": "forgelib/python:3.11", "command": ["x"]}


@pytest.mark.parametrize(
    ("files", "compose_file", "expected"),
    [
        (
            {"compose.yaml": "services: {app: {image: x}}\n"},
            "[compose.yaml, gone.yaml]",
            "gone.yaml not found",
        ),
        (
            {"compose.yaml": "include: [nope.yaml]\nservices: {app: {image: x}}\n"},
            "compose.yaml",
            "compose.yaml:1:11: $.include[0]: included file 'nope.yaml' not found",
        ),
        (
            {"compose.yaml": "services:\n  app:\n    extends: {service: ghost}\n"},
            "compose.yaml",
            "compose.yaml:3:14: $.services.app.extends: extends names service 'ghost', which is not defined",
        ),
        (
            {
                "compose.yaml": "include: [b.yaml]\nservices: {app: {image: x}}\n",
                "b.yaml": "include: [compose.yaml]\n",
            },
            "compose.yaml",
            "includes itself",
        ),
    ],
)
def test_broken_compose_sets_are_located(
    tmp_path: Path, files: dict[str, str], compose_file: str, expected: str
) -> None:
    _write(tmp_path, files)
    _project(tmp_path, compose_file)
    with pytest.raises(SpecError) as e:
        load_project_config(tmp_path)
    assert expected in str(e.value)


def test_the_byo_fixture_loads_every_service_and_its_run_config_selects_a_profile() -> None:
    root = Path(__file__).resolve().parents[2] / "fixtures" / "byo_compose"
    project = load_project_config(root)
    env = project.environment
    assert [f.name for f in env.compose_files] == ["compose.yaml", "compose.more.yaml"]
    assert set(env.services) == {"web", "cache", "tool", "probe"}  # cache from include, tool via extends
    assert env.compose["services"]["tool"]["command"][0] == "sh"  # extends: the template's command
    assert env.compose["services"]["web"]["environment"]["ANCHORED"] == "yes"  # the anchor's merge key
    assert load_run_config(root / "run_configs" / "parallel.yaml", project).profiles == ("extra",)


def test_a_profile_name_compose_would_refuse_is_a_run_config_error(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {"compose.yaml": "services: {app: {image: x}}\n", "run.yaml": "project: .\nprofiles: ['-x']\n"},
    )
    _project(tmp_path, "compose.yaml")
    with pytest.raises(SpecError) as e:
        load_run_config(tmp_path / "run.yaml")
    assert "run.yaml:2:" in str(e.value) and "$.profiles[0]" in str(e.value)
