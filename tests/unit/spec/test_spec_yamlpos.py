"""YAML with positions: line/col per JSON path, YAML 1.2 scalars, problems as issues (never tracebacks)."""

from __future__ import annotations

from pathlib import Path

from forgelib.spec.yamlpos import Mark, json_path, load_yaml

TEXT = """\
base: &base {image: x, ports: ["22:22"]}
svc:
  <<: *base
  image: y            # explicit keys win over merged ones
  flags: [on, yes, 017, 0o17, 0x1f, 1e3, .inf, 2024-01-01, ~, true, ""]
"""


def test_positions_by_json_path() -> None:
    doc, issues = load_yaml(Path("f.yaml"), text=TEXT)
    assert issues == []
    assert doc.values[("svc", "image")] == Mark(4, 10)
    assert doc.keys[("svc", "image")] == Mark(4, 3)
    assert doc.values[("svc", "flags", 2)] == Mark(5, 20)
    # A path that does not exist falls back to its nearest ancestor.
    assert doc.mark(("svc", "flags", 99)) == Mark(5, 10)
    issue = doc.issue(("svc", "image"), "msg")
    assert str(issue) == "f.yaml:4:10: $.svc.image: msg"


def test_yaml_1_2_scalars_and_merge_keys() -> None:
    doc, _ = load_yaml(Path("f.yaml"), text=TEXT)
    svc = doc.data["svc"]
    assert svc["image"] == "y" and svc["ports"] == ["22:22"]
    assert svc["flags"][:8] == ["on", "yes", 17, 15, 31, 1000.0, float("inf"), "2024-01-01"]
    assert svc["flags"][8:] == [None, True, ""]


def test_keys_are_strings() -> None:
    doc, _ = load_yaml(Path("f.yaml"), text="1: a\ntrue: b\n~: c\n")
    assert doc.data == {"1": "a", "true": "b", "null": "c"}


def test_malformed_yaml_is_an_issue_with_a_position() -> None:
    doc, issues = load_yaml(Path("f.yaml"), text="a: [1, 2\nb: 3\n")
    (issue,) = issues
    assert (issue.line, issue.json_path) == (2, "$") and "invalid YAML" in issue.message
    assert doc.data is None


def test_duplicate_keys_are_reported_where_the_second_one_is() -> None:
    _, issues = load_yaml(Path("f.yaml"), text="a: 1\nb:\n  c: 1\n  c: 2\n")
    (issue,) = issues
    assert (issue.line, issue.col, issue.json_path) == (4, 3, "$.b.c") and "first at line 3" in issue.message


def test_recursive_alias_is_an_issue() -> None:
    _, issues = load_yaml(Path("f.yaml"), text="a: &x\n  b: *x\n")
    assert any("recursive" in i.message for i in issues)


def test_unreadable_files_are_issues(tmp_path: Path) -> None:
    _, issues = load_yaml(tmp_path / "missing.yaml")
    assert issues[0].message == "file not found"
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    _, issues = load_yaml(tmp_path / "bin.yaml")
    assert "cannot read" in issues[0].message


def test_empty_file_is_none() -> None:
    doc, issues = load_yaml(Path("f.yaml"), text="# only a comment\n")
    assert doc.data is None and issues == []


def test_json_path_rendering() -> None:
    assert json_path(()) == "$"
    assert json_path(("checks", 0, "file")) == "$.checks[0].file"
    assert json_path(("services", "app-db", "a.b", 'q"')) == '$.services.app-db["a.b"]["q\\""]'


def test_alias_explosion_is_refused_quickly() -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    doc, issues = load_yaml(Path("f.yaml"), text="\n".join(lines) + "\n")
    assert doc.data is None and "aliases" in issues[0].message
