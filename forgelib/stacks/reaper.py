"""The reaper: remove forgelib's compose leftovers whose owning process is provably gone, keep the rest.

Every container, network and volume a trial creates carries ownership labels (docs/internals.md, Labels).
The reaper groups what it finds by compose project and decides per project:

* **remove** when the owner is provably gone: same host and same boot id, and the owning pid is not running
  (or is a zombie) or runs with a different start time (the pid was reused);
* **remove** when the owner is on this host but a *previous boot* — every process of that boot died with it —
  unless a container of the project is running: a running container cannot belong to a previous boot of a
  local engine without a restart policy, and a hostname is not unique (two machines called ``runner`` sharing
  one remote engine), so a running container there is kept as unproven rather than removed on a guess;
* **keep** when the owner is alive, on another host, or unproven (labels missing, malformed or disagreeing).

Removal is by id, resource by resource (``docker rm -f -v``, ``network rm``, ``volume rm``), not
``docker compose -p NAME down``: compose acts on everything carrying the project's compose label, including
containers without our labels, while removal by id touches only what was inspected and decided on. A network
or volume still used by a container that is not one of the project's labelled containers is kept, with a
reason (Docker would refuse, or that container would break).

The first half of this module is pure (decisions on plain data, unit-tested exhaustively); the second half
does the Docker I/O through the runner seam.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from forgelib.docker import argv as dk
from forgelib.docker import builds
from forgelib.docker.labels import (
    COMPOSE_PROJECT,
    KEPT,
    MANAGED,
    OWNER_BOOT_ID,
    OWNER_HOST,
    OWNER_PID,
    OWNER_START_TIME,
    RUN,
    TRIAL,
    UNKNOWN,
    WORK_DIR,
    current_owner,
    dir_owner,
    filters,
    pid_start_time,
    stale_owned_dirs,
)
from forgelib.errors import CommandError
from forgelib.runner import Runner
from forgelib.stacks.snapshots import checkpoints, store
from forgelib.table import align

OWNER_LABELS = (OWNER_HOST, OWNER_PID, OWNER_BOOT_ID, OWNER_START_TIME)
# `forge provision`'s own directory (override, logs): an ``owned_temp_dir`` named on its stack's labels.
PROVISION_DIR = "forge-provision-"
# The pytest plugin's: one per pytest process (its trials' overrides and logs; forgelib.pytest_plugin.stacks).
PYTEST_DIR = "forge-pytest-"
# A cluster slot's (forgelib.cluster.slot): the shipped project and its trials' files, on its node.
NODE_DIR = "forge-node-"
# inspect_ai's `forge` sandbox (forgelib.inspect): one per task of an `inspect eval` process.
INSPECT_DIR = "forge-inspect-"
# harbor's `forge` environment (forgelib.harbor): one per forge spec and mode of a `harbor run` process.
HARBOR_DIR = "forge-harbor-"
# Every kind of ``owned_temp_dir`` the reaper removes once its owner is provably gone: (kind, who made it).
OWNED_DIRS = {
    PROVISION_DIR: ("provision", "a `forge provision`"),
    PYTEST_DIR: ("pytest", "a pytest process (forgelib's plugin)"),
    NODE_DIR: ("cluster slot", "a `forge run --cluster` slot on this node"),
    INSPECT_DIR: ("inspect", "an `inspect eval` (forge's sandbox)"),
    HARBOR_DIR: ("harbor", "a `harbor run` (forge's environment)"),
}
DISCOVER_TIMEOUT = 30.0
REMOVE_TIMEOUT = 120.0  # rm -f of a running container is a SIGKILL; networks/volumes are instant

Kind = Literal["container", "network", "volume", "image"]


# ---------------------------------------------------------------------------------------------- pure part


@dataclass(frozen=True)
class ClaimedOwner:
    """The owner a resource's labels claim, parsed (``labels.Owner`` is what a live process writes)."""

    host: str
    pid: int
    boot_id: str
    start_time: str


@dataclass(frozen=True)
class HostFacts:
    """What the decision needs to know about the machine the reaper runs on."""

    hostname: str
    boot_id: str | None  # None where the kernel does not say (non-Linux): nothing there is provable
    pid_start_time: Callable[[int], str | None]  # None: no such process (or a zombie)


@dataclass(frozen=True)
class Resource:
    kind: Kind
    id: str
    name: str
    labels: Mapping[str, str]
    running: bool = False  # containers only
    # networks and volumes: ids of every container (running or not) attached to / mounting it; None when
    # not looked up (the plan then cannot prove it is unused)
    users: tuple[str, ...] | None = None

    @property
    def display(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class FoundProject:
    """A compose project as discovered on the engine: its labelled resources (not ``spec.models.Project``)."""

    name: str
    resources: tuple[Resource, ...]

    def of_kind(self, kind: Kind) -> list[Resource]:
        return [r for r in self.resources if r.kind == kind]

    def label(self, key: str) -> str:
        """The label's value if every resource that has it agrees, else ``"?"`` (shown, never trusted)."""
        values = {r.labels[key] for r in self.resources if key in r.labels}
        return values.pop() if len(values) == 1 else "?"


@dataclass(frozen=True)
class Decision:
    remove: bool
    code: Literal["owner_gone", "owner_rebooted", "owner_alive", "other_host", "unproven", "kept"]
    reason: str


def parse_owner(labels: Mapping[str, str]) -> ClaimedOwner | str:
    """The owner the labels name, or a sentence saying what is missing or malformed."""
    if labels.get(MANAGED) != "true":
        return f"{MANAGED} is not 'true'"
    keys = (OWNER_HOST, OWNER_PID, OWNER_BOOT_ID, OWNER_START_TIME)
    missing = [k for k in keys if not labels.get(k)]
    if missing:
        return "missing " + ", ".join(missing)
    # labels.UNKNOWN: the labelling process could not read it (no /proc) — nothing can be proven from it
    unknown = [k for k in keys if labels[k] == UNKNOWN]
    if unknown:
        return "unknown " + ", ".join(unknown)
    pid_text, start = labels[OWNER_PID], labels[OWNER_START_TIME]
    if not pid_text.isdigit() or int(pid_text) <= 0:
        return f"{OWNER_PID}={pid_text!r} is not a positive integer"
    if not start.isdigit():
        return f"{OWNER_START_TIME}={start!r} is not a clock-tick count"
    return ClaimedOwner(labels[OWNER_HOST], int(pid_text), labels[OWNER_BOOT_ID], start)


def decide(project: FoundProject, facts: HostFacts) -> Decision:
    """Remove the project only when its owner is provably gone (see the module docstring)."""
    owners: set[ClaimedOwner] = set()
    for r in project.resources:
        parsed = parse_owner(r.labels)
        if isinstance(parsed, str):
            return Decision(False, "unproven", f"labels of {r.display} unusable: {parsed}")
        owners.add(parsed)
    if len(owners) != 1:
        # zero: an empty project (nothing to do); several: the resources disagree, so none is proof
        return Decision(False, "unproven", f"resources name {len(owners)} different owners")
    owner = owners.pop()
    who = f"pid {owner.pid} on {owner.host}"
    if any(r.labels.get(KEPT) == "true" for r in project.resources):
        return Decision(
            False,
            "kept",
            f"left up on purpose by `forge provision --keep` "
            f"(`forge teardown --name {project.name}` removes it)",
        )
    if owner.host != facts.hostname:
        return Decision(False, "other_host", f"owner {who} is on another host (this is {facts.hostname})")
    if facts.boot_id is None:
        return Decision(False, "unproven", "this host's boot id is unknown, so no owner can be proven gone")
    if owner.boot_id != facts.boot_id:
        running = [r.name for r in project.of_kind("container") if r.running]
        if running:
            return Decision(
                False,
                "unproven",
                f"owner {who} is from another boot, but {', '.join(sorted(running))} running: "
                "not removed on a guess (same hostname on another machine, or a restart policy)",
            )
        return Decision(True, "owner_rebooted", f"owner {who} is from a previous boot of this host")
    now = facts.pid_start_time(owner.pid)
    if now is None:
        return Decision(True, "owner_gone", f"owner {who} is not running")
    if now != owner.start_time:
        return Decision(
            True, "owner_gone", f"owner {who} exited; the pid was reused (start {now} != {owner.start_time})"
        )
    return Decision(False, "owner_alive", f"owner {who} is alive")


@dataclass(frozen=True)
class Plan:
    remove: tuple[Resource, ...]  # in removal order: containers, networks, volumes
    keep: tuple[tuple[Resource, str], ...]  # resources of a removable project that must stay, and why


def plan_removal(project: FoundProject) -> Plan:
    """What to remove of a project whose owner is gone: all its containers; its networks and volumes unless
    a container that is not one of ours still uses them (Docker would refuse, or that container break)."""
    ours = {r.id for r in project.of_kind("container")}
    # A golden image left untagged (a golden discarded, or replaced by a newer capture of its key) is the
    # only kind of image the reaper sees; nothing else uses it once its owner is gone.
    remove: list[Resource] = list(project.of_kind("container")) + project.of_kind("image")
    keep: list[tuple[Resource, str]] = []
    for r in project.of_kind("network") + project.of_kind("volume"):
        if r.users is None:
            keep.append((r, "could not list the containers using it"))
            continue
        foreign = sorted(set(r.users) - ours)
        if foreign:
            verb = "attached" if r.kind == "network" else "mounting it"
            keep.append((r, f"containers not ours still {verb}: {', '.join(c[:12] for c in foreign)}"))
        else:
            remove.append(r)
    return Plan(tuple(remove), tuple(keep))


def group_projects(resources: Iterable[Resource]) -> list[FoundProject]:
    """Group by compose project; a resource without the compose label is a project of its own."""
    groups: dict[str, list[Resource]] = {}
    for r in resources:
        key = r.labels.get(COMPOSE_PROJECT) or f"({r.kind} {r.name})"
        groups.setdefault(key, []).append(r)
    return [FoundProject(k, tuple(v)) for k, v in sorted(groups.items())]


# ------------------------------------------------------------------------------------------ host facts


def local_facts() -> HostFacts:
    """This host as ``labels.current_owner`` names it (same hostname and boot id sources)."""
    me = current_owner()
    boot = None if me.boot_id == UNKNOWN else me.boot_id
    return HostFacts(me.host, boot, pid_start_time)


# ---------------------------------------------------------------------------------------------- Docker I/O


def _filters(run_id: str | None) -> list[str]:
    return filters({MANAGED: "true", **({RUN: run_id} if run_id is not None else {})})


def _ids(runner: Runner, argv: Sequence[str]) -> list[str]:
    out = runner.run(argv, timeout=DISCOVER_TIMEOUT).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def _gone(stderr: str) -> bool:
    """Docker's words for a resource that no longer exists (a concurrent run removed it meanwhile):
    "No such container/volume: X", "get X: no such volume" but "network X not found"."""
    return "no such" in stderr.lower() or "not found" in stderr


def _inspect(runner: Runner, what: str, ids: Sequence[str]) -> list[dict[str, Any]]:
    """``docker <what> inspect`` of ``ids``; a resource removed meanwhile is skipped (rc 1, partial JSON)."""
    if not ids:
        return []
    res = runner.run(dk.inspect(ids, kind=what), timeout=DISCOVER_TIMEOUT, check=False)
    try:
        data = json.loads(res.stdout or "[]")
    except json.JSONDecodeError:
        raise CommandError(res.argv, res.rc, res.stdout, res.stderr, reason="printed no JSON") from None
    if not isinstance(data, list) or (res.rc != 0 and not _gone(res.stderr)):
        raise CommandError(res.argv, res.rc, res.stdout, res.stderr)
    return [d for d in data if isinstance(d, dict)]


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    raw = obj.get("Labels") or {}
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def _with_users(runner: Runner, project: FoundProject) -> FoundProject:
    """``project`` with the users of each network and volume filled in: asked only of a project about to
    be removed, since `forge run` reaps at start and every live stack on the engine is discovered."""
    return FoundProject(
        project.name,
        tuple(
            dataclasses.replace(r, users=_users(runner, f"{r.kind}={r.id}"))
            if r.kind in ("network", "volume")
            else r
            for r in project.resources
        ),
    )


def _users(runner: Runner, flt: str) -> tuple[str, ...]:
    """Ids of every container (running or stopped) matching ``--filter flt``, e.g. ``network=ID``."""
    return tuple(_ids(runner, dk.ps(all=True, quiet=True, no_trunc=True, filter=flt)))


def discover(runner: Runner, run_id: str | None = None) -> list[FoundProject]:
    """Every container, network and volume labelled as forgelib's (optionally one run's), by project."""
    found: list[Resource] = []
    cids = _ids(runner, dk.ps(all=True, quiet=True, no_trunc=True, filters=_filters(run_id)))
    for c in _inspect(runner, "container", cids):
        cfg = c.get("Config") or {}
        state = c.get("State") or {}
        found.append(
            Resource(
                "container",
                str(c.get("Id", "")),
                str(c.get("Name", "")).lstrip("/"),
                _labels(cfg),
                running=bool(state.get("Running")) or bool(state.get("Restarting")),
            )
        )
    nids = _ids(runner, dk.ls("network", quiet=True, no_trunc=True, filters=_filters(run_id)))
    for n in _inspect(runner, "network", nids):
        nid = str(n.get("Id", ""))
        # Users are looked up later (`_with_users`) with `ps --filter network=`, which, unlike network
        # inspect's endpoints, sees stopped containers too.
        found.append(Resource("network", nid, str(n.get("Name", "")), _labels(n)))
    vnames = _ids(runner, dk.ls("volume", quiet=True, filters=_filters(run_id)))
    for v in _inspect(runner, "volume", vnames):
        name = str(v.get("Name", ""))
        found.append(Resource("volume", name, name, _labels(v)))
    # Goldens: only untagged ones (a complete golden is tagged, and is the user's to prune, never ours).
    golden = ["--filter", "dangling=true", "--filter", f"label={store.GOLDEN}"]
    gids = _ids(runner, dk.ls("image", quiet=True, no_trunc=True, filters=[*_filters(run_id), *golden]))
    for i in _inspect(runner, "image", gids):
        labels = _labels(i.get("Config") or {})
        iid = str(i.get("Id", ""))
        name = f"golden {labels.get(store.KEY, '?')[:12]} ({iid.removeprefix('sha256:')[:12]})"
        found.append(Resource("image", iid, name, labels))
    # Checkpoints: only the images of incomplete ones (no manifest image: a capture cut short) and of a
    # run's own (a task's setup: its manifest says so). Any other complete checkpoint is the user's to
    # prune, never ours.
    cp = ["--filter", f"label={checkpoints.CHECKPOINT}"]
    cids = _ids(runner, dk.ls("image", quiet=True, no_trunc=True, filters=[*_filters(run_id), *cp]))
    infos = _inspect(runner, "image", sorted(set(cids)))
    # every manifest image: it carries no run label, so a run's filter would hide it
    manifests = ["--filter", f"label={checkpoints.MANIFEST}"]
    mids = _ids(runner, dk.ls("image", quiet=True, no_trunc=True, filters=[*_filters(None), *manifests]))
    manifest_labels = [
        labels
        for i in [*infos, *_inspect(runner, "image", sorted(set(mids) - set(cids)))]
        if checkpoints.MANIFEST in (labels := _labels(i.get("Config") or {}))
    ]
    complete = {
        labels.get(checkpoints.CHECKPOINT)
        for labels in manifest_labels
        if labels.get(checkpoints.SCOPE) != checkpoints.RUN_SCOPE
    }
    # A run's checkpoint copied onto this engine from another node's (a cluster run's setup) keeps the
    # capturing process's owner labels on its service images; its manifest image names the process that
    # loaded it here. The service images go with their manifest's owner.
    run_owner = {
        labels.get(checkpoints.CHECKPOINT): {k: labels[k] for k in OWNER_LABELS if k in labels}
        for labels in manifest_labels
        if labels.get(checkpoints.SCOPE) == checkpoints.RUN_SCOPE
    }
    for i in infos:
        labels = _labels(i.get("Config") or {})
        if checkpoints.CHECKPOINT not in labels or labels[checkpoints.CHECKPOINT] in complete:
            continue
        labels = {**labels, **run_owner.get(labels[checkpoints.CHECKPOINT], {})}
        iid = str(i.get("Id", ""))
        name = f"checkpoint {labels.get(checkpoints.CHECKPOINT, '?')} {labels.get(checkpoints.SERVICE, '')}"
        found.append(Resource("image", iid, name.strip(), labels))
    # Images built for a run's `build:` services (builds.py): labelled with the run's labels and the
    # compose project of the trial that built them, so they go with that project once its owner is gone.
    mine = {MANAGED: "true", **({RUN: run_id} if run_id is not None else {})}
    for i in _inspect(runner, "image", builds.built_images(runner, mine, timeout=DISCOVER_TIMEOUT)):
        labels = _labels(i.get("Config") or {})
        if store.GOLDEN in labels:  # never a golden (those are the user's to prune)
            continue
        tags = [str(t) for t in i.get("RepoTags") or []]
        found.append(Resource("image", str(i.get("Id", "")), f"built {', '.join(tags) or '?'}", labels))
    return group_projects(found)


def _remove(runner: Runner, r: Resource) -> str | None:
    """Remove one resource by id; the error text on failure (already gone counts as removed)."""
    # --volumes: also the container's anonymous volumes (an image's VOLUME), which carry none of our labels;
    # networks, volumes and images by `docker KIND rm`
    argv = dk.rm([r.id], force=True, volumes=True) if r.kind == "container" else dk.rm([r.id], kind=r.kind)
    try:
        res = runner.run(argv, timeout=REMOVE_TIMEOUT, check=False)
    except CommandError as e:  # a timeout: report it, go on with the rest
        return str(e).splitlines()[0]
    if res.rc == 0 or _gone(res.stderr):
        return None
    if "already in progress" in res.stderr:  # another reaper (a `forge run` healing the engine) removes it
        return _removed_meanwhile(runner, r)
    # Another reaper may have won the race in words `_gone` does not know: an image removed meanwhile
    # fails with "unrecognized image ID" or "reference does not exist". Gone is gone, whoever removed it.
    if _exists(runner, r) is False:
        return None
    return (res.stderr.strip().splitlines() or [f"rc={res.rc}"])[-1]


def _exists(runner: Runner, r: Resource) -> bool | None:
    """Whether ``r`` is still on the engine; None when the engine's answer says neither."""
    argv = dk.inspect([r.id], kind=r.kind, format="{{.Id}}")
    try:
        res = runner.run(argv, timeout=REMOVE_TIMEOUT, check=False)
    except CommandError:  # a timeout: no answer
        return None
    if res.rc == 0:
        return True
    return False if _gone(res.stderr) else None


def _removed_meanwhile(runner: Runner, r: Resource) -> str | None:
    """None once the removal another process started is over (its network can go next), else why not."""
    deadline = time.monotonic() + REMOVE_TIMEOUT
    while time.monotonic() < deadline:
        if _exists(runner, r) is False:
            return None
        time.sleep(0.2)
    return f"another process's removal of it did not end in {REMOVE_TIMEOUT:.0f} s"


# --------------------------------------------------------------------------------------------- reporting

Action = Literal["removed", "would remove", "kept", "failed"]


@dataclass
class ReapOutcome:
    """What the reaper did with one project (not a lifecycle ``Outcome``)."""

    project: str
    run: str
    trial: str
    action: Action
    code: str
    reason: str
    removed: list[str] = field(default_factory=list)  # "container NAME", ...
    kept: list[str] = field(default_factory=list)  # "network NAME: why"
    errors: list[str] = field(default_factory=list)  # "volume NAME: docker's error"


@dataclass
class ReapReport:
    dry_run: bool
    outcomes: list[ReapOutcome] = field(default_factory=list)

    @property
    def removed(self) -> list[ReapOutcome]:
        return [o for o in self.outcomes if o.action in ("removed", "would remove")]

    @property
    def kept(self) -> list[ReapOutcome]:
        return [o for o in self.outcomes if o.action == "kept"]

    @property
    def failed(self) -> list[ReapOutcome]:
        return [o for o in self.outcomes if o.action == "failed"]

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "removed": len(self.removed),
            "kept": len(self.kept),
            "failed": len(self.failed),
            "projects": [asdict(o) for o in self.outcomes],
        }

    def table(self) -> str:
        if not self.outcomes:
            return "no forgelib-labelled containers, networks or volumes found"
        rows = [("PROJECT", "RUN", "TRIAL", "ACTION", "REASON")]
        for o in self.outcomes:
            why = o.reason
            if o.kept:
                why += "; kept " + "; ".join(o.kept)
            if o.errors:
                why += "; errors: " + "; ".join(o.errors)
            rows.append((o.project, o.run, o.trial, o.action, why))
        lines = align(rows, ragged_last=True)
        n_res = sum(len(o.removed) for o in self.removed)
        verb = "would remove" if self.dry_run else "removed"
        lines.append(
            f"{verb} {len(self.removed)} project(s) ({n_res} resources); kept {len(self.kept)}; "
            f"failed {len(self.failed)}"
        )
        return "\n".join(lines)


def reap(
    runner: Runner, *, run_id: str | None = None, dry_run: bool = False, facts: HostFacts | None = None
) -> ReapReport:
    """Discover, decide, and (unless ``dry_run``) remove. Discovery errors raise; removal errors are reported
    per resource and the reaper goes on with the rest."""
    facts = facts or local_facts()
    report = ReapReport(dry_run)
    # Projects with images last (untagged goldens, a run's built images): a container of a stack removed
    # here may still be using one.
    projects = sorted(discover(runner, run_id), key=lambda p: any(r.kind == "image" for r in p.resources))
    for project in projects:
        d = decide(project, facts)
        o = ReapOutcome(project.name, project.label(RUN), project.label(TRIAL), "kept", d.code, d.reason)
        report.outcomes.append(o)
        if not d.remove:
            continue
        plan = plan_removal(_with_users(runner, project))
        o.kept = [f"{r.display}: {why}" for r, why in plan.keep]
        if dry_run:
            o.action = "would remove"
            o.removed = [r.display for r in plan.remove] + [f"directory {w}" for w in _work_dirs(project)]
            continue
        o.action = "removed"
        for r in plan.remove:
            err = _remove(runner, r)
            if err is None:
                o.removed.append(r.display)
            elif r.kind == "image" and ("being used" in err or "conflict" in err):
                # a golden some live trial was started from: never pulled from under it; next time
                o.kept.append(f"{r.display}: in use by a container")
                o.action = "kept" if not o.removed else o.action
            else:
                o.errors.append(f"{r.display}: {err}")
                o.action = "failed"
        if o.action == "removed":
            o.removed += [f"directory {w}" for w in _work_dirs(project) if remove_work_dir(w)]
    _reap_build_dirs(report, facts, run_id)
    if run_id is None:
        _reap_owned_dirs(report, facts, projects, OWNED_DIRS)
    return report


def _work_dirs(project: FoundProject) -> set[str]:
    return {r.labels[WORK_DIR] for r in project.resources if r.labels.get(WORK_DIR)}


def remove_work_dir(value: str) -> bool:
    """Remove the directory a stack's ``WORK_DIR`` label names, if it is one of ours (an absolute
    ``forge provision`` directory; anything else a label says is left alone); whether it was removed."""
    d = Path(value)
    if not d.is_absolute() or dir_owner(d, PROVISION_DIR) is None or d.is_symlink() or not d.is_dir():
        return False
    shutil.rmtree(d, ignore_errors=True)
    return not d.exists()


def _reap_owned_dirs(
    report: ReapReport,
    facts: HostFacts,
    projects: Sequence[FoundProject],
    owned: Mapping[str, tuple[str, str]],
) -> None:
    """Owned temp dirs (``owned``: prefix -> kind, who) whose owner is gone and whose stack is gone too:
    the owner was killed (a ``forge provision`` before its stack came up, a pytest session or xdist
    worker at any time), or a failed provision kept it for its logs. A kept stack's stays."""
    if facts.boot_id is None:
        return
    named = set().union(*map(_work_dirs, projects))  # its stack's: gone with it, or staying with it

    def alive(pid: int, start: str) -> bool:
        return facts.pid_start_time(pid) == start

    for prefix, (kind, who) in owned.items():
        for d in stale_owned_dirs(prefix, alive):
            if str(d) in named:
                continue
            verb: Action = "would remove" if report.dry_run else "removed"
            o = ReapOutcome(
                f"({kind} dir {d.name})",
                "-",
                "-",
                verb,
                "owner_gone",
                f"{who} left it; its owner is not running",
            )
            if not report.dry_run:
                shutil.rmtree(d, ignore_errors=True)
            o.removed.append(f"directory {d}")
            report.outcomes.append(o)


def reap_owned_dirs(prefix: str) -> list[str]:
    """The ``prefix`` owned temp dirs whose owner is provably gone, removed (``reap`` without a run id
    does this for every kind): what the pytest plugin's xdist controller runs when a worker dies."""
    report = ReapReport(dry_run=False)
    _reap_owned_dirs(report, local_facts(), (), {prefix: OWNED_DIRS[prefix]})
    return [d for o in report.outcomes for d in o.removed]


def _reap_build_dirs(report: ReapReport, facts: HostFacts, run_id: str | None) -> None:
    """A golden or checkpoint capture killed mid-write leaves its host build directory (the image itself is
    only tagged once whole): removed once its owner, named in the directory, is provably gone; with
    ``run_id``, only a checkpoint capture's of that run's stack."""

    def alive(pid: str, start: str) -> bool:
        return facts.boot_id is None or facts.pid_start_time(int(pid)) == start

    for d in store.stale_build_dirs(alive, run_id):
        what = "checkpoint" if store.build_run(d) else "golden"
        o = ReapOutcome(f"({what} build {d.name})", store.build_run(d) or "-", "-",
                    "would remove" if report.dry_run else "removed",
                    "owner_gone", f"a {what} capture whose owner is not running left it")  # fmt: skip
        if not report.dry_run:
            shutil.rmtree(d, ignore_errors=True)
        o.removed.append(f"directory {d}")
        report.outcomes.append(o)


def reap_dead_owners(runner: Runner, run_id: str | None = None) -> ReapReport:
    """What ``forge run`` calls at start so a crashed earlier run heals itself (same rules as ``forge reap``).

    Its own stacks (if any) are kept: their owner, this process, is alive."""
    return reap(runner, run_id=run_id)


__all__ = [
    "ClaimedOwner",
    "FoundProject",
    "HostFacts",
    "ReapReport",
    "Resource",
    "decide",
    "discover",
    "local_facts",
    "pid_start_time",
    "plan_removal",
    "reap",
    "reap_dead_owners",
]
