"""ensure_images' reuse-vs-rebuild decisions and exact docker argv, and ImageFacts, on the fake runner."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from forgelib.docker import images
from forgelib.docker.images import (
    BUILD_TIMEOUT,
    BUILT_BASE,
    HASH_LABEL,
    OFFICIAL_BASE,
    STAND_INS,
    ImageError,
    ImageFacts,
    base_hash,
    ensure_images,
    recipe_hash,
)
from forgelib.testing import FakeRunner

BASE_ID = "sha256:base"


@pytest.fixture
def recipes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A checkout's images/ and scripts/ with tiny recipes; the lock file in tmp."""
    root = tmp_path / "data"
    for name in STAND_INS:
        (root / "images" / name).mkdir(parents=True)
        (root / "images" / name / "Dockerfile").write_text(f"ARG BASE\nFROM ${{BASE}}\n# {name}\n")
    (root / "scripts").mkdir()
    (root / "scripts" / "build-base.sh").write_text("#!/bin/sh\n# debootstrap\n")
    monkeypatch.setattr(images, "data_dir", lambda name: root / name)
    monkeypatch.setattr(images, "LOCK_PATH", tmp_path / "images.lock")
    yield root / "images"


def inspect(ref: str) -> tuple[str, ...]:
    return ("docker", "image", "inspect", "--format", "{{.Id}} {{json .Config.Labels}}", ref)


def found(image_id: str, labels: dict[str, str] | None) -> str:
    return f"{image_id} {json.dumps(labels)}\n"


def script_base(fake: FakeRunner, recipes: Path) -> None:
    """No official slim image; our debootstrapped base is current."""
    fake.expect(*inspect(OFFICIAL_BASE), exact=True, rc=1, stderr="Error: No such image")
    want = base_hash(recipes.parent / "scripts" / "build-base.sh")
    fake.expect(*inspect(BUILT_BASE), exact=True, stdout=found(BASE_ID, {HASH_LABEL: want}))


def build_argv(recipes: Path, name: str, base: str, base_id: str = BASE_ID) -> tuple[str, ...]:
    return (
        "docker", "build",
        "--build-arg", f"BASE={base}",
        "--label", f"{HASH_LABEL}={recipe_hash(recipes / name, base_id)}",
        "--tag", STAND_INS[name].tag,
        str(recipes / name),
    )  # fmt: skip


def current(fake: FakeRunner, recipes: Path, *names: str) -> None:
    """These stand-ins exist, built from their recipes as they are now on BASE_ID."""
    for name in names:
        label = {HASH_LABEL: recipe_hash(recipes / name, BASE_ID)}
        fake.expect(*inspect(STAND_INS[name].tag), exact=True, stdout=found(f"sha256:{name}", label))


def test_nothing_changed_reuses_everything(recipes: Path) -> None:
    fake = FakeRunner()
    script_base(fake, recipes)
    current(fake, recipes, *STAND_INS)
    lines: list[str] = []

    rows = ensure_images(fake, jobs=1, say=lines.append)

    assert [(r.name, r.action) for r in rows] == [
        ("base", "reused"), ("postgres", "reused"), ("redis", "reused"), ("mariadb", "reused"),
        ("python", "reused"),
    ]  # fmt: skip
    assert fake.argvs() == [
        inspect(OFFICIAL_BASE),
        inspect(BUILT_BASE),
        *(inspect(s.tag) for s in STAND_INS.values()),
    ]
    assert any("reused" in ln and "forgelib/redis:7.0" in ln for ln in lines)
    assert lines[-1].startswith("images: done in ")


def test_changed_recipe_rebuilds_only_that_image_and_removes_the_old_one(recipes: Path) -> None:
    fake = FakeRunner()
    script_base(fake, recipes)
    current(fake, recipes, "postgres", "mariadb", "python")
    redis = STAND_INS["redis"].tag
    fake.expect(*inspect(redis), exact=True, stdout=found("sha256:old", {HASH_LABEL: "stale"}), times=1)
    fake.expect(*build_argv(recipes, "redis", BUILT_BASE), exact=True)
    fake.expect(*inspect(redis), exact=True, stdout=found("sha256:new", {HASH_LABEL: "fresh"}))
    fake.expect("docker", "image", "rm", "sha256:old", exact=True)
    dangling = (
        "docker",
        "image",
        "ls",
        "--quiet",
        "--filter",
        "dangling=true",
        "--filter",
        f"label={HASH_LABEL}",
    )
    fake.expect(*dangling, exact=True, stdout="")

    rows = ensure_images(fake, jobs=1, say=lambda _: None)

    assert {r.name: r.action for r in rows} == {
        "base": "reused", "postgres": "reused", "redis": "built", "mariadb": "reused", "python": "reused",
    }  # fmt: skip
    builds = [c for c in fake.calls if c.argv[:2] == ("docker", "build")]
    assert [c.argv for c in builds] == [build_argv(recipes, "redis", BUILT_BASE)]
    assert builds[0].timeout == BUILD_TIMEOUT
    assert ("docker", "image", "rm", "sha256:old") in fake.argvs()


def test_a_hand_built_image_without_the_label_is_rebuilt(recipes: Path) -> None:
    fake = FakeRunner()
    script_base(fake, recipes)
    for name, s in STAND_INS.items():
        fake.expect(*inspect(s.tag), exact=True, stdout=found(f"sha256:{name}", None), times=1)
        fake.expect(*build_argv(recipes, name, BUILT_BASE), exact=True)
        fake.expect(*inspect(s.tag), exact=True, stdout=found(f"sha256:{name}2", {}))
    fake.expect("docker", "image", "rm", exact=False)
    fake.expect("docker", "image", "ls", stdout="")

    rows = ensure_images(fake, jobs=1, say=lambda _: None)

    assert [r.why for r in rows[1:]] == ["no content-hash label (built by hand?)"] * len(STAND_INS)


def test_official_slim_base_is_used_when_present(recipes: Path) -> None:
    fake = FakeRunner()
    fake.expect(*inspect(OFFICIAL_BASE), exact=True, stdout=found("sha256:slim", None))
    for name, s in STAND_INS.items():
        fake.expect(*inspect(s.tag), exact=True, rc=1, times=1)
        fake.expect(*build_argv(recipes, name, OFFICIAL_BASE, "sha256:slim"), exact=True)
        fake.expect(*inspect(s.tag), exact=True, stdout=found(f"sha256:{name}", {}))
    fake.expect("docker", "image", "ls", stdout="")

    rows = ensure_images(fake, jobs=1, say=lambda _: None)

    assert rows[0].action == "present" and rows[0].tag == OFFICIAL_BASE
    assert [r.why for r in rows[1:]] == ["not built yet"] * len(STAND_INS)
    assert not any(c.argv[:2] == ("docker", "pull") for c in fake.calls)


def test_no_base_anywhere_pulls_then_debootstraps(recipes: Path) -> None:
    script = recipes.parent / "scripts" / "build-base.sh"
    fake = FakeRunner()
    fake.expect(*inspect(OFFICIAL_BASE), exact=True, rc=1)
    fake.expect(*inspect(BUILT_BASE), exact=True, rc=1, times=1)
    fake.expect(
        "docker", "pull", "--quiet", OFFICIAL_BASE, exact=True, rc=1, stderr="dial tcp: lookup: no such host"
    )
    debootstrap = ("bash", str(script), BUILT_BASE, f"{HASH_LABEL}={base_hash(script)}")
    fake.expect(*debootstrap, exact=True)
    fake.expect(*inspect(BUILT_BASE), exact=True, stdout=found(BASE_ID, {HASH_LABEL: base_hash(script)}))
    current(fake, recipes, *STAND_INS)
    fake.expect("docker", "image", "ls", stdout="")

    rows = ensure_images(fake, jobs=1, say=lambda _: None)

    assert rows[0].action == "built" and "neither local nor pullable" in rows[0].why
    assert debootstrap in fake.argvs()


def test_force_rebuilds_even_when_current(recipes: Path) -> None:
    script = recipes.parent / "scripts" / "build-base.sh"
    fake = FakeRunner()
    fake.expect(*inspect(OFFICIAL_BASE), exact=True, rc=1)
    fake.expect(*inspect(BUILT_BASE), exact=True, stdout=found(BASE_ID, {HASH_LABEL: base_hash(script)}))
    fake.expect("bash", str(script), exact=False)
    for name, s in STAND_INS.items():
        fake.expect(*inspect(s.tag), exact=True, stdout=found(f"sha256:{name}", {}))
        fake.expect(*build_argv(recipes, name, BUILT_BASE), exact=True)
    fake.expect("docker", "image", "ls", stdout="")

    rows = ensure_images(fake, force=True, jobs=1, say=lambda _: None)

    assert {r.action for r in rows} == {"built"}
    assert {r.why for r in rows} == {"--force"}


def test_a_failed_build_names_the_image_and_carries_the_output(recipes: Path) -> None:
    fake = FakeRunner()
    script_base(fake, recipes)
    for name, s in STAND_INS.items():
        fake.expect(*inspect(s.tag), exact=True, rc=1)
        rc = 100 if name == "python" else 0
        fake.expect(
            *build_argv(recipes, name, BUILT_BASE), exact=True, rc=rc, stdout="E: Unable to locate package"
        )

    with pytest.raises(ImageError, match=r"building forgelib/python:3.11 from .* failed") as err:
        ensure_images(fake, jobs=1, say=lambda _: None)
    assert "Unable to locate package" in str(err.value)


def test_recipe_hash_follows_content_exec_bit_and_base(recipes: Path) -> None:
    redis = recipes / "redis"
    first = recipe_hash(redis, BASE_ID)
    assert recipe_hash(redis, BASE_ID) == first
    assert recipe_hash(redis, "sha256:other") != first
    entry = redis / "docker-entrypoint.sh"
    entry.write_text('#!/bin/sh\nexec "$@"\n')
    with_entry = recipe_hash(redis, BASE_ID)
    assert with_entry != first
    entry.chmod(0o755)
    assert recipe_hash(redis, BASE_ID) != with_entry


LS = (
    "docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}",
    "--filter", "reference=forgelib/postgres:15",
    "--filter", "reference=forgelib/redis:7.0",
    "--filter", "reference=forgelib/mariadb:10.11",
    "--filter", "reference=forgelib/python:3.11",
)  # fmt: skip


def test_image_env_maps_existing_stand_ins_not_set_by_the_user(recipes: Path) -> None:
    fake = FakeRunner()
    fake.expect(*LS, exact=True, stdout="forgelib/postgres:15\nforgelib/redis:7.0\n")

    facts = ImageFacts()
    env = facts.env(fake, {"FORGE_IMAGE_REDIS": "redis:7-alpine"})

    assert env == {"FORGE_IMAGE_POSTGRES": "forgelib/postgres:15"}  # python missing, redis chosen by the user
    assert facts.env(fake, {}) == {
        "FORGE_IMAGE_POSTGRES": "forgelib/postgres:15",
        "FORGE_IMAGE_REDIS": "forgelib/redis:7.0",
    }
    assert fake.argvs() == [LS]  # asked once per owner
    ImageFacts().env(fake, {})
    assert fake.argvs() == [LS, LS]  # another owner (another run) asks for itself


def test_image_env_reads_os_environ_by_default(recipes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRunner()
    fake.expect(*LS, exact=True, stdout="forgelib/postgres:15\nforgelib/redis:7.0\nforgelib/python:3.11\n")
    monkeypatch.setenv("FORGE_IMAGE_PYTHON", "my/python:dev")
    monkeypatch.delenv("FORGE_IMAGE_POSTGRES", raising=False)
    monkeypatch.setenv("FORGE_IMAGE_REDIS", "")  # set but empty: compose's ${VAR:-default} ignores it too

    assert ImageFacts().env(fake) == {
        "FORGE_IMAGE_POSTGRES": "forgelib/postgres:15",
        "FORGE_IMAGE_REDIS": "forgelib/redis:7.0",
    }


def test_image_env_without_an_engine_is_empty_and_asks_again_later(recipes: Path) -> None:
    fake = FakeRunner()
    fake.expect(*LS, exact=True, rc=1, stderr="Cannot connect to the Docker daemon", times=1)
    fake.expect(*LS, exact=True, stdout="forgelib/redis:7.0\n")

    facts = ImageFacts()
    assert facts.env(fake, {}) == {}
    assert facts.env(fake, {}) == {"FORGE_IMAGE_REDIS": "forgelib/redis:7.0"}


def test_ensure_images_primes_image_env(recipes: Path) -> None:
    fake = FakeRunner()
    script_base(fake, recipes)
    current(fake, recipes, *STAND_INS)
    facts = ImageFacts()
    ensure_images(fake, jobs=1, say=lambda _: None, facts=facts)
    calls = len(fake.calls)

    assert facts.env(fake, {}) == {s.var: s.tag for s in STAND_INS.values()}
    assert len(fake.calls) == calls  # no `docker image ls`: ensure_images just made them
