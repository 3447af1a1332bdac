"""``forge stamp``: compute seed digests and write them into project.yaml, changing nothing else.

PyYAML composes the file into nodes that carry exact start/end offsets; the new digests (and the full
form of shorthand entries) are spliced into the original text at those offsets. Every byte outside the
changed values -- comments, key order, quoting, flow style, indentation, blank lines -- is the author's.
The result is parsed again and compared with what was intended before anything is written.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml import YAMLError

from forgelib.errors import ForgeError, SpecError, SpecIssue
from forgelib.spec.digest import DigestError, seed_digest
from forgelib.spec.loader import load_project_seeds, project_file, stamp_command
from forgelib.spec.rules import SeedSpec
from forgelib.spec.yamlpos import YamlDoc, clip, display_path, load_yaml


@dataclass(frozen=True)
class SeedStamp:
    name: str
    declared: str | None
    actual: str
    shorthand: bool
    kind: str

    @property
    def needed(self) -> bool:
        return self.shorthand or self.declared != self.actual


def compute(doc: YamlDoc, seeds: Mapping[str, SeedSpec]) -> list[SeedStamp]:
    """The actual digest of every seed; raises SpecError (all of them) for seeds that cannot be digested."""
    out, issues = [], []
    for spec in seeds.values():
        assert spec.path is not None and spec.kind is not None  # load_project_seeds refused otherwise
        try:
            actual = seed_digest(spec.path, spec.kind)
        except DigestError as e:
            issues.append(doc.issue(spec.json_path, str(e)))
            continue
        out.append(SeedStamp(spec.name, spec.declared, actual, spec.shorthand, spec.kind.value))
    if issues:
        raise SpecError(issues)
    return out


@dataclass(frozen=True)
class _Edit:
    start: int
    end: int
    text: str


def _child(node: Any, key: str) -> Any:
    for k, v in getattr(node, "value", ()):
        if getattr(k, "value", None) == key:
            return k, v
    return None


def _line_end(text: str, index: int) -> int:
    """Where to insert a new line after the line holding ``index`` (before its line break)."""
    eol = text.find("\n", index)
    if eol == -1:
        return len(text)
    return eol - 1 if eol > 0 and text[eol - 1] == "\r" else eol


def _quoted(digest: str, style: str | None) -> str:
    if style == "'":
        return f"'{digest}'"
    if style is None:
        return digest
    return f'"{digest}"'


def stamp_text(text: str, stamps: Sequence[SeedStamp]) -> str:
    """``text`` (a project.yaml) with every needed stamp applied; nothing else changes."""
    nl = "\r\n" if "\r\n" in text else "\n"
    root = yaml.compose(text, Loader=yaml.SafeLoader)  # nodes with exact offsets: all stamp needs
    assets = _child(root, "assets")
    seeds = _child(assets[1], "seeds") if assets else None
    if seeds is None:
        return text
    seeds_key, seeds_node = seeds
    first_col = (
        seeds_node.value[0][0].start_mark.column if seeds_node.value else seeds_key.start_mark.column + 2
    )
    step = max(first_col - seeds_key.start_mark.column, 2)
    wanted = {s.name: s for s in stamps if s.needed}
    edits: list[_Edit] = []
    for knode, vnode in seeds_node.value:
        st = wanted.get(knode.value)
        if st is None:
            continue
        if st.shorthand:
            edits.extend(
                _expand(text, knode, vnode, st, seeds_node.flow_style, knode.start_mark.column + step, nl)
            )
        else:
            edits.extend(_restamp(text, vnode, st, nl))
    for e in sorted(edits, key=lambda e: (e.start, e.end), reverse=True):
        text = text[: e.start] + e.text + text[e.end :]
    return text


def _expand(
    text: str, knode: Any, vnode: Any, st: SeedStamp, flow: bool, indent: int, nl: str
) -> list[_Edit]:
    """Shorthand ``name: ./x.sql`` -> the full form, block style unless the seeds mapping is flow style."""
    start, end = vnode.start_mark.index, vnode.end_mark.index
    raw = text[start:end]
    colon = text.index(":", knode.end_mark.index)
    if flow or "\n" in text[colon:end]:
        return [_Edit(start, end, f'{{path: {raw}, kind: {st.kind}, digest: "{st.actual}"}}')]
    pad = " " * indent
    lines = [f"{pad}path: {raw}", f"{pad}kind: {st.kind}", f'{pad}digest: "{st.actual}"']
    # Drop the value but keep whatever follows it on the line (a comment stays on the seed's key line).
    eol = _line_end(text, end)
    return [_Edit(colon + 1, end, ""), _Edit(eol, eol, "".join(nl + ln for ln in lines))]


def _restamp(text: str, vnode: Any, st: SeedStamp, nl: str) -> list[_Edit]:
    found = _child(vnode, "digest")
    if found is not None:
        dkey, dval = found
        if dval.tag.endswith(":null"):
            # An empty value's marks point at the next line, so replace from the colon instead.
            colon = text.index(":", dkey.end_mark.index)
            span_end = dval.end_mark.index if dval.value else colon + 1
            return [_Edit(colon + 1, span_end, f' "{st.actual}"')]
        if dval.style in ("|", ">"):
            raise ForgeError(
                f"seed {st.name!r}: write its digest as a one-line scalar so stamp can replace it"
            )
        return [_Edit(dval.start_mark.index, dval.end_mark.index, _quoted(st.actual, dval.style))]
    last = vnode.value[-1][1]
    if vnode.flow_style:
        return [_Edit(last.end_mark.index, last.end_mark.index, f', digest: "{st.actual}"')]
    pad = " " * vnode.value[0][0].start_mark.column
    eol = _line_end(text, last.end_mark.index)
    return [_Edit(eol, eol, f'{nl}{pad}digest: "{st.actual}"')]


def _verify(path: Path, before: YamlDoc, after_text: str, stamps: Sequence[SeedStamp]) -> None:
    """The stamped text must parse to the old data with exactly the intended seed entries changed."""
    after, issues = load_yaml(path, text=after_text)
    expected = dict(before.data)
    seeds = dict(expected["assets"]["seeds"])
    for st in stamps:
        if st.needed:
            old = seeds[st.name]
            old_path = old if isinstance(old, str) else old["path"]
            seeds[st.name] = {"path": old_path, "kind": st.kind, "digest": st.actual}
    expected["assets"] = {**expected["assets"], "seeds": seeds}
    if issues or after.data != expected:
        raise RuntimeError(
            f"stamping {path} would change more than the digests (a bug in forgelib); nothing was written"
        )


def _write(path: Path, text: str) -> None:
    """Atomically: a crash leaves the old file or the new one, never half of each."""
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
        Path(tmp).chmod(mode)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _stale_issues(
    doc: YamlDoc, seeds: Mapping[str, SeedSpec], stamps: Sequence[SeedStamp]
) -> list[SpecIssue]:
    issues = []
    root = doc.file.parent
    for st in stamps:
        if not st.needed:
            continue
        at = seeds[st.name].json_path
        if st.shorthand:
            msg = f"seed {st.name!r} is in shorthand form and has no digest (actual {st.actual})"
        elif not st.declared:
            msg = f"seed {st.name!r} has no digest (actual {st.actual})"
            at = (*at, "digest")
        else:
            declared = clip(st.declared, quote=False)
            msg = f"seed {st.name!r} digest is stale: declared {declared}, actual {st.actual}"
            at = (*at, "digest")
        issues.append(doc.issue(at, f"{msg}; {stamp_command(root)}"))
    return issues


def _count(stamps: Sequence[SeedStamp]) -> str:
    return f"{len(stamps)} seed digest{'s' if len(stamps) != 1 else ''}"


def main_stamp(project: str, check: bool) -> int:
    """``forge stamp``: write digests (or, with ``check``, only report stale/missing ones and exit 1)."""
    pfile = project_file(project)
    doc, seeds = load_project_seeds(pfile)
    stamps = compute(doc, seeds)
    needed = [s for s in stamps if s.needed]
    shown = display_path(pfile)
    if check:
        if needed:
            raise SpecError(_stale_issues(doc, seeds, stamps))
        print(f"OK: {_count(stamps)} in {shown} up to date")
        return 0
    if not needed:
        print(f"nothing to stamp: {_count(stamps)} in {shown} up to date")
        return 0
    text = pfile.read_bytes().decode("utf-8")
    try:
        new_text = stamp_text(text, stamps)
    except YAMLError as e:  # pragma: no cover - load_project_seeds parsed the same text already
        raise ForgeError(f"{shown}: cannot parse for stamping: {e}") from None
    _verify(pfile, doc, new_text, stamps)
    _write(pfile, new_text)
    for st in needed:
        was = (
            "shorthand -> full form"
            if st.shorthand
            else f"was {clip(st.declared, quote=False) if st.declared else 'missing'}"
        )
        print(f"stamped {st.name}: {st.actual} ({was})")
    print(f"{shown}: {len(needed)} of {len(stamps)} seed digests written")
    return 0


def stamp_in_place(pfile: Path) -> list[SeedStamp]:
    """Write every missing or stale seed digest into ``pfile``, as ``forge stamp`` does but printing
    nothing (``forge init``); returns the stamps it wrote."""
    doc, seeds = load_project_seeds(pfile)
    stamps = compute(doc, seeds)
    needed = [s for s in stamps if s.needed]
    if needed:
        new_text = stamp_text(pfile.read_bytes().decode("utf-8"), stamps)
        _verify(pfile, doc, new_text, stamps)
        _write(pfile, new_text)
    return needed
