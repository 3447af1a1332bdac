"""``forge snapshots ls | prune | verify``: the goldens and checkpoints on this engine, as the user sees and
manages them (the checkpoints' part: ``snapshot_checkpoints``)."""

from __future__ import annotations

import contextlib
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from forgelib.cli import snapshot_checkpoints as cks
from forgelib.docker import argv as dk
from forgelib.docker import labels as lab
from forgelib.errors import EXIT_OK, EXIT_USER, ForgeError, UsageError
from forgelib.runner import Runner, SubprocessRunner
from forgelib.stacks import reaper as custody
from forgelib.stacks.snapshots import store
from forgelib.stacks.snapshots.key import FORMAT_VERSION
from forgelib.table import align

ACTIONS = ("ls", "prune", "verify")
USAGE = """usage: forge snapshots ls [--project NAME] [--json]
       forge snapshots prune (--all | --older-than DAYS | --unused | --checkpoint ID)
                             [--project NAME] [--json]
       forge snapshots verify [--project NAME] [--json]

ls      every golden: key, service, seed, image, recipe and format versions, size, age, last use; and every
        checkpoint: id, state, source stack, services, size, age
prune   remove goldens and checkpoints: --all, those taken more than DAYS ago, or --unused ones (no tag
        names their image any more, or their format is not this forgelib's: no trial can ever restore
        them); --checkpoint ID: that one checkpoint only. A checkpoint goes whole (its manifest and every
        service image). Discarded (untagged) goldens and incomplete or changed checkpoints always go once
        the process that captured them is gone (until then it may be a capture in flight); a golden or
        checkpoint a container is using stays
verify  check every golden can be restored: its format, its image, and its data (every entry readable);
        a golden that fails is discarded, so no trial restores it (exit 1)
--project NAME  only the goldens and checkpoints captured for that project (project.yaml's name): the engine
        may hold other projects', other users' or concurrent test sessions' snapshots"""


def main_snapshots(
    action: str,
    all: bool = False,
    older_than: float | None = None,
    unused: bool = False,
    as_json: bool = False,
    project: str | None = None,
    checkpoint: str | None = None,
) -> int:
    if action in ("-h", "--help", "help"):
        print(USAGE)
        return EXIT_OK
    if action not in ACTIONS:
        raise UsageError(f"unknown snapshots action {action!r}: use one of {', '.join(ACTIONS)}\n{USAGE}")
    if action != "prune" and (all or older_than is not None or unused or checkpoint is not None):
        raise UsageError(
            f"--all, --older-than, --unused and --checkpoint select what `prune` removes, not `{action}`"
        )
    runner = SubprocessRunner()
    if action == "ls":
        rows = [
            {"type": "golden", **describe(g, runner)} for g in store.list_goldens(runner, project=project)
        ]
        found = cks.find(runner, project=project)
        sizes = cks.sizes(runner, found)
        rows += [cks.describe(f, sizes) for f in found]
        _print(rows, as_json, render_ls)
        return EXIT_OK
    if action == "prune":
        chosen = [bool(all), older_than is not None, bool(unused), checkpoint is not None]
        if sum(chosen) != 1:
            raise UsageError("prune needs exactly one of --all, --older-than DAYS, --unused, --checkpoint ID")
        if older_than is not None and older_than < 0:
            raise UsageError("--older-than takes a number of days >= 0")
        report = [] if checkpoint is not None else [
            {"type": "golden", **r}
            for r in prune(runner, all=all, older_than=older_than, unused=unused, project=project)
        ]  # fmt: skip
        report += cks.prune(
            runner, all=all, older_than=older_than, unused=unused, checkpoint=checkpoint, project=project
        )
        _print(report, as_json, render_actions)
        return EXIT_USER if any(r["action"] == "failed" for r in report) else EXIT_OK
    report = verify(runner, project=project)
    _print(report, as_json, render_actions)
    return EXIT_USER if any(r["action"] in ("discarded", "failed") for r in report) else EXIT_OK


def _print(rows: list[dict[str, Any]], as_json: bool, render: Any) -> None:
    if as_json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render(rows))


# --------------------------------------------------------------------------------------------------- ls


def describe(g: store.Golden, runner: Runner | None = None, now: datetime | None = None) -> dict[str, Any]:
    now = now or datetime.now(UTC)
    used = store.last_used(g.key) if g.key else None
    return {
        "key": g.key,
        "image": g.id,
        "complete": g.complete,
        "format": g.format,
        "service": g.part("service"),
        "project": g.part("project"),
        "seed": g.part("seed"),
        "seed_digest": g.part("seed_digest"),
        "kind": g.part("kind"),
        "recipe_version": g.part("recipe_version"),
        "base_image": g.part("image_id"),
        "config_digest": g.part("config_digest"),
        "path": g.part("path"),
        "bytes": int(g.part("bytes") or 0),
        "created": g.created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "age_days": round((now - g.created).total_seconds() / 86400, 2),
        "last_used": used.strftime("%Y-%m-%dT%H:%M:%SZ") if used else None,
    }


def render_ls(rows: list[dict[str, Any]]) -> str:
    goldens = [r for r in rows if r.get("type", "golden") == "golden"]
    checkpoints = [r for r in rows if r.get("type") == "checkpoint"]
    return "\n\n".join([_render_goldens(goldens), "\n".join(cks.render_ls(checkpoints))])


def _render_goldens(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no goldens on this engine"
    table = [
        (
            "KEY",
            "SERVICE",
            "PROJECT",
            "SEED",
            "KIND/RECIPE",
            "FORMAT",
            "BASE IMAGE",
            "SIZE",
            "AGE",
            "LAST USE",
        )
    ]
    for r in rows:
        key = r["key"][:12] + ("" if r["complete"] else " (discarded)")
        table.append(
            (
                key, r["service"], r["project"], r["seed"], f"{r['kind']}/v{r['recipe_version']}",
                str(r["format"]), r["base_image"].removeprefix("sha256:")[:12], _size(r["bytes"]),
                _age(r["age_days"]), r["last_used"] or "never (here)",
            )
        )  # fmt: skip
    lines = align(table)
    total = sum(r["bytes"] for r in rows)
    lines.append(f"{len(rows)} golden(s), {_size(total)} of captured data")
    return "\n".join(lines)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _age(days: float) -> str:
    return f"{days * 24:.1f} h" if days < 2 else f"{days:.1f} d"


# ------------------------------------------------------------------------------------------------ prune


def prune(
    runner: Runner,
    *,
    all: bool,
    older_than: float | None,
    unused: bool,
    project: str | None = None,
    facts: custody.HostFacts | None = None,
) -> list[dict[str, Any]]:
    goldens = store.list_goldens(runner, project=project)
    present = _present_images(runner, {g.part("image_id") for g in goldens if g.part("image_id")})
    now = datetime.now(UTC)
    facts = facts or custody.local_facts()
    out = []
    for g in goldens:
        why = select(g, all=all, older_than=older_than, unused=unused, present=present, now=now)
        if why is None:
            continue
        row = {"key": g.key, "image": g.id, "service": g.part("service"), "why": why}
        held = None if g.complete else _in_flight(g, facts)
        if held is not None:
            out.append({**row, "action": "kept", "error": held})
            continue
        with contextlib.ExitStack() as hold:
            if g.complete and not hold.enter_context(store.unclaimed(g.key)):
                out.append({**row, "action": "kept", "error": CLAIMED})
                continue
            err = store.remove(runner, g)
            if err is None:
                store.forget(g.key) if g.complete else None
                out.append({**row, "action": "removed"})
            else:
                out.append({**row, "action": "kept" if "in use" in err else "failed", "error": err})
    return out


CLAIMED = "a trial on this host has chosen it and its containers do not exist yet"


def _in_flight(g: store.Golden, facts: custody.HostFacts) -> str | None:
    """Why an untagged golden must stay, or None. Untagged is also what a capture still running looks like
    (its built image is named by ID until the key's tag goes on the loaded one), so it goes only once the
    process that captured it is provably gone: the reaper's own rule (``custody.decide``), not a guess."""
    image = custody.Resource("image", g.id, g.id, g.labels)
    d = custody.decide(custody.FoundProject(g.id, (image,)), facts)
    return None if d.remove else f"untagged, but may be a capture in flight: {d.reason}"


def select(
    g: store.Golden,
    *,
    all: bool,
    older_than: float | None,
    unused: bool,
    present: set[str],
    now: datetime,
) -> str | None:
    """Why ``prune`` removes ``g`` with these options, or None (pure: unit-tested)."""
    if not g.complete:
        return "discarded (untagged)"
    if all:
        return "--all"
    if older_than is not None and now - g.created > timedelta(days=older_than):
        return f"taken {(now - g.created).total_seconds() / 86400:.1f} days ago"
    if unused:
        if g.format != str(FORMAT_VERSION):
            return f"snapshot format {g.format}, this forgelib restores format {FORMAT_VERSION}"
        if g.part("image_id") not in present:
            return f"no tag names its image {g.part('image_id')[:19]} any more"
    return None


def _present_images(runner: Runner, ids: set[str]) -> set[str]:
    """The ids among ``ids`` that some tag still names. A golden keeps its base image's layers alive, not
    necessarily the base image itself (a format 2 golden is loaded without a parent); either way, once no
    tag names that id (a newer build took the tag, or it was removed), no compose file resolves to it and
    its goldens can never be restored again."""
    if not ids:
        return set()
    argv = dk.inspect(sorted(ids), kind="image", format="{{.Id}} {{len .RepoTags}}")
    res = runner.run(argv, check=False)
    rows = (line.split() for line in res.stdout.splitlines())
    return {r[0] for r in rows if len(r) == 2 and r[1] != "0"}


# ----------------------------------------------------------------------------------------------- verify


def verify(runner: Runner, project: str | None = None) -> list[dict[str, Any]]:
    """Each complete golden (of ``project``): this format, its image present, its data all readable (the
    number of entries under its path equals the count taken at capture). A failing golden is discarded."""
    goldens = [g for g in store.list_goldens(runner, project=project) if g.complete]
    present = _present_images(runner, {g.part("image_id") for g in goldens})
    out = []
    for g in goldens:
        problem = check(runner, g, present)
        row: dict[str, Any] = {"key": g.key, "image": g.id, "service": g.part("service")}
        if problem is None:
            out.append({**row, "action": "ok", "why": f"{g.part('entries')} entries readable"})
            continue
        err = store.remove(runner, g, force_untag=True)
        out.append({**row, "action": "discarded" if err is None else "failed", "why": problem, "error": err})
    return out


def check(runner: Runner, g: store.Golden, present: set[str]) -> str | None:
    if g.format != str(FORMAT_VERSION):
        return f"snapshot format {g.format}, this forgelib restores format {FORMAT_VERSION}"
    if g.part("image_id") not in present:
        return f"no tag names its image {g.part('image_id')[:19]} any more"
    path, expected = g.part("path"), g.part("entries")
    # `find` prints one line per entry and fails on anything unreadable; run as root, without the
    # image's entrypoint, removed afterwards, labelled like every container of ours.
    labels = [f"{k}={v}" for k, v in lab.run_labels("snapshots-verify").items()]
    argv = dk.run(g.id, [path], rm=True, user="0", entrypoint="find", network="none", label=labels)
    try:
        res = runner.run(argv, timeout=300, check=False)
    except ForgeError as e:
        return f"could not read it: {e}"
    if res.rc != 0:
        return f"reading {path} failed: {res.stderr.strip()[-300:]}"
    found = len([ln for ln in res.stdout.splitlines() if ln])
    if str(found) != expected:
        return f"{path} holds {found} entries, the capture recorded {expected or 'none'}"
    return None


def render_actions(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "nothing to do"
    lines = []
    for r in rows:
        extra = f" ({r['error']})" if r.get("error") else ""
        lines.append(f"{r['action']:<10} {r['key'][:12]}  {r['service']:<16} {r['why']}{extra}")
    return "\n".join(lines)
