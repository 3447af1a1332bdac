"""Seed recipes: one module per ``SeedKind``, dispatched from a literal registry.

``schemas/project.schema.json`` lists the same kinds; ``tests/unit/test_registry.py`` fails if they drift.

Each recipe module satisfies ``Recipe``: ``check`` (host-side guards only, no container call — run before
the stack exists, so a broken seed costs nothing) and ``apply`` (runs after the service and what it depends
on are up and healthy, before any dependent service starts). Both raise ``RecipeError`` naming the service;
provisioning wraps it as ``ProvisionError(stage="reset_recipe")``.
"""

from __future__ import annotations

from forgelib.kinds.bare import seed as bare
from forgelib.kinds.base import ApplyContext, Memo, Recipe, SeedTarget
from forgelib.kinds.postgres import seed as sql_dump
from forgelib.kinds.redis import seed as redis_dump
from forgelib.kinds.tree import seed as filesystem_dir
from forgelib.spec.models import SeedKind

REGISTRY: dict[SeedKind, Recipe] = {
    SeedKind.SQL_DUMP: sql_dump,
    SeedKind.FILESYSTEM_DIR: filesystem_dir,
    SeedKind.REDIS_DUMP: redis_dump,
    SeedKind.BARE: bare,
}

__all__ = ["REGISTRY", "ApplyContext", "Memo", "Recipe", "SeedTarget"]
