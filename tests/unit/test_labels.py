from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from forgelib.docker import labels as lab
from forgelib.testing import FakeRunner


def test_current_owner_names_this_process() -> None:
    me = lab.current_owner()
    assert me.pid == str(os.getpid())
    assert me.host == socket.gethostname()
    assert me.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert me.start_time == Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]


def test_start_time_survives_a_comm_with_spaces_and_parens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fields = " ".join(str(n) for n in range(3, 53))  # fields 3.. -> field 22 holds "22"
    stat = tmp_path / "stat"
    stat.write_text(f"123 (a) b (c) {fields}\n")
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: real(stat if self.name == "stat" else self))
    assert lab.process_start_time(123) == "22"


def test_unreadable_proc_is_unknown() -> None:
    assert lab.process_start_time(2**31) == lab.UNKNOWN


def test_run_labels() -> None:
    owner = lab.Owner("h", "1", "b", "99")
    assert lab.run_labels("r1", "read_widget.2", owner) == {
        "io.forgelib.managed": "true",
        "io.forgelib.run": "r1",
        "io.forgelib.trial": "read_widget.2",
        "io.forgelib.owner.host": "h",
        "io.forgelib.owner.pid": "1",
        "io.forgelib.owner.boot_id": "b",
        "io.forgelib.owner.start_time": "99",
    }
    assert lab.TRIAL not in lab.run_labels("r1", owner=owner)
    assert lab.Owner.from_labels(owner.labels()) == owner
    assert lab.Owner.from_labels({}) == lab.Owner(*[lab.UNKNOWN] * 4)


def test_resources_with_labels_queries_all_three_kinds_with_anded_filters() -> None:
    fake = FakeRunner()
    f = ["--filter", "label=io.forgelib.run=r1", "--filter", "label=io.forgelib.trial=t.0"]
    fake.expect("docker", "ps", "--all", *f, "--format", "{{.Names}}", exact=True, stdout="b-1\na-1\n")
    fake.expect("docker", "network", "ls", *f, "--format", "{{.Name}}", exact=True, stdout="p_default\n")
    fake.expect("docker", "volume", "ls", *f, "--format", "{{.Name}}", exact=True, stdout="")
    found = lab.resources_with_labels(fake, {lab.TRIAL: "t.0", lab.RUN: "r1"})
    assert found == {"containers": ["a-1", "b-1"], "networks": ["p_default"], "volumes": []}
    assert not lab.is_empty(found)
    assert lab.is_empty({"containers": [], "networks": [], "volumes": []})


def test_resources_with_labels_refuses_an_empty_filter() -> None:
    with pytest.raises(ValueError, match="without a label filter"):
        lab.resources_with_labels(FakeRunner(), {})
