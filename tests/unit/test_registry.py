"""The seed kinds cannot drift: the schema's list, ``SeedKind``, the recipe registry, and the reset options
the spec checks accept must all agree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from forgelib.kinds.base import SeedTarget
from forgelib.kinds.registry import REGISTRY
from forgelib.spec.models import Seed, SeedKind
from forgelib.spec.rules import SHORTHAND_KINDS
from forgelib.spec.schema import schema
from forgelib.spec.validate import validate_project

FIXTURE = Path(__file__).parent.parent / "fixtures" / "projects" / "basic"


def test_schema_seed_kinds_equal_seed_kind_enum() -> None:
    assert set(schema("project")["$defs"]["seed_kind"]["enum"]) == {k.value for k in SeedKind}


def test_registry_has_a_recipe_for_exactly_every_kind() -> None:
    assert set(REGISTRY) == set(SeedKind)


def test_the_schema_lists_exactly_the_options_the_recipes_understand() -> None:
    reset_keys = set(schema("project")["$defs"]["reset"]["properties"])
    assert reset_keys == {"seed"}.union(*(r.OPTIONS for r in REGISTRY.values()))


# The fixture's reset services and the kind of the seed each one binds.
BOUND = {"app-db": SeedKind.SQL_DUMP, "cache": SeedKind.REDIS_DUMP, "files": SeedKind.FILESYSTEM_DIR}


@pytest.mark.parametrize("service", sorted(BOUND))
def test_validate_takes_a_recipes_own_options_and_refuses_others(tmp_path: Path, service: str) -> None:
    project = tmp_path / "basic"
    shutil.copytree(FIXTURE, project, symlinks=True)
    kind = BOUND[service]
    union = set().union(*(r.OPTIONS for r in REGISTRY.values()))
    text = (project / "project.yaml").read_text()
    for option in sorted(union):
        (project / "project.yaml").write_text(_with_option(text, service, option))
        problems = [str(i) for i in validate_project(str(project)).errors]
        refused = [p for p in problems if f"option {option!r} does not apply" in p]
        if option in REGISTRY[kind].OPTIONS:
            assert refused == [], problems
        else:
            assert len(refused) == 1 and f"of kind {kind.value}" in refused[0], problems


def _with_option(text: str, service: str, option: str) -> str:
    """The project with ``option: /x`` (valid for every option but the strategy, which gets one of its
    values) in ``service``'s reset binding."""
    value = "exact" if option == "strategy" else "/x"
    lines = text.splitlines(keepends=True)
    i = next(n for n, ln in enumerate(lines) if ln.strip() == f"{service}:")
    j = next(n for n in range(i, len(lines)) if lines[n].strip().startswith("reset:"))
    if lines[j].strip() == "reset:":  # block form: the next lines, one deeper
        indent = lines[j + 1][: len(lines[j + 1]) - len(lines[j + 1].lstrip())]
        lines.insert(j + 1, f"{indent}{option}: {value}\n")
    else:
        lines[j] = lines[j].replace("}", f", {option}: {value}}}", 1)
    return "".join(lines)


def test_shorthand_kinds_are_seed_kinds() -> None:
    assert set(SHORTHAND_KINDS.values()) <= set(SeedKind)


def test_an_unknown_reset_strategy_names_the_file_line_and_the_choices(tmp_path: Path) -> None:
    project = tmp_path / "basic"
    shutil.copytree(FIXTURE, project, symlinks=True)
    text = (project / "project.yaml").read_text()
    (project / "project.yaml").write_text(_with_option(text, "app-db", "strategy").replace("exact", "fast"))
    (problem,) = [str(i) for i in validate_project(str(project)).errors]
    assert "project.yaml:" in problem and ".reset.strategy" in problem, problem
    assert "'fast' is not one of: exact, restart, template" in problem, problem


def test_each_kind_owns_its_extra_mount(tmp_path: Path) -> None:
    """``Recipe.seed_mount``: only ``bare`` mounts its seed (read-only, named by its variable)."""
    seed_file = tmp_path / "order.json"
    for kind, recipe in REGISTRY.items():
        seed = Seed(name="widget-order", path=seed_file, kind=kind, digest="sha256:" + "0" * 64)
        m = recipe.seed_mount(SeedTarget("runner", seed))
        if kind is SeedKind.BARE:
            at = "/run/forge/seeds/widget-order"
            assert m is not None and m.env() == {"FORGE_SEED_WIDGET_ORDER": at}
            assert m.volume() == {"type": "bind", "source": str(seed_file), "target": at, "read_only": True}
        else:
            assert m is None, kind


def test_every_kinds_recipe_has_every_member_the_recipe_protocol_names() -> None:
    """The registry loads each kind's recipe module by name, so nothing static checks it against ``Recipe``:
    a hook added to the protocol and missed by one kind would fail only when a stack reaches it."""
    import inspect

    from forgelib.kinds import KINDS
    from forgelib.kinds import registry as kinds
    from forgelib.kinds.base import Recipe

    wanted = {
        name
        for name, _ in inspect.getmembers(Recipe)
        if not name.startswith("_") and name not in {"fail"}
    } | set(Recipe.__annotations__)
    missing = [
        f"{kind.name} ({seed_kind}): {name}"
        for kind in KINDS
        for seed_kind in kind.seeds
        for name in sorted(wanted)
        if not hasattr(kinds.recipe(kind, seed_kind), name)
    ]
    assert wanted and not missing, missing
