"""The seed kinds cannot drift: the schema's list, ``SeedKind``, the recipe registry, and the reset options
the spec checks accept must all agree."""

from __future__ import annotations

from forgelib.seeds import REGISTRY
from forgelib.spec.models import SeedKind
from forgelib.spec.rules import RESET_OPTIONS, SHORTHAND_KINDS
from forgelib.spec.schema import schema


def test_schema_seed_kinds_equal_seed_kind_enum() -> None:
    assert set(schema("project")["$defs"]["seed_kind"]["enum"]) == {k.value for k in SeedKind}


def test_registry_has_a_recipe_for_exactly_every_kind() -> None:
    assert set(REGISTRY) == set(SeedKind)


def test_reset_options_match_what_each_recipe_understands() -> None:
    assert set(RESET_OPTIONS) == set(SeedKind)
    for kind, recipe in REGISTRY.items():
        assert RESET_OPTIONS[kind] == recipe.OPTIONS, kind
    reset_keys = set(schema("project")["$defs"]["reset"]["properties"])
    assert reset_keys == {"seed"}.union(*RESET_OPTIONS.values())


def test_shorthand_kinds_are_seed_kinds() -> None:
    assert set(SHORTHAND_KINDS.values()) <= set(SeedKind)
