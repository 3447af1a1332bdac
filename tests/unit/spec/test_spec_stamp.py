"""``forge stamp``: digests written, shorthand expanded, every other byte of project.yaml kept."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from forgelib.errors import SpecError
from forgelib.spec.loader import load_project_config
from forgelib.spec.stamp import main_stamp

from ._support import edit

COMPOSE = "services:\n  db: {image: postgres}\n  cache: {image: redis}\n"
OLD = "sha256:" + "0" * 64


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "assets" / "site").mkdir(parents=True)
    (tmp_path / "assets" / "base.sql").write_bytes(b"select 1;\n")
    (tmp_path / "assets" / "cache.rdb").write_bytes(b"REDIS0009")
    (tmp_path / "assets" / "other.sql").write_bytes(b"select 2;\n")
    (tmp_path / "assets" / "site" / "index.html").write_bytes(b"<p>hi</p>\n")
    (tmp_path / "compose.yaml").write_text(COMPOSE)
    return tmp_path


SOURCE = f"""\
# Leading comment, kept.
name:   spaced_out        # odd spacing after the colon, kept
description: 'single quoted'
assets:
    seeds:   # four-space indentation, kept
        base:
            path: ./assets/base.sql
            kind: sql_dump
            digest: "{OLD}"   # stale, double quoted
        cache: ./assets/cache.rdb     # shorthand with a comment
        other: "./assets/other.sql"
        flowed: {{ path: ./assets/base.sql, kind: sql_dump }}
        site:
            path: assets/site
            kind: filesystem_dir

        nulled:
            path: ./assets/other.sql
            kind: bare
            digest:
default_environment:
    compose_file: compose.yaml
    services:
        db: {{ isolation: reset, reset: {{ seed: base, user: postgres }} }}
        cache: {{isolation: reset, reset: {{seed: cache}}}}
"""


def test_stamp_changes_only_the_digests_byte_for_byte(project: Path) -> None:
    pfile = project / "project.yaml"
    pfile.write_text(SOURCE)
    assert main_stamp(str(project), check=False) == 0
    base, cache = _sha(b"select 1;\n"), _sha(b"REDIS0009")
    other = _sha(b"select 2;\n")
    site = load_project_config(project).seeds["site"].digest
    assert (
        pfile.read_text()
        == f"""\
# Leading comment, kept.
name:   spaced_out        # odd spacing after the colon, kept
description: 'single quoted'
assets:
    seeds:   # four-space indentation, kept
        base:
            path: ./assets/base.sql
            kind: sql_dump
            digest: "{base}"   # stale, double quoted
        cache:     # shorthand with a comment
            path: ./assets/cache.rdb
            kind: redis_dump
            digest: "{cache}"
        other:
            path: "./assets/other.sql"
            kind: sql_dump
            digest: "{other}"
        flowed: {{ path: ./assets/base.sql, kind: sql_dump, digest: "{base}" }}
        site:
            path: assets/site
            kind: filesystem_dir
            digest: "{site}"

        nulled:
            path: ./assets/other.sql
            kind: bare
            digest: "{other}"
default_environment:
    compose_file: compose.yaml
    services:
        db: {{ isolation: reset, reset: {{ seed: base, user: postgres }} }}
        cache: {{isolation: reset, reset: {{seed: cache}}}}
"""
    )
    # Stamping again is a no-op, and the result loads with every digest verified.
    before = pfile.read_bytes()
    assert main_stamp(str(project), check=False) == 0
    assert pfile.read_bytes() == before
    assert main_stamp(str(project), check=True) == 0


def test_flow_style_seeds_and_plain_or_single_quoted_digests_keep_their_style(project: Path) -> None:
    pfile = project / "project.yaml"
    pfile.write_bytes(
        (
            "name: p\r\n"
            "assets:\r\n"
            "  seeds: {a: ./assets/base.sql, "
            f"b: {{path: ./assets/cache.rdb, kind: redis_dump, digest: '{OLD}'}},\r\n"
            f"          c: {{path: ./assets/other.sql, kind: sql_dump, digest: {OLD}}}}}\r\n"
            "default_environment: {compose_file: compose.yaml}\r\n"
        ).encode()
    )
    main_stamp(str(project), check=False)
    a, b, c = _sha(b"select 1;\n"), _sha(b"REDIS0009"), _sha(b"select 2;\n")
    assert (
        pfile.read_bytes()
        == (
            "name: p\r\n"
            "assets:\r\n"
            f'  seeds: {{a: {{path: ./assets/base.sql, kind: sql_dump, digest: "{a}"}}, '
            f"b: {{path: ./assets/cache.rdb, kind: redis_dump, digest: '{b}'}},\r\n"
            f"          c: {{path: ./assets/other.sql, kind: sql_dump, digest: {c}}}}}\r\n"
            "default_environment: {compose_file: compose.yaml}\r\n"
        ).encode()
    )


def test_check_writes_nothing_and_lists_every_stale_or_missing_digest(project: Path) -> None:
    pfile = project / "project.yaml"
    pfile.write_text(SOURCE)
    with pytest.raises(SpecError) as info:
        main_stamp(str(project), check=True)
    assert pfile.read_text() == SOURCE
    by_path = {i.json_path: i for i in info.value.issues}
    assert set(by_path) == {
        "$.assets.seeds.base.digest",
        "$.assets.seeds.cache",
        "$.assets.seeds.other",
        "$.assets.seeds.flowed.digest",
        "$.assets.seeds.site.digest",
        "$.assets.seeds.nulled.digest",
    }
    assert by_path["$.assets.seeds.base.digest"].line == 9
    assert "stale: declared " + OLD in by_path["$.assets.seeds.base.digest"].message
    assert "shorthand" in by_path["$.assets.seeds.cache"].message
    assert all("forge stamp" in i.message for i in info.value.issues)


def test_stamp_works_while_the_rest_of_the_project_is_broken(project: Path) -> None:
    (project / "project.yaml").write_text(
        "name: p\nassets:\n  seeds:\n    a: ./assets/base.sql\n"
        "default_environment:\n  compose_file: missing.yaml\n  services: {ghost: {isolation: reset}}\n"
    )
    assert main_stamp(str(project), check=False) == 0
    assert _sha(b"select 1;\n") in (project / "project.yaml").read_text()


def test_stamp_refuses_a_spec_it_cannot_read(project: Path) -> None:
    (project / "project.yaml").write_text("name: p\nassets:\n  seeds:\n    a: ./assets/missing.sql\n")
    with pytest.raises(SpecError) as info:
        main_stamp(str(project), check=False)
    assert {i.json_path for i in info.value.issues} >= {"$", "$.assets.seeds.a"}


def test_stamped_fixture_stays_valid(basic: Path) -> None:
    edit(basic / "assets/files/hello.txt", "hello", "HELLO")
    with pytest.raises(SpecError, match="site_files"):
        load_project_config(basic)
    main_stamp(str(basic), check=False)
    assert load_project_config(basic).name == "basic"
