"""bare: a file (or directory) handed to any service verbatim, read-only; forge keeps no state of it."""

from __future__ import annotations

from forgelib.kinds.kind import Kind

SEED = "bare"

KIND = Kind(
    name="bare",
    package=__name__,
    seeds={SEED: "seed"},
    unsupported={
        "fingerprint": "a bare seed is a read-only host mount: no state in a container to fingerprint",
        "golden": "applying a bare seed is already the copy a golden would restore",
        "reset": "nothing in a container to restore: the mount is read-only",
        "checkpoint": "nothing of the service's to capture: the seed is a read-only host mount",
    },
)
