"""Checkpoints in ``forge snapshots ls | prune``: what each option selects, that a checkpoint goes whole
(manifest tag first, then its service images), that one a live process may still be capturing stays, and
what ``ls`` says of each (state, source, services, the size it adds beyond its base images)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from forgelib.cli import snapshot_checkpoints as cks
from forgelib.docker import labels as lab
from forgelib.stacks import reaper as custody
from forgelib.stacks.snapshots import checkpoints as ckstore
from forgelib.stacks.snapshots.key import canonical
from forgelib.testing import FakeRunner

A, B, C = "ck-aaaaaaaaaaaa", "ck-bbbbbbbbbbbb", "ck-cccccccccccc"
ME = lab.current_owner().labels()
DEAD = {**ME, lab.OWNER_PID: "999999"}
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _facts() -> custody.HostFacts:
    def start_time(pid: int) -> str | None:
        return None if pid == 999999 else ME[lab.OWNER_START_TIME]

    return custody.HostFacts(ME[lab.OWNER_HOST], ME[lab.OWNER_BOOT_ID], start_time)


def _manifest(created: str, project: str = "p") -> dict[str, Any]:
    return {
        "source": "stack-1",
        "project": project,
        "created": created,
        "services": {"db": {"image": "sha256:a-db", "base": "sha256:pg", "path": "/var/lib/postgresql/data"}},
        "images": {"db": "sha256:pg", "app": "sha256:app"},
    }


def _info(
    iid: str, labels: dict[str, str], created: str = "2026-12-06T10:00:00.123456789Z"
) -> dict[str, Any]:
    return {"Id": iid, "Created": created, "Config": {"Labels": {lab.MANAGED: "true", **labels}}}


def _engine(created: str = "2026-12-06T10:00:00Z") -> FakeRunner:
    """A complete checkpoint A (manifest + db image, both tagged), and two captures cut short that left
    one untagged service image each: B by a process that is gone, C by this (live) process."""
    text = canonical(_manifest(created))
    manifest = _info(
        "sha256:a-man",
        {
            **ME,
            ckstore.CHECKPOINT: A,
            ckstore.MANIFEST: text,
            ckstore.DIGEST: hashlib.sha256(text.encode()).hexdigest(),
        },
    )
    a_db = _info("sha256:a-db", {**ME, ckstore.CHECKPOINT: A, ckstore.SERVICE: "db"})
    b_db = _info("sha256:b-db", {**DEAD, ckstore.CHECKPOINT: B, ckstore.SERVICE: "db"})
    c_db = _info("sha256:c-db", {**ME, ckstore.CHECKPOINT: C, ckstore.SERVICE: "cache"})
    r = FakeRunner()
    r.expect("docker", "image", "ls", "--format", "{{.Tag}}", ckstore.REPOSITORY, stdout=f"{A}\n{A}-db\n")
    r.expect("docker", "image", "inspect", ckstore.tag_of(A), exact=True, stdout=json.dumps([manifest]))
    r.expect(
        "docker", "image", "inspect", "--format", "{{.Id}}", ckstore.tag_of(A, "db"), stdout="sha256:a-db\n"
    )
    every = ["docker", "image", "ls", "--quiet", "--no-trunc", "--filter", f"label={ckstore.CHECKPOINT}"]
    r.expect(*every, exact=True, stdout="sha256:a-man\nsha256:a-db\nsha256:b-db\nsha256:c-db\n")
    r.expect("docker", "image", "inspect", "sha256:a-db", stdout=json.dumps([a_db, manifest, b_db, c_db]))
    for cid, left in ((A, ""), (B, "sha256:b-db\n"), (C, "sha256:c-db\n")):
        dangling = ["--filter", f"label={ckstore.CHECKPOINT}={cid}", "--filter", "dangling=true"]
        r.expect("docker", "image", "ls", "--quiet", "--no-trunc", *dangling, exact=True, stdout=left)
    r.expect("docker", "image", "rm")
    return r


def _removed(r: FakeRunner) -> list[str]:
    return [c.argv[3] for c in r.calls if c.argv[:3] == ("docker", "image", "rm")]


def test_prune_removes_a_dead_capture_cut_short_and_keeps_one_a_live_process_may_still_be_taking() -> None:
    r = _engine(created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    rows = {row["id"]: row for row in cks.prune(r, all=False, older_than=1000, unused=False, facts=_facts())}
    assert set(rows) == {B, C}  # A is complete and young: --older-than 1000 leaves it
    assert rows[B]["action"] == "removed" and "incomplete" in rows[B]["why"]
    assert rows[C]["action"] == "kept" and "capture in flight" in rows[C]["error"]
    assert _removed(r) == ["sha256:b-db"]


def test_prune_all_removes_a_complete_checkpoint_whole_manifest_first() -> None:
    r = _engine()
    rows = {row["id"]: row for row in cks.prune(r, all=True, older_than=None, unused=False, facts=_facts())}
    assert {k: v["action"] for k, v in rows.items()} == {A: "removed", B: "removed", C: "kept"}
    assert rows[A]["why"] == "--all" and rows[A]["service"] == "db"
    # the manifest tag goes first: from then on no fork or restore takes the half-removed checkpoint
    assert _removed(r) == [ckstore.tag_of(A), ckstore.tag_of(A, "db"), "sha256:b-db"]


def test_prune_one_checkpoint_by_id_and_refuse_an_unknown_one() -> None:
    r = _engine()
    rows = cks.prune(r, all=False, older_than=None, unused=False, checkpoint=A, facts=_facts())
    assert [(row["id"], row["action"]) for row in rows] == [(A, "removed")]
    assert _removed(r) == [ckstore.tag_of(A), ckstore.tag_of(A, "db")]
    with pytest.raises(ckstore.CheckpointError, match="no checkpoint ck-000000000000"):
        cks.prune(_engine(), all=False, older_than=None, unused=False, checkpoint="ck-000000000000")


def test_ls_says_state_source_services_and_the_bytes_beyond_the_base_image() -> None:
    r = _engine()
    found = {f.id: f for f in cks.find(r)}
    assert {k: f.state for k, f in found.items()} == {A: "complete", B: "incomplete", C: "incomplete"}
    row = cks.describe(found[A], {"sha256:a-db": 700, "sha256:pg": 400, "sha256:a-man": 0}, now=NOW)
    assert row == {
        "type": "checkpoint", "id": A, "state": "complete", "source": "stack-1", "project": "p",
        "services": ["db"], "bytes": 300, "created": "2026-12-06T10:00:00Z", "age_days": 0.08,
    }  # fmt: skip
    # no manifest: the services from the images' labels, the time from the images'
    row = cks.describe(found[C], {"sha256:c-db": 50}, now=NOW)
    assert (row["services"], row["bytes"], row["source"], row["created"]) == (
        ["cache"],
        50,
        "",
        "2026-12-06T10:00:00Z",
    )
    text = "\n".join(cks.render_ls([cks.describe(f, {}, now=NOW) for f in found.values()]))
    assert A in text and "stack-1" in text and "3 checkpoint(s)" in text
    # scoped to a project: only the complete ones its manifest names (a cut-short one names none)
    assert [f.id for f in cks.find(_engine(), project="p")] == [A]
    assert cks.find(_engine(), project="other") == []


def _found(state: cks.State, created: str = "2026-12-01T12:00:00Z") -> cks.Found:
    return cks.Found(A, state, _manifest(created) if state != "incomplete" else {}, ())


@pytest.mark.parametrize(
    ("found", "options", "why"),
    [
        (_found("complete"), {}, None),
        (_found("complete"), {"all": True}, "--all"),
        (_found("complete"), {"older_than": 4.0}, "taken 5.0 days ago"),
        (_found("complete"), {"older_than": 6.0}, None),
        (_found("complete"), {"unused": True, "present": {"sha256:pg", "sha256:app"}}, None),
        (
            _found("complete"),
            {"unused": True, "present": {"sha256:pg"}},
            "no tag names the image service 'app'",
        ),
        (_found("changed"), {"older_than": 100.0}, "changed since capture"),
        (_found("incomplete"), {"unused": True}, "incomplete"),
        (_found("complete"), {"checkpoint": A}, "--checkpoint"),
        (_found("incomplete"), {"checkpoint": B}, None),  # --checkpoint ID: that one only
    ],
)
def test_what_prune_selects(found: cks.Found, options: dict[str, Any], why: str | None) -> None:
    opts: dict[str, Any] = {
        "all": False,
        "older_than": None,
        "unused": False,
        "checkpoint": None,
        "present": set(),
    }
    got = cks.select(found, **{**opts, **options}, now=NOW)
    if why is None:
        assert got is None
    else:
        assert got is not None and got.startswith(why), got
