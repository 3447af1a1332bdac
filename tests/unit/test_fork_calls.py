"""What a fork of N spares of its docker calls, without an engine: the compose config resolved once for the
forks of one call asking at once, and renamed for each (``compose.renamed``, ``ConfigMemo``), and a
container's main process found from the host's cgroup listing instead of ``docker inspect``
(``listening.main_pid``).
(That forks come up right with them: tests/integration/test_checkpoints.py on the engine.)"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from forgelib.docker import configmemo, listening
from forgelib.docker.compose import ComposeProject, renamed
from forgelib.docker.configmemo import ConfigMemo
from forgelib.spec.models import Timeouts
from forgelib.testing import FakeRunner

T = Timeouts(compose_up=100, recipe=40, teardown=50, command=9)
HOLDER = "forgeconfig0123456789abcdef"


def _config(name: str) -> dict[str, object]:
    """What ``docker compose config`` prints for project ``name`` (the name as compose puts it)."""
    return {
        "name": name,
        "networks": {"default": {"name": f"{name}_default"}},
        "volumes": {f"{name}-data": {"name": f"{name}_data"}},
        "services": {
            "api": {
                "environment": {"STACK": name, "PORT": "8000"},
                "command": ["serve", f"--as={name}"],
                "ports": [{"target": 8000, "published": ""}],
                "healthcheck": {"retries": 3, "disable": False},
            }
        },
    }


def test_a_config_renamed_is_what_compose_prints_for_the_other_name() -> None:
    assert renamed(_config(HOLDER), HOLDER, "shop-fork-1") == _config("shop-fork-1")
    # numbers, booleans and null are left as they are
    assert renamed({"a": [1, True, None, 2.5]}, HOLDER, "x") == {"a": [1, True, None, 2.5]}


def test_the_forks_of_one_call_resolve_their_compose_config_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(configmemo, "unique_name", lambda: HOLDER)
    fake = FakeRunner()
    fake.expect(
        "docker", "compose", "--ansi", "never", "--project-name", HOLDER, stdout=json.dumps(_config(HOLDER))
    )
    (tmp_path / "p").mkdir()
    (tmp_path / "q").mkdir()
    files = (tmp_path / "p" / "compose.yaml",)
    files[0].write_text("services:\n  api: {image: x}\n")
    configs = ConfigMemo()
    names = [f"shop-fork-{i}" for i in range(3)]
    with ThreadPoolExecutor(3) as pool:  # the forks come up at once: one asks, the others wait for it
        got = list(pool.map(lambda n: configs.config(ComposeProject(n, files, fake, T)), names))
    assert got == [_config(n) for n in names]
    assert [c.argv[-3:] for c in fake.calls] == [("config", "--format", "json")]
    # another project's files (or images, or profiles) are resolved on their own
    other = tmp_path / "q" / "compose.yaml"
    other.write_text("services:\n  api: {image: y}\n")
    configs.config(ComposeProject("other", (other,), fake, T, profiles=("x",)))
    assert len(fake.calls) == 2 and str(other) in fake.calls[1].argv
    assert fake.calls[0].argv[fake.calls[0].argv.index("--project-name") + 1] == HOLDER


CID = "c0ffee" * 10 + "abcd"


def _host(root: Path, procs: dict[int, str], *, where: str = f"pids/docker/{CID}") -> tuple[Path, Path]:
    """A host's /proc (each pid's NSpid line) and its cgroup tree listing ``procs`` under ``where``."""
    proc, cgroup = root / "proc", root / "cgroup"
    for pid, nspid in procs.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "status").write_text(f"Name:\tx\nPid:\t{pid}\nNSpid:\t{nspid}\nPPid:\t1\n")
    (cgroup / where).mkdir(parents=True)
    (cgroup / where / "cgroup.procs").write_text("".join(f"{p}\n" for p in [*procs, 99999]))
    return proc, cgroup


@pytest.fixture
def local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)


@pytest.mark.usefixtures("local")
@pytest.mark.parametrize("where", [f"pids/docker/{CID}", f"docker/{CID}", f"system.slice/docker-{CID}.scope"])
def test_a_containers_main_process_is_its_pid_1_in_the_cgroup_listing(tmp_path: Path, where: str) -> None:
    # an exec's process listed first, the main process, one gone meanwhile (99999: no /proc entry)
    proc, cgroup = _host(tmp_path, {7001: "7001\t57", 4242: "4242\t1"}, where=where)
    assert listening.main_pid(CID, proc=proc, cgroup=cgroup) == 4242


@pytest.mark.usefixtures("local")
def test_a_main_process_not_found_leaves_it_to_dockers_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, cgroup = _host(tmp_path, {4242: "4242"})  # `pid: host`: no process of it is pid 1 in its own
    assert listening.main_pid(CID, proc=proc, cgroup=cgroup) == 0
    assert listening.main_pid("another" * 9, proc=proc, cgroup=cgroup) == 0  # a layout not known
    proc, cgroup = _host(tmp_path / "remote", {4242: "4242\t1"})
    assert listening.main_pid(CID, proc=proc, cgroup=cgroup) == 4242
    monkeypatch.setenv("DOCKER_HOST", "tcp://engine.example:2376")  # a remote engine's pids are not ours
    assert listening.main_pid(CID, proc=proc, cgroup=cgroup) == 0
