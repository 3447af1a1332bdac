"""An environment's compose files as written, with the position of every value, for checks at validate.

``docker compose config`` is the truth about what a stack resolves to, but it needs an engine and forgets
where each value was written. Validation needs neither, so this reads the files the way compose combines
them, far enough to know which services exist and what each service says, and where: the files of
``compose_file`` in order (a later file overrides keys of an earlier one, and appends to ``ports`` and
``volumes``), each file's ``include:`` (read before the file itself), and ``extends:`` (the base service's
keys under the service's own). Interpolation (``${VAR}``) is left as written.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forgelib.errors import SpecIssue
from forgelib.spec.yamlpos import JsonPath, YamlDoc, clip, load_yaml

# Keys whose items accumulate across override files (compose merges them by item, not by replacing).
LIST_KEYS = frozenset({"ports", "volumes", "expose"})
_MAX_DEPTH = 10  # include/extends chains deeper than this are a loop or a mistake


@dataclass(frozen=True)
class Written:
    """One value and where it was written."""

    value: Any
    doc: YamlDoc
    at: JsonPath

    def issue(self, message: str, *, severity: str = "error") -> SpecIssue:
        base = self.doc.issue(self.at, message)
        return SpecIssue(base.file, base.line, base.col, base.json_path, message, severity)


@dataclass
class ServiceDef:
    name: str
    defined: Written  # the service's first mapping
    keys: dict[str, list[Written]] = field(default_factory=dict)

    def last(self, key: str) -> Written | None:
        """The value that wins for a scalar/mapping key (the last file to write it)."""
        found = self.keys.get(key)
        return found[-1] if found else None

    def items(self, key: str) -> Iterator[Written]:
        """Every item of a list key (``ports``, ``volumes``), across the files that add to it."""
        for w in self.keys.get(key, ()):
            if isinstance(w.value, list):
                for i, item in enumerate(w.value):
                    yield Written(item, w.doc, (*w.at, i))

    def data(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, ws in self.keys.items():
            if key in LIST_KEYS and all(isinstance(w.value, list) for w in ws):
                out[key] = [item for w in ws for item in w.value]
            elif len(ws) > 1 and all(isinstance(w.value, dict) for w in ws):
                out[key] = {k: v for w in ws for k, v in w.value.items()}  # environment, labels: merged
            else:
                out[key] = ws[-1].value
        return out


@dataclass
class ComposeSet:
    """What an environment's compose files define, merged as compose merges them."""

    files: tuple[Path, ...]
    services: dict[str, ServiceDef] = field(default_factory=dict)
    volumes: dict[str, Written] = field(default_factory=dict)
    networks: dict[str, Written] = field(default_factory=dict)
    primary: YamlDoc | None = None
    issues: list[SpecIssue] = field(default_factory=list)

    def data(self) -> dict[str, Any]:
        """Plain data in compose's shape (``services``, ``volumes``, ``networks``; the primary file's other
        top-level keys), for readers of ``EnvironmentManifest.compose``."""
        out: dict[str, Any] = (
            dict(self.primary.data) if self.primary and isinstance(self.primary.data, dict) else {}
        )
        out["services"] = {n: s.data() for n, s in self.services.items()}
        if self.volumes:
            out["volumes"] = {n: w.value for n, w in self.volumes.items()}
        if self.networks:
            out["networks"] = {n: w.value for n, w in self.networks.items()}
        out.pop("include", None)
        return out


def load_compose_set(files: Sequence[Path]) -> ComposeSet:
    """Read ``files`` (absolute) and what they include; problems are in ``.issues`` (nothing raises)."""
    loader = _Loader(ComposeSet(tuple(files)))
    for f in files:
        loader.file(f, depth=0)
    if not loader.out.issues:
        loader.resolve_extends()
    return loader.out


class _Loader:
    def __init__(self, out: ComposeSet) -> None:
        self.out = out
        self._docs: dict[Path, YamlDoc | None] = {}
        self._loading: set[Path] = set()

    def _doc(self, path: Path) -> YamlDoc | None:
        if path not in self._docs:
            doc, issues = load_yaml(path)
            self.out.issues.extend(issues)
            if not issues and not isinstance(doc.data, dict):
                self.out.issues.append(doc.issue((), "a compose file must be a mapping with a services: key"))
            self._docs[path] = doc if not issues and isinstance(doc.data, dict) else None
        return self._docs[path]

    def file(self, path: Path, *, depth: int, via: Written | None = None) -> None:
        if path in self._loading or depth > _MAX_DEPTH:
            if via is not None:
                self.out.issues.append(via.issue(f"{clip(str(path))} includes itself (an include loop)"))
            return
        if via is not None and not path.is_file():
            self.out.issues.append(
                via.issue(f"included file {clip(via.value)} not found (relative to {via.doc.display})")
            )
            return
        doc = self._doc(path)
        if doc is None:
            return
        if self.out.primary is None:
            self.out.primary = doc
        self._loading.add(path)
        try:
            for w in _includes(doc):
                self.file((path.parent / str(w.value)).resolve(), depth=depth + 1, via=w)
        finally:
            self._loading.discard(path)
        self._add(doc)

    def _add(self, doc: YamlDoc) -> None:
        services = doc.data.get("services")
        if services is not None and not isinstance(services, dict):
            self.out.issues.append(doc.issue(("services",), "services: must be a mapping of service names"))
            return
        for name, svc in (services or {}).items():
            at: JsonPath = ("services", name)
            if not isinstance(svc, dict):
                self.out.issues.append(doc.issue(at, f"service {name!r} must be a mapping"))
                continue
            sdef = self.out.services.setdefault(name, ServiceDef(name, Written(svc, doc, at)))
            for key, value in svc.items():
                w = Written(value, doc, (*at, key))
                if (key in LIST_KEYS and isinstance(value, list)) or isinstance(value, dict):
                    sdef.keys.setdefault(key, []).append(w)
                else:
                    sdef.keys[key] = [w]
        for top, table in (("volumes", self.out.volumes), ("networks", self.out.networks)):
            for name, spec in (doc.get((top,)) or {}).items() if isinstance(doc.get((top,)), dict) else ():
                table[name] = Written(spec or {}, doc, (top, name))

    def resolve_extends(self) -> None:
        for sdef in list(self.out.services.values()):
            self._extend(sdef, depth=0)

    def _extend(self, sdef: ServiceDef, depth: int) -> None:
        ext = sdef.last("extends")
        if ext is None:
            return
        del sdef.keys["extends"]
        spec = ext.value
        base_name = spec if isinstance(spec, str) else spec.get("service") if isinstance(spec, dict) else None
        other = spec.get("file") if isinstance(spec, dict) else None
        if not isinstance(base_name, str):
            self.out.issues.append(
                ext.issue("extends needs a service name: extends: {service: NAME[, file: PATH]}")
            )
            return
        if depth > _MAX_DEPTH:
            self.out.issues.append(ext.issue("extends chain too deep (a loop?)"))
            return
        if other is None:
            base = self.out.services.get(base_name)
            if base is None or base is sdef:
                self.out.issues.append(
                    ext.issue(f"extends names service {base_name!r}, which is not defined")
                )
                return
            self._extend(base, depth + 1)
        else:
            path = (ext.doc.file.parent / str(other)).resolve()
            doc = self._doc(path) if path.is_file() else None
            svc = doc.get(("services", base_name)) if doc is not None else None
            if doc is None or not isinstance(svc, dict):
                where = f"{clip(str(other))}" + ("" if doc is None else f" has no service {base_name!r}")
                self.out.issues.append(
                    ext.issue(f"extends: cannot find {where}" if doc else f"extends: file {where} not found")
                )
                return
            base = ServiceDef(base_name, Written(svc, doc, ("services", base_name)))
            base.keys = {k: [Written(v, doc, ("services", base_name, k))] for k, v in svc.items()}
            self._extend(base, depth + 1)
        merged = {k: list(v) for k, v in base.keys.items()}
        for key, ws in sdef.keys.items():
            accumulates = key in LIST_KEYS or all(isinstance(w.value, dict) for w in ws)
            merged[key] = [*merged.get(key, []), *ws] if accumulates else ws
        sdef.keys = merged


def _includes(doc: YamlDoc) -> Iterator[Written]:
    """Every path ``include:`` names (short form, ``path:`` as a string or a list)."""
    entries = doc.get(("include",))
    if not isinstance(entries, list):
        return
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            yield Written(entry, doc, ("include", i))
        elif isinstance(entry, dict):
            path = entry.get("path")
            if isinstance(path, str):
                yield Written(path, doc, ("include", i, "path"))
            elif isinstance(path, list):
                for j, p in enumerate(path):
                    yield Written(p, doc, ("include", i, "path", j))
