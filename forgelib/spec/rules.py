"""The rules a JSON Schema cannot express: cross-references, files on disk, and combinations of fields.

Each runs on data that already passed its schema, and returns located ``SpecIssue``s whose message names the
fix. Nothing here raises for a user error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import SpecIssue
from forgelib.kinds import CHECK_TYPES as KIND_CHECK_TYPES
from forgelib.kinds import DIRECTORY_SEEDS, SHORTHAND
from forgelib.kinds import registry as kinds
from forgelib.kinds.base import no_checkpoint
from forgelib.kinds.registry import REGISTRY
from forgelib.mcp.names import TOOL_ARGUMENTS
from forgelib.spec.composefiles import ComposeSet
from forgelib.spec.digest import walk_tree
from forgelib.spec.models import MATCHERS, Checkpointing, Isolation, ResetBinding, SeedKind
from forgelib.spec.schema import did_you_mean
from forgelib.spec.yamlpos import JsonPath, YamlDoc, clip

SHORTHAND_KINDS = {suffix: SeedKind(kind) for suffix, kind in SHORTHAND.items()}
# The check types: the file check, those the kinds observe, then http and trace.
CHECK_TYPES = ("file", *KIND_CHECK_TYPES, "http", "trace")


def inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def check_project_path(raw: str, base: Path, root: Path, what: str) -> tuple[Path | None, str | None]:
    """Resolve ``raw`` (relative to ``base``) and make sure it stays inside ``root`` (already resolved).

    Returns (resolved path, None) or (None, message). Existence is the caller's business.
    """
    candidate = base / raw  # an absolute raw replaces base
    lexical = Path(os.path.normpath(candidate))
    if not inside(lexical, root):
        return None, f"{what} {clip(raw)} is outside the project directory {root}; keep it inside the project"
    resolved = candidate.resolve()
    if not inside(resolved, root):
        return None, (
            f"{what} {clip(raw)} leads outside the project through a symlink (to {resolved}); "
            "copy the file into the project instead"
        )
    return resolved, None


@dataclass(frozen=True)
class SeedSpec:
    """A seed entry as written, after its own checks; ``path``/``kind`` are None when they failed."""

    name: str
    json_path: JsonPath
    raw_path: str
    kind: SeedKind | None
    path: Path | None
    declared: str | None
    shorthand: bool


def check_seeds(doc: YamlDoc, root: Path) -> tuple[dict[str, SeedSpec], list[SpecIssue]]:
    """Shorthand legality, path containment and type, for every entry of ``assets.seeds``."""
    issues: list[SpecIssue] = []
    seeds: dict[str, SeedSpec] = {}
    for name, entry in (doc.get(("assets", "seeds")) or {}).items():
        at: JsonPath = ("assets", "seeds", name)
        kind: SeedKind | None
        if isinstance(entry, str):
            raw, declared, path_at, shorthand = entry, None, at, True
            kind = SHORTHAND_KINDS.get(Path(entry).suffix.lower())
            if kind is None:
                issues.append(
                    doc.issue(
                        at,
                        f"the shorthand form is only for {' and '.join(SHORTHAND)} files; "
                        "write the full form "
                        f"{{path: {clip(entry)}, kind: {'|'.join(SeedKind)}}}",
                    )
                )
        else:
            raw, declared, path_at, shorthand = entry["path"], entry.get("digest"), (*at, "path"), False
            kind = SeedKind(entry["kind"])
        resolved, problem = check_project_path(raw, root, root, f"seed {name!r} path")
        if problem is None and resolved is not None:
            problem = _seed_type_problem(name, raw, resolved, kind)
            if problem is None and kind in DIRECTORY_SEEDS:
                problem = _escaping_links(name, raw, resolved, root)
        if problem:
            issues.append(doc.issue(path_at, problem))
            resolved = None
        seeds[name] = SeedSpec(name, at, raw, kind, resolved, declared, shorthand)
    return seeds, issues


def _escaping_links(name: str, raw: str, path: Path, root: Path) -> str | None:
    """A directory seed must not carry a symlink that leads out of the project (the copy would carry it, and
    the digest only covers the link text, not what it points at)."""
    out = [
        f"{link.relative_to(path)} -> {link.readlink()}"
        for link in walk_tree(path)
        if link.is_symlink() and not inside(link.resolve(), root)
    ]
    if not out:
        return None
    shown = ", ".join(clip(x) for x in out[:5]) + (f" and {len(out) - 5} more" if len(out) > 5 else "")
    return (
        f"seed {name!r} ({clip(raw)}) holds symlinks leading outside the project: {shown}; "
        "replace them with the files or with links inside the project"
    )


def _seed_type_problem(name: str, raw: str, path: Path, kind: SeedKind | None) -> str | None:
    if not path.exists():
        return f"seed {name!r}: {raw} does not exist; fix the path or add the file"
    if kind in DIRECTORY_SEEDS and not path.is_dir():
        return f"seed {name!r} is kind {kind} but {raw} is not a directory; point it at a directory"
    if kind not in DIRECTORY_SEEDS and not path.is_file():
        shown = kind.value if kind else "file"
        return (
            f"seed {name!r} is kind {shown} but {raw} is not a regular file; "
            f"use kind: {' or '.join(sorted(DIRECTORY_SEEDS))} for a directory"
        )
    return None


@dataclass
class RawEnvironment:
    """An environment manifest after merging, still as written, remembering which file said what."""

    compose_files: tuple[Path, ...]
    compose_at: tuple[YamlDoc, JsonPath]
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    origins: dict[str, list[tuple[YamlDoc, JsonPath]]] = field(default_factory=dict)

    def where(self, name: str, *sub: str) -> tuple[YamlDoc, JsonPath]:
        """The last file that wrote ``services.<name>.<sub...>`` (or, failing that, mentioned the service)."""
        origins = self.origins[name]
        for doc, at in reversed(origins):
            if doc.get((*at, *sub)) is not None:
                return doc, (*at, *sub)
        doc, at = origins[-1]
        return doc, at

    def issue(self, name: str, sub: Sequence[str], message: str, *, key: bool = False) -> SpecIssue:
        doc, at = self.where(name, *sub)
        return doc.issue(at, message, key=key)


def merge_environment(base: RawEnvironment | None, doc: YamlDoc, at: JsonPath) -> RawEnvironment | None:
    """The manifest at ``doc[at]`` over ``base``: its own compose_file replaces the stack (and every label);
    otherwise its services deep-merge into base's. A service the override takes out of ``reset`` isolation
    drops the inherited ``reset`` block (it would only be an error)."""
    manifest = doc.get(at) or {}
    services = manifest.get("services") or {}
    if base is None or "compose_file" in manifest:
        if "compose_file" not in manifest:
            return None
        raw = manifest["compose_file"]
        files = tuple((doc.file.parent / f).resolve() for f in ([raw] if isinstance(raw, str) else raw))
        env = RawEnvironment(files, (doc, (*at, "compose_file")))
    else:
        env = RawEnvironment(
            base.compose_files,
            base.compose_at,
            {k: dict(v) for k, v in base.services.items()},
            {k: list(v) for k, v in base.origins.items()},
        )
    for name, labels in services.items():
        merged = dict(env.services.get(name, {}))
        for key, value in labels.items():
            if key == "reset" and isinstance(merged.get("reset"), dict):
                merged["reset"] = {**merged["reset"], **value}
            else:
                merged[key] = value
        if merged.get("isolation") not in (None, Isolation.RESET.value) and "reset" not in labels:
            merged.pop("reset", None)
        env.services[name] = merged
        env.origins.setdefault(name, []).append((doc, (*at, "services", name)))
    return env


def check_environment(
    env: RawEnvironment, compose: ComposeSet, seeds: Mapping[str, SeedSpec]
) -> list[SpecIssue]:
    """Every labelled service exists in the compose file and has a consistent isolation/reset pair."""
    issues: list[SpecIssue] = []
    services = compose.services
    shown = compose.files[0].name if len(compose.files) == 1 else "the compose files"
    for name, labels in env.services.items():
        if name not in services:
            issues.append(
                env.issue(
                    name,
                    (),
                    f"service {name!r} is not in {shown}{did_you_mean(name, services)}; "
                    f"its services: {', '.join(services)}",
                    key=True,
                )
            )
        isolation = labels.get("isolation")
        reset = labels.get("reset")
        if isolation is None:
            issues.append(env.issue(name, (), "no isolation; add isolation: reset, ephemeral or shared"))
        elif isolation == Isolation.RESET.value:
            if reset is None:
                issues.append(
                    env.issue(
                        name,
                        ("isolation",),
                        "isolation: reset needs the seed to reset from; add reset: {seed: NAME} "
                        f"(seeds: {', '.join(seeds) or 'none declared in assets.seeds'})",
                    )
                )
        elif reset is not None:
            issues.append(
                env.issue(
                    name,
                    ("reset",),
                    f"only isolation: reset services take a reset block, this one is {isolation}; "
                    "remove reset or set isolation: reset",
                    key=True,
                )
            )
        if isolation == Isolation.RESET.value and isinstance(reset, dict):
            issues.extend(_check_reset(env, name, reset, seeds, compose))
        if labels.get("checkpoint") == Checkpointing.CAPTURE.value:
            issues.extend(_check_capture(env, name, isolation, reset, seeds))
    return [*issues, *check_declared_kinds(compose)]


def captures_state(seeds: Mapping[str, SeedSpec], reset: ResetBinding | None) -> bool:
    """Whether a reset service bound to ``reset`` holds state a checkpoint can capture: its seed's kind
    names a directory of the service (``Recipe.checkpoint_path``; a bare seed is a read-only mount)."""
    seed = seeds.get(reset.seed) if reset is not None else None
    return (
        seed is not None
        and seed.kind is not None
        and REGISTRY[seed.kind].checkpoint_path is not no_checkpoint
    )


def _check_capture(
    env: RawEnvironment, name: str, isolation: Any, reset: Any, seeds: Mapping[str, SeedSpec]
) -> list[SpecIssue]:
    """``checkpoint: capture`` only where a kind captures the service exactly: a reset service whose seed
    kind keeps its state in a directory of the service. A container's file system (``docker commit``) or
    its volumes copied as a tree would miss what its process holds in memory and could not be checked by a
    fingerprint, so no other service is captured."""
    if isolation != Isolation.RESET.value:
        capturable = ", ".join(str(k) for k in REGISTRY if REGISTRY[k].checkpoint_path is not no_checkpoint)
        why = (
            f"this service is {isolation or 'ephemeral'}, and forge captures only reset services, by their "
            f"kind (seeds of kind {capturable}): a container's file system or volumes copied as they are "
            "would miss what its process holds in memory, and no fingerprint could prove a fork equal"
        )
        fix = (
            "remove `checkpoint: capture` (a fork starts it fresh from its image), "
            "or give it isolation: reset with a seed"
        )
        return [env.issue(name, ("checkpoint",), f"checkpoint: capture cannot apply: {why}; {fix}")]
    binding = ResetBinding(str(reset["seed"])) if isinstance(reset, dict) and reset.get("seed") else None
    seed = seeds.get(binding.seed) if binding is not None else None
    if seed is not None and seed.kind is not None and not captures_state(seeds, binding):
        return [
            env.issue(
                name,
                ("checkpoint",),
                f"checkpoint: capture cannot apply: seed {seed.name!r} is kind {seed.kind.value}, which "
                "keeps no state in the service to capture (a fork mounts the same seed); "
                "remove `checkpoint: capture`",
            )
        ]
    return []


def _check_reset(
    env: RawEnvironment,
    name: str,
    reset: Mapping[str, Any],
    seeds: Mapping[str, SeedSpec],
    compose: ComposeSet,
) -> list[SpecIssue]:
    seed = seeds.get(reset["seed"])
    if seed is None:
        known = ", ".join(seeds) or "none declared"
        return [
            env.issue(
                name,
                ("reset", "seed"),
                f"reset.seed {reset['seed']!r} is not a seed in assets.seeds"
                f"{did_you_mean(reset['seed'], seeds)} (seeds: {known})",
            )
        ]
    if seed.kind is None:
        return []
    issues = []
    allowed = REGISTRY[seed.kind].OPTIONS  # each recipe owns its options; the schema lists their union
    for option in reset:
        if option != "seed" and option not in allowed:
            can = (
                f"options for {seed.kind.value}: {', '.join(sorted(allowed))}" if allowed else "it takes none"
            )
            issues.append(
                env.issue(
                    name,
                    ("reset", option),
                    f"option {option!r} does not apply to seed {seed.name!r} of kind {seed.kind.value} "
                    f"({can}); remove it",
                    key=True,
                )
            )
    sdef = compose.services.get(name)
    if sdef is None:
        return issues
    svc = service_config(sdef.data(), name)
    kind = kinds.kind_for_seed(seed.kind, svc)
    if kind is None:
        found = kinds.detect(svc)
        fit = ", ".join(s for k in kinds.KINDS if not k.server or k is found for s in k.seeds)
        issues.append(
            env.issue(
                name,
                ("reset", "seed"),
                f"seed {seed.name!r} is kind {seed.kind.value}, but service {name!r} runs "
                f"{found.name if found else '?'}, which takes seeds of kind {fit}; declare the seed with "
                "the kind its file is, or bind it to a service that runs "
                f"{' or '.join(k.name for k in kinds.kinds_for_seed(seed.kind))}",
            )
        )
        return issues
    servers = [k.name for k in kinds.kinds_for_seed(seed.kind) if k.server]
    if len(servers) > 1 and kinds.detect(svc) is None:
        issues.append(
            env.issue(
                name,
                ("reset", "seed"),
                f"seed {seed.name!r} is kind {seed.kind.value}, which {' and '.join(servers)} both apply, "
                f"but forge cannot tell which server service {name!r} runs "
                f"(image {svc.image or '(none)'!r}); declare it in the compose file with the label "
                f"{kinds.DECLARED}: {servers[-1]} "
                f"(or {', '.join(servers[:-1])})",
            )
        )
        return issues
    rules = kinds.rules(kind)
    if rules is not None:
        issues += rules.problems(name, seed.name, sdef, svc=svc, path=seed.path)
    return issues


def check_declared_kinds(compose: ComposeSet) -> list[SpecIssue]:
    """Every service's ``io.forgelib.kind`` label (``kinds.DECLARED``) names a server kind, and not
    another than the one its image runs."""
    issues: list[SpecIssue] = []
    for name, sdef in compose.services.items():
        svc = service_config(sdef.data(), name)
        declared = svc.labels.get(kinds.DECLARED)
        written = sdef.last("labels")
        if declared is None or written is None:
            continue
        known = kinds.SERVER_KINDS
        if declared not in known:
            issues.append(
                written.issue(
                    f"service {name!r}: label {kinds.DECLARED}: {declared!r} is not a kind forge knows"
                    f"{did_you_mean(declared, known)}; kinds: {', '.join(known)}"
                )
            )
            continue
        found = kinds.detected(svc)
        if found is not None and found.name != declared:
            issues.append(
                written.issue(
                    f"service {name!r} is declared {declared} ({kinds.DECLARED}) but its image "
                    f"{svc.image!r} runs {found.name}; remove the label, or bind its seeds and checks to "
                    f"the service that runs {declared}"
                )
            )
    return issues


_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)")


def _interpolate(value: str) -> str:
    """``value`` as compose would read it when the variables it names hold their defaults (or what the
    environment sets): enough to recognise an image written ``${FORGE_IMAGE_X:-x:16}``."""
    return _VARIABLE.sub(lambda m: os.environ.get(m[1] or m[3] or "") or (m[2] or ""), value)


def service_config(written: Mapping[str, Any], name: str) -> ServiceConfig:
    """A compose service as written, typed, its image and command interpolated."""
    raw = dict(written)
    for key in ("image", "command"):
        if isinstance(raw.get(key), str):
            raw[key] = _interpolate(raw[key])
        elif isinstance(raw.get(key), list):
            raw[key] = [_interpolate(str(a)) for a in raw[key]]
    return ServiceConfig.of(raw, name)


def check_oracle(
    doc: YamlDoc, services: Mapping[str, Any] | None, root: Path, key: str = "oracle"
) -> tuple[Path | None, list[SpecIssue]]:
    """``oracle`` (or ``setup``, ``key``: the same fields): exactly one of command/script, a script inside
    the project, a service that exists."""
    oracle = doc.get((key,))
    if not isinstance(oracle, dict):
        return None, []
    issues = []
    script: Path | None = None
    has = [k for k in ("command", "script") if k in oracle]
    what = "an oracle" if key == "oracle" else f"a {key} step"
    if len(has) != 1:
        issues.append(
            doc.issue(
                (key,),
                f"{what} needs exactly one of command (argv run in the service) or script "
                f"(a host file streamed to interpreter); found {' and '.join(has) or 'neither'}",
            )
        )
    if "interpreter" in oracle and "script" not in oracle:
        issues.append(doc.issue((key, "interpreter"), "interpreter only applies to script; remove it"))
    if "script" in oracle:
        resolved, problem = check_project_path(oracle["script"], doc.file.parent, root, f"{key} script")
        if problem is None and resolved is not None and not resolved.is_file():
            problem = f"{key} script {oracle['script']!r} is not a file (paths are relative to task.yaml)"
        if problem:
            issues.append(doc.issue((key, "script"), problem))
        else:
            script = resolved
    if services is not None:
        issues.extend(_service_exists(doc, (key, "service"), oracle["service"], services))
    return script, issues


def check_setup(
    doc: YamlDoc, services: Mapping[str, Any] | None, reset: Sequence[str] | None, root: Path
) -> tuple[Path | None, list[SpecIssue]]:
    """``setup``: the oracle's rules, and a stack with a service a checkpoint captures (``reset``: the
    task's reset services it captures, ``captures_state`` and not ``checkpoint: fresh``; None when its
    environment did not load)."""
    script, issues = check_oracle(doc, services, root, "setup")
    if isinstance(doc.get(("setup",)), dict) and reset is not None and not reset:
        issues.append(
            doc.issue(
                ("setup",),
                "the task's stack has no reset service a checkpoint captures, so nothing of what setup "
                "leaves would reach a trial (a checkpoint captures reset services whose kind keeps state "
                "in the service, unless they say `checkpoint: fresh`; the others start fresh); give the "
                "service setup writes to `isolation: reset` with a seed (without `checkpoint: fresh`), "
                "or remove setup",
            )
        )
    return script, issues


def _service_exists(doc: YamlDoc, at: JsonPath, name: str, services: Mapping[str, Any]) -> list[SpecIssue]:
    if name in services:
        return []
    return [
        doc.issue(
            at,
            f"service {name!r} is not in the task's compose file{did_you_mean(name, services)}; "
            f"its services: {', '.join(services)}",
        )
    ]


def grading_checks(data: Mapping[str, Any]) -> list[tuple[JsonPath, Mapping[str, Any]]]:
    """Every check of a grading file with where it is: flat ``checks``, ``gates``, and inside components
    (their ``checks`` and each route of their ``alternatives``)."""
    found: list[tuple[JsonPath, Mapping[str, Any]]] = []
    for key in ("checks", "gates"):
        found += [((key, i), c) for i, c in enumerate(data.get(key) or [])]
    for c, comp in enumerate(data.get("components") or []):
        found += [(("components", c, "checks", i), ch) for i, ch in enumerate(comp.get("checks") or [])]
        for route, checks in (comp.get("alternatives") or {}).items():
            found += [(("components", c, "alternatives", route, i), ch) for i, ch in enumerate(checks)]
    return found


def check_grading(doc: YamlDoc, services: Mapping[str, Any] | None) -> list[SpecIssue]:
    """Each check: exactly one type, exactly one matcher, a valid regex, a unique name (across the whole
    file: grade.yaml lists them by name), a known service. Components: exactly one of checks, alternatives,
    judge; unique names; no gate inside one (gates live outside any component or route)."""
    issues: list[SpecIssue] = _check_components(doc, services)
    seen: dict[str, str] = {}
    for at, check in grading_checks(doc.data):
        name = check["name"]
        where = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in at).replace(".[", "[")
        if name in seen:
            issues.append(
                doc.issue((*at, "name"), f"duplicate check name {name!r} (also {seen[name]}); rename one")
            )
        seen.setdefault(name, where)
        if at[0] == "components" and check.get("severity") == "gate":
            issues.append(
                doc.issue(
                    (*at, "severity"),
                    "a gate inside a component would only count toward its route or score; "
                    "move the check to the top-level `gates:` list",
                )
            )
        types = [t for t in CHECK_TYPES if t in check]
        if len(types) != 1:
            issues.append(
                doc.issue(
                    at,
                    f"a check needs exactly one of {', '.join(CHECK_TYPES)}; "
                    f"found {', '.join(types) or 'none'}",
                )
            )
            continue
        kind = types[0]
        spec = check[kind]
        if kind == "trace":
            issues.extend(_check_trace(doc, (*at, kind), spec, services))
            continue
        issues.extend(_check_matchers(doc, (*at, kind), spec, optional=kind == "http"))
        if kind == "http":
            if "json" in spec:
                issues.extend(_check_matchers(doc, (*at, kind, "json"), spec["json"], optional=False))
            if not any(k in spec for k in ("status", "json", *MATCHERS)):
                issues.append(
                    doc.issue((*at, kind), "an http check needs status, json or a body matcher to compare")
                )
        if services is not None:
            issues.extend(_service_exists(doc, (*at, kind, "service"), spec["service"], services))
            issues.extend(
                _observed(doc, (*at, kind, "service"), f"{kind} check", kind, spec["service"], services)
            )
    return issues


def _observed(
    doc: YamlDoc, at: JsonPath, what: str, name: str, service: str, services: Mapping[str, Any]
) -> list[SpecIssue]:
    """A kind's check type or tool (``name``) aimed at ``service``: refused when the service runs a kind
    that does not observe it (an sql check on a redis service); a service of no known kind may run it."""
    serving = kinds.kinds_for_check(name) or kinds.kinds_for_tool(name)
    raw = services.get(service)
    if not serving or not isinstance(raw, Mapping):
        return []
    svc = service_config(raw, service)
    found = kinds.detect(svc)
    if found is None or found in serving:
        return []
    theirs = [*found.checks, *(t.name for t in found.tools)]
    instead = f"; for a {found.name} service use {' or '.join(theirs)}" if theirs else ""
    return [
        doc.issue(
            at,
            f"{what} needs a {' or '.join(k.name for k in serving)} service, but service {service!r} "
            f"runs {found.name}; aim it at a service that runs {serving[0].name}{instead}",
        )
    ]


def _check_components(doc: YamlDoc, services: Mapping[str, Any] | None) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    data = doc.data
    if "checks" in data and "components" in data:
        issues.append(
            doc.issue(
                ("checks",),
                "use either flat `checks` or weighted `components`, not both; "
                "move these checks into a component (`- {name: ..., weight: ..., checks: [...]}`)",
            )
        )
    names: dict[str, int] = {}
    for c, comp in enumerate(data.get("components") or []):
        at: JsonPath = ("components", c)
        if comp["name"] in names:
            issues.append(doc.issue((*at, "name"), f"duplicate component name {comp['name']!r}; rename one"))
        names.setdefault(comp["name"], c)
        kinds = [k for k in ("checks", "alternatives", "judge") if k in comp]
        if len(kinds) != 1:
            issues.append(
                doc.issue(
                    at,
                    "a component needs exactly one of checks, alternatives, judge; "
                    f"found {', '.join(kinds) or 'none'}",
                )
            )
        judge = comp.get("judge")
        if judge is not None and services is not None:
            if "service" in judge:
                issues.extend(_service_exists(doc, (*at, "judge", "service"), judge["service"], services))
            if "input" in judge:
                svc = judge["input"]["service"]
                issues.extend(_service_exists(doc, (*at, "judge", "input", "service"), svc, services))
    return issues


def _check_matchers(
    doc: YamlDoc, at: JsonPath, spec: Mapping[str, Any], *, optional: bool
) -> list[SpecIssue]:
    found = [m for m in MATCHERS if m in spec]
    if len(found) > 1 or (not found and not optional):
        return [
            doc.issue(
                at,
                f"needs exactly one matcher of {', '.join(MATCHERS)}; found {', '.join(found) or 'none'}",
            )
        ]
    if "regex" in spec:
        try:
            re.compile(spec["regex"])
        except re.error as e:
            return [doc.issue((*at, "regex"), f"invalid regular expression: {e}")]
    return []


TRACE_QUESTIONS = ("called", "not_called", "order", "bound")
# Which question each outcome option belongs to.
_TRACE_OPTIONS = {"on_missing": "order", "on_unbound": "bound"}


def _check_trace(
    doc: YamlDoc, at: JsonPath, spec: Mapping[str, Any], services: Mapping[str, Any] | None = None
) -> list[SpecIssue]:
    """A trace check: exactly one question, its options only with it, call patterns that can match (known
    arguments of their tool, valid regexes), a capture with a group."""
    asked = [q for q in TRACE_QUESTIONS if q in spec]
    if len(asked) != 1:
        return [
            doc.issue(
                at,
                f"a trace check asks exactly one of {', '.join(TRACE_QUESTIONS)}; "
                f"found {', '.join(asked) or 'none'}",
            )
        ]
    question = asked[0]
    issues = [
        doc.issue(
            (*at, option),
            f"{option} applies to {owner} only; remove it (this check asks {question})",
            key=True,
        )
        for option, owner in _TRACE_OPTIONS.items()
        if option in spec and owner != question
    ]
    body = spec[question]
    if question in ("called", "not_called"):
        return issues + _check_call(doc, (*at, question), body, services)
    if question == "order":
        return (
            issues
            + _check_call(doc, (*at, question, "first"), body["first"], services)
            + _check_call(doc, (*at, question, "then"), body["then"], services)
        )
    issues += _check_call(doc, (*at, question, "from"), body["from"], services)
    issues += _check_call(doc, (*at, question, "into"), body["into"], services)
    try:
        groups = re.compile(body["capture"]).groups
    except re.error as e:
        return [*issues, doc.issue((*at, question, "capture"), f"invalid regular expression: {e}")]
    if groups < 1:
        issues.append(
            doc.issue(
                (*at, question, "capture"),
                "the capture has no group; wrap the token in one (group 1 is what is bound), "
                r'e.g. "status": "(\w+)"',
            )
        )
    issues += _check_argument(doc, (*at, question, "arg"), body["into"]["tool"], body["arg"])
    return issues


def _check_call(
    doc: YamlDoc, at: JsonPath, call: Mapping[str, Any], services: Mapping[str, Any] | None = None
) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    named = str((call.get("args") or {}).get("service", "")).removeprefix("^").removesuffix("$")
    if services is not None and named in services:  # the pattern names one service
        what = f"a {call['tool']} call"
        issues += _observed(doc, (*at, "args", "service"), what, call["tool"], named, services)
    for name, pattern in (call.get("args") or {}).items():
        issues += _check_argument(doc, (*at, "args", name), call["tool"], name, key=True)
        issues += _check_regex(doc, (*at, "args", name), pattern)
    if "result" in call:
        issues += _check_regex(doc, (*at, "result"), call["result"])
    return issues


def _check_argument(
    doc: YamlDoc, at: JsonPath, tool: str, dotted: str, *, key: bool = False
) -> list[SpecIssue]:
    known = TOOL_ARGUMENTS[tool]
    top = dotted.split(".", 1)[0]
    if top in known:
        return []
    return [
        doc.issue(
            at,
            f"tool {tool} has no argument {top!r}{did_you_mean(top, known)}; "
            f"its arguments: {', '.join(known)}",
            key=key,
        )
    ]


def _check_regex(doc: YamlDoc, at: JsonPath, pattern: str) -> list[SpecIssue]:
    try:
        re.compile(pattern)
    except re.error as e:
        return [doc.issue(at, f"invalid regular expression {clip(pattern)}: {e}")]
    return []
