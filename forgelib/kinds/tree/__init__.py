"""tree: a directory tree in any service (the workspace), seeded from a ``filesystem_dir``; observed by
the generic ``file`` check and file tools, so it owns no check type or tool of its own."""

from __future__ import annotations

from forgelib.kinds.kind import Kind

SEED = "filesystem_dir"

KIND = Kind(
    name="tree",
    package=__name__,
    seeds={SEED: "seed"},
    directory_seeds=(SEED,),
    unsupported={"golden": "applying a tree is already the copy a golden would restore (a host copy)"},
)
