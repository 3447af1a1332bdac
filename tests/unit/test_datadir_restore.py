"""The data-directory restore script (forgelib/kinds/datadir.py's ``RESTORE_SCRIPT`` with ``SYNC_SCRIPT``)
run for real with ``sh`` on a scratch tree: after a trial-like change of every sort (blocks rewritten in a
big file, files grown, shrunk, removed and added, a directory added, a mode changed), the data directory is
its pristine copy again, byte for byte, with the copy's names, types, sizes, modes and modification times,
reset after reset."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from forgelib.kinds import datadir

BIG = 3 * 65536 + 1234  # blocks and a tail, as a redo log is blocks


def _tree(root: Path) -> dict[str, tuple[object, ...]]:
    """Everything a listing and a reader of ``root`` can tell apart, per relative path."""
    out: dict[str, tuple[object, ...]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            out[rel] = ("dir", st.st_mode, st.st_uid, st.st_gid)
        else:
            out[rel] = ("file", st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, path.read_bytes())
    return out


def _seed(d: Path) -> None:
    d.mkdir()
    (d / "ibdata1").write_bytes(b"marker")
    (d / "ib_logfile0").write_bytes(os.urandom(BIG))
    (d / "small").write_bytes(b"abc")
    (d / "shrinks").write_bytes(b"x" * 70000)
    (d / "goes").write_bytes(b"gone soon")
    (d / "shop").mkdir()
    (d / "shop" / "orders.ibd").write_bytes(os.urandom(65536 * 2))
    (d / "shop" / "orders.frm").write_bytes(b"frm")
    os.chmod(d / "shop", 0o700)
    os.chmod(d / "small", 0o660)


def _trial(d: Path) -> None:
    """A trial's changes of each sort: blocks rewritten mid-file and in the tail, a file grown, one
    shrunk, one removed, one added, a database (directory) added, a mode changed."""
    with (d / "ib_logfile0").open("r+b") as f:
        f.seek(70000)
        f.write(b"trial" * 100)
        f.seek(BIG - 10)
        f.write(b"end")
    with (d / "small").open("ab") as f:
        f.write(b"grown" * 20000)
    with (d / "shrinks").open("r+b") as f:
        f.truncate(100)
    (d / "goes").unlink()
    (d / "new").write_bytes(b"new")
    (d / "loot").mkdir()
    (d / "loot" / "t.frm").write_bytes(b"t")
    with (d / "shop" / "orders.ibd").open("r+b") as f:
        f.seek(65536 + 5)
        f.write(b"stolen")
    os.chmod(d / "shop" / "orders.frm", 0o666)


def test_a_restore_puts_back_the_pristine_copy_exactly(tmp_path: Path) -> None:
    if not shutil.which("find"):
        pytest.skip("needs GNU find, as the service's image has it")
    d, p = tmp_path / "data", tmp_path / "pristine"
    _seed(d)

    def restore() -> None:
        argv = ["sh", "-c", datadir.RESTORE_SCRIPT, "forge-restore", str(d), "ibdata1", datadir.SYNC_SCRIPT]
        proc = subprocess.run([*argv, str(p)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr

    restore()  # the first time: keeps the copy
    pristine = _tree(d)
    assert _tree(p / "data") == pristine
    for _ in range(2):  # a second reset starts from the first one's stamp
        time.sleep(0.05)  # past the stamp's clock tick, as a server's restart is
        _trial(d)
        assert _tree(d) != pristine
        restore()
        assert _tree(d) == pristine
