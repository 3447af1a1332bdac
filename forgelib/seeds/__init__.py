"""Seed recipes: one module per ``SeedKind``, dispatched from a literal registry.

``schemas/project.schema.json`` lists the same kinds; ``tests/unit/test_registry.py`` fails if they drift.
"""
