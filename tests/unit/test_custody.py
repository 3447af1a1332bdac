"""The reaper's decisions (pure, exhaustive) and its Docker I/O through the fake runner."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from forgelib.cli import commands
from forgelib.docker import builds
from forgelib.docker import labels as lab
from forgelib.stacks import reaper as custody
from forgelib.stacks.reaper import FoundProject, HostFacts, Resource, decide, parse_owner, plan_removal
from forgelib.stacks.snapshots import checkpoints as ckstore
from forgelib.stacks.snapshots import store
from forgelib.testing import ANY, FakeRunner

HOST, BOOT = "box", "boot-1"
LIVE = {100: "5000", 200: "7000"}  # pid -> start time of the processes alive on "box"


@pytest.fixture(autouse=True)
def private_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp and state dirs the reaper scans, private to the test: with these fake facts it would
    otherwise judge (and remove) real directories of processes it thinks are gone."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp


def facts(boot: str | None = BOOT) -> HostFacts:
    return HostFacts(HOST, boot, LIVE.get)


def labels(
    *, host: str = HOST, pid: str = "100", boot: str = BOOT, start: str = "5000", project: str = "p1"
) -> dict[str, str]:
    return {
        lab.MANAGED: "true",
        lab.RUN: "run-1",
        lab.TRIAL: "t.0",
        lab.OWNER_HOST: host,
        lab.OWNER_PID: pid,
        lab.OWNER_BOOT_ID: boot,
        lab.OWNER_START_TIME: start,
        lab.COMPOSE_PROJECT: project,
    }


def container(name: str = "c1", running: bool = True, **kw: str) -> Resource:
    return Resource("container", f"id-{name}", name, labels(**kw), running=running)


def network(name: str = "n1", users: tuple[str, ...] | None = ("id-c1",), **kw: str) -> Resource:
    return Resource("network", f"id-{name}", name, labels(**kw), users=users)


def volume(name: str = "v1", users: tuple[str, ...] | None = (), **kw: str) -> Resource:
    return Resource("volume", name, name, labels(**kw), users=users)


def project(*resources: Resource) -> FoundProject:
    return FoundProject("p1", resources)


# ------------------------------------------------------------------------------------ the decision table


@pytest.mark.parametrize(
    ("kw", "running", "remove", "code", "reason_part"),
    [
        ({}, True, False, "owner_alive", "pid 100 on box is alive"),
        ({}, False, False, "owner_alive", "is alive"),  # alive owner, stopped containers: still its own
        ({"pid": "300", "start": "1"}, True, True, "owner_gone", "not running"),
        ({"pid": "300", "start": "1"}, False, True, "owner_gone", "not running"),
        ({"start": "4999"}, True, True, "owner_gone", "pid was reused"),  # pid 100 now another process
        ({"host": "elsewhere"}, True, False, "other_host", "another host"),
        ({"host": "elsewhere", "pid": "300"}, False, False, "other_host", "another host"),
        ({"boot": "boot-0"}, False, True, "owner_rebooted", "previous boot"),
        ({"boot": "boot-0"}, True, False, "unproven", "not removed on a guess"),
        ({"boot": "boot-0", "pid": "300"}, True, False, "unproven", "c1 running"),
    ],
    ids=[
        "alive",
        "alive-stopped",
        "dead-pid-running",
        "dead-pid-stopped",
        "pid-reused",
        "other-host",
        "other-host-dead-pid",
        "other-boot-stopped",
        "other-boot-running",
        "other-boot-running-dead-pid",
    ],
)
def test_decision_table(kw: dict[str, str], running: bool, remove: bool, code: str, reason_part: str) -> None:
    d = decide(project(container(running=running, **kw), network(**kw), volume(**kw)), facts())
    assert (d.remove, d.code) == (remove, code)
    assert reason_part in d.reason


@pytest.mark.parametrize(
    ("mutate", "reason_part"),
    [
        (lambda lb: lb.pop(lab.OWNER_PID), f"missing {lab.OWNER_PID}"),
        (lambda lb: lb.pop(lab.OWNER_HOST), f"missing {lab.OWNER_HOST}"),
        (lambda lb: lb.pop(lab.OWNER_BOOT_ID), f"missing {lab.OWNER_BOOT_ID}"),
        (lambda lb: lb.pop(lab.OWNER_START_TIME), f"missing {lab.OWNER_START_TIME}"),
        (lambda lb: lb.update({lab.OWNER_PID: ""}), f"missing {lab.OWNER_PID}"),
        (lambda lb: lb.update({lab.OWNER_PID: "12x"}), "not a positive integer"),
        (lambda lb: lb.update({lab.OWNER_PID: "0"}), "not a positive integer"),
        (lambda lb: lb.update({lab.OWNER_PID: "-5"}), "not a positive integer"),
        (lambda lb: lb.update({lab.OWNER_START_TIME: "soon"}), "not a clock-tick count"),
        (lambda lb: lb.update({lab.OWNER_START_TIME: "unknown"}), f"unknown {lab.OWNER_START_TIME}"),
        (lambda lb: lb.update({lab.OWNER_BOOT_ID: "unknown"}), f"unknown {lab.OWNER_BOOT_ID}"),
        (lambda lb: lb.update({lab.MANAGED: "yes"}), "is not 'true'"),
    ],
    ids=[
        "no-pid",
        "no-host",
        "no-boot",
        "no-start",
        "empty-pid",
        "pid-text",
        "pid-zero",
        "pid-negative",
        "start-text",
        "start-unknown",
        "boot-unknown",
        "managed-not-true",
    ],
)
@pytest.mark.parametrize("running", [True, False], ids=["running", "stopped"])
def test_missing_or_malformed_labels_are_unproven_and_kept(mutate, reason_part: str, running: bool) -> None:  # type: ignore[no-untyped-def]
    # the owner is dead (pid 300), so only the bad labels keep the project
    bad = container("c2", running=running, pid="300", start="1")
    mutate(bad.labels)  # type: ignore[arg-type]
    d = decide(project(container(running=running, pid="300", start="1"), bad), facts())
    assert (d.remove, d.code) == (False, "unproven")
    assert reason_part in d.reason and "container c2" in d.reason


def test_running_container_of_an_unproven_owner_is_kept() -> None:
    c = Resource("container", "id-x", "x", {lab.MANAGED: "true", lab.COMPOSE_PROJECT: "p1"}, running=True)
    d = decide(project(c), facts())
    assert not d.remove and d.code == "unproven"


def test_resources_disagreeing_on_the_owner_are_unproven() -> None:
    d = decide(project(container(pid="300", start="1"), network(pid="301", start="1")), facts())
    assert (d.remove, d.code) == (False, "unproven") and "2 different owners" in d.reason


def test_unknown_boot_id_of_this_host_proves_nothing() -> None:
    d = decide(project(container(pid="300", start="1", running=False)), facts(boot=None))
    assert (d.remove, d.code) == (False, "unproven")


def test_owner_check_uses_the_labelled_pid() -> None:
    asked: list[int] = []

    def lookup(pid: int) -> str | None:
        asked.append(pid)
        return None

    decide(project(container(pid="4242")), HostFacts(HOST, BOOT, lookup))
    assert asked == [4242]


def test_other_host_is_decided_before_looking_at_local_pids() -> None:
    def lookup(pid: int) -> str | None:
        raise AssertionError("a pid on another host means nothing here")

    d = decide(project(container(host="elsewhere")), HostFacts(HOST, BOOT, lookup))
    assert d.code == "other_host"


def test_a_stack_kept_on_purpose_outlives_its_dead_owner() -> None:
    # `forge provision --keep` exits with the stack up: its owner is gone by design, not by a crash.
    kept = Resource(
        "container", "id-c1", "c1", {**labels(pid="300", start="1"), lab.KEPT: "true"}, running=True
    )
    d = decide(project(kept, network(pid="300", start="1")), facts())
    assert (d.remove, d.code) == (False, "kept")
    assert "forge teardown --name p1" in d.reason


# ------------------------------------------------------------------------------------------ removal plan


def test_plan_removes_containers_then_unused_networks_and_volumes() -> None:
    c1, c2 = container("c1"), container("c2")
    n, v = network(users=("id-c1", "id-c2")), volume(users=("id-c1",))
    plan = plan_removal(project(v, n, c1, c2))
    assert [r.name for r in plan.remove] == ["c1", "c2", "n1", "v1"]
    assert plan.keep == ()


def test_plan_refuses_a_network_with_a_foreign_container() -> None:
    n = network(users=("id-c1", "foreign-container-id-0123456789"))
    plan = plan_removal(project(container("c1"), n, volume()))
    assert [r.name for r in plan.remove] == ["c1", "v1"]
    ((kept, why),) = plan.keep
    assert kept.name == "n1" and "not ours" in why and "foreign-cont" in why


def test_plan_refuses_a_volume_mounted_by_a_foreign_container() -> None:
    plan = plan_removal(project(container("c1"), volume(users=("other",))))
    assert [r.name for r in plan.remove] == ["c1"]
    assert plan.keep[0][0].name == "v1"


def test_plan_keeps_what_it_could_not_check() -> None:
    plan = plan_removal(project(network(users=None)))
    assert plan.remove == () and "could not list" in plan.keep[0][1]


def test_group_projects_by_compose_label_and_alone_without_it() -> None:
    stray = Resource("network", "nid", "loose", {lab.MANAGED: "true"})
    groups = custody.group_projects(
        [container("a", project="p2"), container("b", project="p1"), network(project="p2"), stray]
    )
    assert [(g.name, len(g.resources)) for g in groups] == [("(network loose)", 1), ("p1", 1), ("p2", 2)]


def test_parse_owner_happy_path() -> None:
    assert parse_owner(labels()) == custody.ClaimedOwner(HOST, 100, BOOT, "5000")


# ------------------------------------------------------------------------------------------ /proc reading


def _stat(tmp_path: Path, pid: int, comm: str, state: str, start: str) -> None:
    d = tmp_path / str(pid)
    d.mkdir()
    fields = [state, *["0"] * 18, start, "0", "0"]  # fields 3..24
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")


def test_pid_start_time_reads_field_22(tmp_path: Path) -> None:
    _stat(tmp_path, 7, "python", "S", "123456")
    assert custody.pid_start_time(7, tmp_path) == "123456"


def test_pid_start_time_survives_a_hostile_comm(tmp_path: Path) -> None:
    _stat(tmp_path, 8, "a) b ) c", "R", "99")
    assert custody.pid_start_time(8, tmp_path) == "99"


def test_zombies_and_missing_processes_are_gone(tmp_path: Path) -> None:
    _stat(tmp_path, 9, "dead", "Z", "5")
    assert custody.pid_start_time(9, tmp_path) is None
    assert custody.pid_start_time(10, tmp_path) is None


def test_pid_start_time_of_this_process_matches_labels_module() -> None:
    import os

    from forgelib.docker.labels import process_start_time

    assert custody.pid_start_time(os.getpid()) == process_start_time("self")


def test_local_facts_match_the_labels_this_process_writes() -> None:
    from forgelib.docker.labels import current_owner

    f = custody.local_facts()
    me = current_owner()
    assert (f.hostname, f.boot_id) == (me.host, me.boot_id)
    assert f.pid_start_time(int(me.pid)) == me.start_time


# ---------------------------------------------------------------------------------- Docker I/O (fake)


def _inspect_container(name: str, lb: dict[str, str], running: bool) -> dict[str, object]:
    return {"Id": f"id-{name}", "Name": f"/{name}", "Config": {"Labels": lb}, "State": {"Running": running}}


def scripted(
    containers: list[dict[str, object]],
    networks: list[dict[str, object]] = (),  # type: ignore[assignment]
    volumes: list[dict[str, object]] = (),  # type: ignore[assignment]
    users: dict[str, str] | None = None,
    images: list[dict[str, object]] = (),  # type: ignore[assignment]
    built: list[dict[str, object]] = (),  # type: ignore[assignment]
) -> FakeRunner:
    r = FakeRunner()
    flt = ["--filter", f"label={lab.MANAGED}=true"]
    r.expect(
        "docker",
        "ps",
        "--all",
        "--quiet",
        "--no-trunc",
        *flt,
        stdout="".join(f"{c['Id']}\n" for c in containers),
    )
    r.expect("docker", "container", "inspect", stdout=json.dumps(containers))
    r.expect(
        "docker",
        "network",
        "ls",
        "--quiet",
        "--no-trunc",
        *flt,
        stdout="".join(f"{n['Id']}\n" for n in networks),
    )
    r.expect("docker", "network", "inspect", stdout=json.dumps(list(networks)))
    r.expect("docker", "volume", "ls", "--quiet", *flt, stdout="".join(f"{v['Name']}\n" for v in volumes))
    r.expect("docker", "volume", "inspect", stdout=json.dumps(list(volumes)))
    built_ls = [
        "docker",
        "image",
        "ls",
        "--quiet",
        "--no-trunc",
        "--filter",
        f"reference={builds.REPOSITORY}/*",
    ]
    r.expect(*built_ls, stdout="".join(f"{i['Id']}\n" for i in built))
    if built:
        r.expect("docker", "image", "inspect", *sorted(str(i["Id"]) for i in built), stdout=json.dumps(built))
    r.expect("docker", "image", "ls", stdout="".join(f"{i['Id']}\n" for i in images))
    r.expect("docker", "image", "inspect", stdout=json.dumps(list(images)))
    for flt_value, ids in (users or {}).items():
        r.expect(
            "docker", "ps", "--all", "--quiet", "--no-trunc", "--filter", flt_value, exact=True, stdout=ids
        )
    r.expect("docker", "ps", "--all", "--quiet", "--no-trunc", "--filter", ANY, exact=True, stdout="")
    r.expect("docker", "rm", "--force", "--volumes", ANY, exact=True)
    r.expect("docker", "network", "rm", ANY, exact=True)
    r.expect("docker", "volume", "rm", ANY, exact=True)
    r.expect("docker", "image", "rm", ANY, exact=True)
    return r


def test_reap_removes_a_dead_owners_project_by_id_and_keeps_the_live_one() -> None:
    dead = labels(pid="300", start="1", project="dead")
    live = labels(project="live")
    r = scripted(
        [_inspect_container("d1", dead, True), _inspect_container("l1", live, True)],
        networks=[{"Id": "net-dead", "Name": "dead_default", "Labels": dead}],
        volumes=[{"Name": "dead_data", "Labels": dead}, {"Name": "live_data", "Labels": live}],
        users={"network=net-dead": "id-d1\n", "volume=dead_data": "id-d1\n"},
    )
    report = custody.reap(r, facts=facts())
    by = {o.project: o for o in report.outcomes}
    assert by["dead"].action == "removed" and by["dead"].code == "owner_gone"
    assert by["dead"].removed == ["container d1", "network dead_default", "volume dead_data"]
    assert by["live"].action == "kept" and by["live"].code == "owner_alive"
    removals = [a for a in r.argvs() if a[1] == "rm" or a[2:3] == ("rm",)]
    assert removals == [
        ("docker", "rm", "--force", "--volumes", "id-d1"),
        ("docker", "network", "rm", "net-dead"),
        ("docker", "volume", "rm", "dead_data"),
    ]
    assert all(a[1] != "compose" for a in r.argvs())
    assert all(r.timeout is not None for r in r.calls)


def test_dry_run_removes_nothing() -> None:
    dead = labels(pid="300", start="1", project="dead")
    r = scripted([_inspect_container("d1", dead, False)])
    report = custody.reap(r, facts=facts(), dry_run=True)
    assert report.outcomes[0].action == "would remove"
    assert report.outcomes[0].removed == ["container d1"]
    assert not [a for a in r.argvs() if "rm" in a]
    assert "would remove 1 project(s)" in report.table()


def test_foreign_container_on_our_network_keeps_the_network() -> None:
    dead = labels(pid="300", start="1", project="dead")
    r = scripted(
        [_inspect_container("d1", dead, True)],
        networks=[{"Id": "net-dead", "Name": "dead_default", "Labels": dead}],
        users={"network=net-dead": "id-d1\nsomeone-elses\n"},
    )
    (o,) = custody.reap(r, facts=facts()).outcomes
    assert o.removed == ["container d1"]
    assert o.kept and "network dead_default" in o.kept[0] and "someone-else" in o.kept[0]
    assert ("docker", "network", "rm", "net-dead") not in r.argvs()
    assert ("docker", "rm", "--force", "--volumes", "someone-elses") not in r.argvs()


def test_run_scoping_adds_a_label_filter() -> None:
    r = FakeRunner()
    r.expect("docker", ANY, ANY, ANY, stdout="")
    custody.reap(r, run_id="my-run", facts=facts())
    listings = [a for a in r.argvs() if "--quiet" in a]
    # containers, networks, volumes, untagged goldens, incomplete checkpoints, built images; and every
    # checkpoint manifest (no run label: they tell a complete checkpoint's images, which stay, from others)
    manifests = [a for a in listings if f"label={ckstore.MANIFEST}" in a]
    assert len(listings) == 7 and len(manifests) == 1
    assert f"label={lab.RUN}=my-run" not in manifests[0]
    listings.remove(manifests[0])
    assert all(f"label={lab.RUN}=my-run" in a and f"label={lab.MANAGED}=true" in a for a in listings)


def test_a_failed_removal_is_reported_and_the_rest_continue(monkeypatch: pytest.MonkeyPatch) -> None:
    dead = {"pid": "300", "start": "1", "project": "dead"}
    volumes = (volume("dead_data", **dead), volume("dead_cache", **dead))
    proj = FoundProject("dead", (container("d1", **dead), *volumes))
    monkeypatch.setattr(custody, "discover", lambda runner, run_id=None: [proj])
    r = FakeRunner()
    # who uses the volumes: asked only now that the project is to be removed
    for v in ("dead_data", "dead_cache"):
        r.expect(
            "docker", "ps", "--all", "--quiet", "--no-trunc", "--filter", f"volume={v}", exact=True, stdout=""
        )
    r.expect("docker", "rm", "--force", "--volumes", "id-d1", rc=1, stderr="Error: permission denied\n")
    # still there: a failure, not a race another reaper won
    r.expect("docker", "container", "inspect", "--format", "{{.Id}}", "id-d1", stdout="id-d1\n")
    r.expect("docker", "volume", "rm", "dead_data", rc=1, stderr="Error: No such volume: dead_data\n")
    # the daemon's other wording (a concurrent reaper removed it between inspect and rm)
    gone = "Error response from daemon: get dead_cache: no such volume\n"
    r.expect("docker", "volume", "rm", "dead_cache", rc=1, stderr=gone)
    report = custody.reap(r, facts=facts())
    (o,) = report.outcomes
    assert o.action == "failed" and o.errors == ["container d1: Error: permission denied"]
    assert o.removed == ["volume dead_data", "volume dead_cache"]  # already gone counts as removed
    assert report.failed and "failed 1" in report.table()



def test_a_removal_another_reaper_has_in_progress_is_waited_for_and_counts_as_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dead = {"pid": "300", "start": "1", "project": "dead"}
    proj = FoundProject("dead", (container("d1", **dead), network("dead_default", **dead)))
    monkeypatch.setattr(custody, "discover", lambda runner, run_id=None: [proj])
    monkeypatch.setattr(custody.time, "sleep", lambda s: None)
    r = FakeRunner()
    r.expect("docker", "ps", "--all", "--quiet", "--no-trunc", "--filter", ANY, stdout="")
    busy = "Error response from daemon: removal of container id-d1 is already in progress\n"
    r.expect("docker", "rm", "--force", "--volumes", "id-d1", rc=1, stderr=busy)
    r.expect("docker", "container", "inspect", "--format", "{{.Id}}", "id-d1", stdout="id-d1\n", times=2)
    r.expect("docker", "container", "inspect", rc=1, stderr="Error: No such container: id-d1\n")
    r.expect("docker", "network", "rm", stdout="")
    (o,) = custody.reap(r, facts=facts()).outcomes
    assert o.action == "removed" and o.errors == [] and o.removed == ["container d1", "network dead_default"]
    inspects = [a for a in r.argvs() if list(a[:3]) == ["docker", "container", "inspect"]]
    assert len(inspects) == 3  # until it was gone, and no longer


def test_an_image_another_reaper_removed_first_counts_as_removed_and_one_still_there_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dead = labels(pid="300", start="1")
    images = (Resource("image", "sha256:ck", "checkpoint ck-1", dead),
              Resource("image", "sha256:kept", "checkpoint ck-2", dead))  # fmt: skip
    monkeypatch.setattr(custody, "discover", lambda runner, run_id=None: [FoundProject("(image)", images)])
    r = FakeRunner()
    # the daemon's words when another process removed the image between this one's listing and its rm
    raced = "Error response from daemon: unrecognized image ID sha256:ck\n"
    r.expect("docker", "image", "rm", "sha256:ck", rc=1, stderr=raced)
    r.expect("docker", "image", "inspect", "--format", "{{.Id}}", "sha256:ck", rc=1,
             stderr="Error response from daemon: No such image: sha256:ck\n")  # fmt: skip
    busy = "Error response from daemon: reference does not exist\n"
    r.expect("docker", "image", "rm", "sha256:kept", rc=1, stderr=busy)
    r.expect("docker", "image", "inspect", "--format", "{{.Id}}", "sha256:kept", stdout="sha256:kept\n")
    (o,) = custody.reap(r, facts=facts()).outcomes
    assert o.removed == ["image checkpoint ck-1"]
    assert o.action == "failed" and o.errors == ["image checkpoint ck-2: " + busy.strip()]


def test_container_removed_between_listing_and_inspect_is_skipped() -> None:
    r = FakeRunner()
    r.expect("docker", "ps", stdout="gone\n", times=1)
    r.expect("docker", "container", "inspect", rc=1, stdout="[]\n", stderr="Error: No such object: gone\n")
    r.expect("docker", ANY, ANY, ANY, stdout="")
    assert custody.reap(r, facts=facts()).outcomes == []


def test_network_removed_between_listing_and_inspect_is_skipped() -> None:
    # Docker words it differently for networks; a concurrent run's teardown makes this common.
    live = {"Id": "n2", "Name": "p1_default", "Labels": labels(pid="100", start="5000")}
    r = FakeRunner()
    r.expect(
        "docker", "ps", "--all", "--quiet", "--no-trunc", "--filter", f"label={lab.MANAGED}=true", stdout=""
    )
    r.expect("docker", "network", "ls", stdout="n1\nn2\n")
    r.expect(
        "docker", "network", "inspect", "n1", "n2",
        rc=1, stdout=json.dumps([live]), stderr="Error response from daemon: network n1 not found\n",
    )  # fmt: skip
    r.expect("docker", "volume", "ls", stdout="")
    r.expect("docker", "image", "ls", stdout="")
    (o,) = custody.reap(r, facts=facts()).outcomes
    assert (o.project, o.action, o.code) == ("p1", "kept", "owner_alive")
    # a kept project costs no lookup of who uses its networks (forge run reaps at every start)
    assert not [c for c in r.calls if "network=n2" in " ".join(c.argv)]


def test_inspect_failure_other_than_gone_is_an_error() -> None:
    from forgelib.errors import CommandError

    r = FakeRunner()
    r.expect("docker", "ps", stdout="x\n", times=1)
    r.expect(
        "docker", "container", "inspect", rc=1, stdout="", stderr="Cannot connect to the Docker daemon\n"
    )
    with pytest.raises(CommandError, match="Cannot connect"):
        custody.reap(r, facts=facts())


def test_json_and_table_shapes() -> None:
    dead = labels(pid="300", start="1", project="dead")
    r = scripted([_inspect_container("d1", dead, True), _inspect_container("l1", labels(project="lv"), True)])
    report = custody.reap(r, facts=facts())
    data = json.loads(json.dumps(report.to_json()))
    assert data["removed"] == 1 and data["kept"] == 1 and data["failed"] == 0 and not data["dry_run"]
    assert {p["project"]: p["action"] for p in data["projects"]} == {"dead": "removed", "lv": "kept"}
    assert {"project", "run", "trial", "action", "code", "reason", "removed", "kept", "errors"} <= set(
        data["projects"][0]
    )
    table = report.table().splitlines()
    assert table[0].split() == ["PROJECT", "RUN", "TRIAL", "ACTION", "REASON"]
    assert any(line.startswith("dead") and "removed" in line and "not running" in line for line in table)
    assert table[-1].startswith("removed 1 project(s) (1 resources); kept 1; failed 0")


def test_empty_report_says_so() -> None:
    assert "no forgelib-labelled" in custody.ReapReport(dry_run=False).table()


def test_main_reap_json_and_exit_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    r = scripted([_inspect_container("d1", labels(pid="300", start="1"), False)])
    monkeypatch.setattr(commands, "SubprocessRunner", lambda: r)
    monkeypatch.setattr(custody, "local_facts", facts)
    assert commands.main_reap(dry_run=True, run_id=None, as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["projects"][0]["action"] == "would remove"


# ------------------------------------------------------------------------------------------------ goldens


def _golden_image(image_id: str, **kw: str) -> dict[str, object]:
    lb = {k: v for k, v in labels(**kw).items() if k != lab.COMPOSE_PROJECT}
    lb.update({store.GOLDEN: "1", store.KEY: "ab" * 32})
    return {"Id": image_id, "Config": {"Labels": lb}}


def test_an_untagged_golden_of_a_dead_owner_is_removed_after_the_stacks_and_a_live_ones_kept() -> None:
    dead = _golden_image("sha256:dead", pid="300", start="1")
    live = _golden_image("sha256:live", pid="100", start="5000")
    stack = _inspect_container("s1", labels(pid="300", start="1", project="p9"), running=True)
    r = scripted([stack], images=[dead, live])
    report = custody.reap(r, facts=facts())
    by_name = {o.project: o for o in report.outcomes}
    gone = by_name[f"(image golden {'ab' * 6} (dead))"]
    assert by_name[f"(image golden {'ab' * 6} (live))"].code == "owner_alive"
    assert report.outcomes[0].project == "p9"  # stacks first: they may use the image
    removed = [list(a) for a in r.argvs() if list(a[:3]) == ["docker", "image", "rm"]]
    assert removed == [["docker", "image", "rm", "sha256:dead"]]
    assert gone.action == "removed" and gone.code == "owner_gone"
    # only untagged goldens are ever listed: a complete (tagged) golden is never the reaper's
    (ls,) = [list(a) for a in r.argvs() if list(a[:3]) == ["docker", "image", "ls"] and "dangling=true" in a]
    assert "dangling=true" in ls and f"label={store.GOLDEN}" in ls


def test_a_capture_build_dir_of_a_dead_owner_is_removed_and_a_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    base = store.state_dir()
    dead, live = base / "build-300-1-aaaaaa", base / "build-100-5000-bbbbbb"
    for d in (dead, live):
        (d).mkdir(parents=True)
        (d / "data.tar").write_bytes(b"half")
    r = scripted([])
    report = custody.reap(r, facts=facts(), dry_run=True)
    assert dead.exists()  # dry run
    assert [o.action for o in report.outcomes] == ["would remove"]
    report = custody.reap(scripted([]), facts=facts())
    assert not dead.exists() and live.exists()
    assert [o.project for o in report.outcomes] == [f"(golden build {dead.name})"]



def test_reap_of_one_run_removes_that_runs_dead_checkpoint_build_dir_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    base = store.state_dir()
    mine, other = base / "build-300-1-aaaaaa", base / "build-301-1-bbbbbb"
    golden = base / "build-302-1-cccccc"
    live = base / "build-100-5000-dddddd"  # this run's too, but its owner runs: a capture in flight
    for d, run in ((mine, "r1"), (other, "r2"), (golden, None), (live, "r1")):
        d.mkdir(parents=True)
        (d / "data.tar").write_bytes(b"half")
        if run:
            (d / store.BUILD_RUN).write_text(run)
    report = custody.reap(scripted([]), run_id="r1", facts=facts())
    assert not mine.exists() and other.exists() and golden.exists() and live.exists()
    assert [(o.project, o.run) for o in report.outcomes] == [(f"(checkpoint build {mine.name})", "r1")]

def test_an_untagged_golden_still_in_use_is_kept_not_failed() -> None:
    dead = _golden_image("sha256:used", pid="300", start="1")
    r = scripted([], images=[dead])
    r.expect(
        "docker", "image", "rm", "sha256:used", exact=True, rc=1,
        stderr="Error response from daemon: conflict: unable to delete - image is being used",
    )  # fmt: skip
    r.expectations.insert(0, r.expectations.pop())  # before scripted()'s catch-all removal answer
    (o,) = custody.reap(r, facts=facts()).outcomes
    assert o.action == "kept" and "in use" in o.kept[0] and not o.errors


# ------------------------------------------------------------------------------- images built for a run


def _built_image(image_id: str, tag: str, **kw: str) -> dict[str, object]:
    """A `build:` service's image: the run's labels and compose's project label (builds.py)."""
    return {"Id": image_id, "RepoTags": [tag], "Config": {"Labels": labels(**kw)}}


def test_a_dead_owners_built_image_goes_with_its_project_after_every_stack_and_a_live_ones_stays() -> None:
    dead = _built_image(
        "sha256:b-dead", f"{builds.REPOSITORY}/p-app:run-1-1234", pid="300", start="1", project="p0"
    )
    live = _built_image("sha256:b-live", f"{builds.REPOSITORY}/q-app:run-2-1234", project="q0")
    golden_shaped = dict(_built_image("sha256:g", f"{builds.REPOSITORY}/x:y", pid="300", start="1"))
    golden_shaped["Config"] = {"Labels": {**labels(pid="300", start="1"), store.GOLDEN: "1"}}
    stacks = [
        _inspect_container("t0", labels(pid="300", start="1", project="p0"), True),
        _inspect_container("t1", labels(pid="300", start="1", project="p1"), True),  # uses p0's image
    ]
    r = scripted(stacks, built=[dead, live, golden_shaped])
    report = custody.reap(r, facts=facts())
    by = {o.project: o for o in report.outcomes}
    assert by["p0"].action == "removed" and by["p0"].removed == [
        "container t0",
        f"image built {dead['RepoTags'][0]}",
    ]
    assert by["q0"].code == "owner_alive"
    assert [o.project for o in report.outcomes][-2:] == ["p0", "q0"]  # projects holding images last
    removals = [a for a in r.argvs() if a[1] == "rm" or a[2:3] == ("rm",)]
    assert removals == [
        ("docker", "rm", "--force", "--volumes", "id-t1"),
        ("docker", "rm", "--force", "--volumes", "id-t0"),
        ("docker", "image", "rm", "sha256:b-dead"),
    ]  # never the live owner's, never a golden


# ---------------------------------------------------------------------------- `forge provision` dirs


def test_owned_temp_dir_names_its_owner(private_dirs: Path) -> None:
    d = lab.owned_temp_dir(custody.PROVISION_DIR)
    me = custody.current_owner()
    assert d.parent == private_dirs and lab.dir_owner(d, custody.PROVISION_DIR) == (
        int(me.pid),
        me.start_time,
    )
    assert lab.dir_owner(private_dirs / "forge-provision-abc123", custody.PROVISION_DIR) is None  # old style


def test_provision_dirs_go_with_their_stack_or_their_dead_owner(private_dirs: Path) -> None:
    def mk(name: str) -> Path:
        (private_dirs / name).mkdir()
        (private_dirs / name / "compose.forge.yaml").write_text("services: {}\n")
        return private_dirs / name

    of_removed = mk("forge-provision-300-1-aaaa")  # its stack's owner is gone: both go
    of_kept = mk("forge-provision-301-1-bbbb")  # `--keep`: stays while the stack does
    orphan = mk("forge-provision-302-1-cccc")  # killed before any container existed: goes
    of_live = mk("forge-provision-100-5000-dddd")  # its owner runs: stays
    unknown = mk("forge-provision-x1y2z3")  # not a name we write: never judged
    pytest_orphan = mk("forge-pytest-303-1-eeee")  # a killed pytest process's (the plugin's): goes
    pytest_live = mk("forge-pytest-100-5000-ffff")  # a running one's: stays
    removed = {**labels(pid="300", start="1", project="gone"), lab.WORK_DIR: str(of_removed)}
    kept = {**labels(pid="301", start="1", project="kept"), lab.KEPT: "true", lab.WORK_DIR: str(of_kept)}
    r = scripted([_inspect_container("g1", removed, True), _inspect_container("k1", kept, True)])
    report = custody.reap(r, facts=facts(), dry_run=True)
    assert of_removed.exists() and orphan.exists()
    assert {o.project: o.action for o in report.outcomes} == {
        "gone": "would remove", "kept": "kept", f"(provision dir {orphan.name})": "would remove",
        f"(pytest dir {pytest_orphan.name})": "would remove",
    }  # fmt: skip
    report = custody.reap(
        scripted([_inspect_container("g1", removed, True), _inspect_container("k1", kept, True)]),
        facts=facts(),
    )
    by = {o.project: o for o in report.outcomes}
    assert by["gone"].removed == ["container g1", f"directory {of_removed}"]
    assert sorted(p.name for p in private_dirs.iterdir()) == sorted(
        d.name for d in (of_kept, of_live, unknown, pytest_live)
    )


def test_a_work_dir_label_naming_anything_else_is_never_removed(tmp_path: Path) -> None:
    for odd in (tmp_path / "results", tmp_path / "forge-provision-not-ours", Path("forge-provision-1-2-3")):
        (tmp_path / odd).mkdir(exist_ok=True)
        assert not custody.remove_work_dir(str(odd))
    assert (tmp_path / "results").exists()
