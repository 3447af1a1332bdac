"""The cache pack made checkpointable, in a directory of the caller's: as shipped but for its workspace
and the orders cache's TTL. The pack's workspace (``runner``) is ephemeral (no seed), so a fork would start
it empty: here it is reset from a one-file tree seed at ``/work/notes``, so that a checkpoint holds its
files. The TTL is a day (the pack's 300 s could lapse between a capture and a fork's reading).

Used by ``checkpoint_bench.py`` and tests/integration/test_checkpoints.py (which import it as
``benchmarks.checkpoint_pack``, as tests/integration/test_agent_load.py imports ``benchmarks.agent_pack``):
one builder, so that the benchmark measures the stack the test proves.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from forgelib.spec.digest import seed_digest
from forgelib.spec.loader import load_project_config
from forgelib.spec.models import Project

PACK = Path(__file__).resolve().parents[1] / "examples" / "multi_service_cache_debug"


def checkpointable_cache_pack(root: Path, name: str) -> Project:
    """Copy the cache pack to ``root`` (which must not exist) as project ``name``, and load it."""
    shutil.copytree(PACK, root)
    notes = root / "assets/notes"
    notes.mkdir()
    (notes / "README.md").write_text("the agent's notes\n")
    doc = yaml.safe_load((root / "project.yaml").read_text())
    doc["name"] = name
    digest = seed_digest(notes, "filesystem_dir")
    doc["assets"]["seeds"]["notes"] = {"path": "assets/notes", "kind": "filesystem_dir", "digest": digest}
    services = doc["default_environment"]["services"]
    services["runner"] = {"isolation": "reset", "reset": {"seed": "notes", "target": "/work/notes"}}
    (root / "project.yaml").write_text(yaml.safe_dump(doc))
    compose_file = root / "shared/environment.compose.yaml"
    compose = yaml.safe_load(compose_file.read_text())
    compose["services"]["orders-api"]["environment"]["CACHE_TTL_SECONDS"] = "86400"
    compose_file.write_text(yaml.safe_dump(compose))
    return load_project_config(root)
