"""Seed digests: what changes them, what does not, and that the documented algorithm is what the code does."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from forgelib.spec import digest
from forgelib.spec.digest import DigestError, seed_digest
from forgelib.spec.models import SeedKind

DIR = SeedKind.FILESYSTEM_DIR


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "seed"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "a.txt").write_bytes(b"alpha\n")
    (root / "sub" / "b.bin").write_bytes(bytes(range(256)))
    (root / "sub" / "deeper" / "run.sh").write_text("#!/bin/sh\n")
    (root / "sub" / "deeper" / "run.sh").chmod(0o755)
    (root / "link").symlink_to("a.txt")
    return root


def test_file_digest_is_sha256_of_bytes(tmp_path: Path) -> None:
    f = tmp_path / "dump.sql"
    data = os.urandom(3 * (1 << 20) + 17)  # spans several chunks, ends mid-chunk
    f.write_bytes(data)
    assert seed_digest(f, SeedKind.SQL_DUMP) == "sha256:" + hashlib.sha256(data).hexdigest()
    assert seed_digest(f, SeedKind.BARE) == seed_digest(f, SeedKind.REDIS_DUMP)


def test_dir_digest_is_stable_and_independent_of_location(tree: Path, tmp_path: Path) -> None:
    first = seed_digest(tree, DIR)
    assert first == seed_digest(tree, DIR)
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(tree, copy, symlinks=True)
    assert seed_digest(copy, DIR) == first


def _content(t: Path) -> None:
    (t / "a.txt").write_bytes(b"alphA\n")


def _rename(t: Path) -> None:
    (t / "a.txt").rename(t / "a2.txt")
    (t / "link").unlink()
    (t / "link").symlink_to("a.txt")  # keep the link's target text identical


def _exec_bit(t: Path) -> None:
    (t / "a.txt").chmod(0o744)


def _exec_bit_off(t: Path) -> None:
    (t / "sub" / "deeper" / "run.sh").chmod(0o644)


def _symlink_target(t: Path) -> None:
    (t / "link").unlink()
    (t / "link").symlink_to("sub/b.bin")


def _symlink_to_file(t: Path) -> None:
    (t / "link").unlink()
    (t / "link").write_bytes(b"a.txt")


def _add_empty_dir(t: Path) -> None:
    (t / "sub" / "another").mkdir()


def _remove_empty_dir(t: Path) -> None:
    (t / "empty").rmdir()


def _rename_empty_dir(t: Path) -> None:
    (t / "empty").rename(t / "vacant")


def _move_between_dirs(t: Path) -> None:
    (t / "sub" / "b.bin").rename(t / "sub" / "deeper" / "b.bin")


@pytest.mark.parametrize(
    "change",
    [
        _content,
        _rename,
        _exec_bit,
        _exec_bit_off,
        _symlink_target,
        _symlink_to_file,
        _add_empty_dir,
        _remove_empty_dir,
        _rename_empty_dir,
        _move_between_dirs,
    ],
)
def test_dir_digest_changes_with(tree: Path, change: object) -> None:
    before = seed_digest(tree, DIR)
    change(tree)  # type: ignore[operator]
    assert seed_digest(tree, DIR) != before


def test_dir_digest_ignores_mtimes_and_other_mode_bits(tree: Path) -> None:
    before = seed_digest(tree, DIR)
    for p in [tree, *tree.rglob("*")]:
        os.utime(p, (1_000_000, 1_000_000), follow_symlinks=False)
    (tree / "a.txt").chmod(0o600)  # group/other bits are not part of it
    assert seed_digest(tree, DIR) == before


def test_special_files_are_refused(tree: Path) -> None:
    os.mkfifo(tree / "pipe")
    with pytest.raises(DigestError, match="FIFO"):
        seed_digest(tree, DIR)


def test_unreadable_seed_is_a_digest_error(tmp_path: Path) -> None:
    with pytest.raises(DigestError, match="cannot digest"):
        seed_digest(tmp_path / "missing.sql", SeedKind.SQL_DUMP)


def test_documented_shell_recipe_reproduces_the_digest(tree: Path) -> None:
    """The docstring (copied into docs/seeds.md) must describe what the code does."""
    doc = digest.__doc__ or ""
    recipe = doc.split("Reproduce in a shell (no newlines in names assumed)::")[1].split("\n\n")[1]
    script = "\n".join(line[4:] for line in recipe.splitlines())
    out = subprocess.run(
        ["bash", "-c", script.replace("cd SEED", 'cd "$1"'), "bash", str(tree)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "sha256:" + out.split()[0] == seed_digest(tree, DIR)
