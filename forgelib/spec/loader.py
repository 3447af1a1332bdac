"""Load a project's spec files into the typed models, collecting every problem before raising one SpecError.

Order per file: YAML (with positions) -> JSON Schema -> semantic checks -> models. A file whose schema fails
is not checked further (its data cannot be trusted), but every other file still is, so one run reports
everything that can be known.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forgelib.errors import SpecError, SpecIssue
from forgelib.mcp.names import DEFAULT_TOOLS
from forgelib.spec import rules, schema
from forgelib.spec.composefiles import ComposeSet, load_compose_set
from forgelib.spec.digest import PREFIX, DigestError, seed_digest
from forgelib.spec.models import (
    HOST,
    LOG_TAIL_LINES,
    Agent,
    Check,
    Checkpointing,
    Component,
    EnvironmentManifest,
    Grading,
    Isolation,
    Judge,
    Oracle,
    Project,
    ResetBinding,
    RunConfig,
    Seed,
    Service,
    Task,
    Timeouts,
    frozen_map,
)
from forgelib.spec.ports import ServicePorts, check_http_ports, reset_kinds, service_ports
from forgelib.spec.rules import RawEnvironment, SeedSpec
from forgelib.spec.taskfiles import empty_run_issue, stray_issue, stray_task_files
from forgelib.spec.trialsafety import check_trial_safety
from forgelib.spec.yamlpos import YamlDoc, clip, display_path, load_yaml

PROJECT_FILE = "project.yaml"
DEFAULT_TASKS_GLOB = "tasks/**/task.yaml"
DEFAULT_RUN_CONFIGS_GLOB = "run_configs/*.yaml"
_DIGEST_LEN = len(PREFIX) + 64


def project_file(path: str | Path) -> Path:
    """``path`` is a project directory or its project.yaml; the absolute project.yaml, or a SpecError."""
    p = Path(path).expanduser()
    candidate = p / PROJECT_FILE if p.is_dir() else p
    if not candidate.is_file():
        what = f"no {PROJECT_FILE} in {p}" if p.is_dir() else f"{p} does not exist or is not a file"
        raise SpecError(
            [
                SpecIssue(
                    display_path(candidate),
                    None,
                    None,
                    "$",
                    f"{what}; pass a project directory or its {PROJECT_FILE}",
                )
            ]
        )
    return candidate.resolve()


def stamp_command(root: Path) -> str:
    return f"run `forge stamp --project {display_path(root) or '.'}`"


@dataclass
class ProjectLoad:
    """What loading a project found: the model when there were no issues, and every issue otherwise."""

    path: Path
    project: Project | None = None
    issues: list[SpecIssue] = field(default_factory=list)
    seeds: dict[str, SeedSpec] = field(default_factory=dict)
    doc: YamlDoc | None = None
    task_files: list[Path] = field(default_factory=list)
    run_config_files: list[Path] = field(default_factory=list)
    notices: list[SpecIssue] = field(default_factory=list)  # warnings and notes (what forge changes)


def load_project_config(path: str | Path, *, verify_digests: bool = True) -> Project:
    """The project at ``path`` (a directory or its project.yaml) as typed models with absolute paths.

    Every seed's digest is verified against the bytes on disk unless ``verify_digests`` is false (``stamp``
    needs that). Raises one ``SpecError`` listing every problem found.
    """
    result = collect_project(path, verify_digests=verify_digests)
    if result.issues or result.project is None:
        raise SpecError(result.issues)
    return result.project


def collect_project(path: str | Path, *, verify_digests: bool = True) -> ProjectLoad:
    """Like ``load_project_config`` but returns the issues instead of raising (for ``validate``)."""
    pfile = project_file(path)
    return _ProjectLoader(pfile, verify_digests).run()


def parse(path: Path, name: str) -> tuple[YamlDoc, list[SpecIssue]]:
    """A spec file's document and its YAML and schema issues. A document that parsed is schema-checked
    even when YAML had complaints (a duplicate key), so one pass reports every problem."""
    doc, issues = load_yaml(path)
    if doc.data is not None or not issues:
        issues += schema.validate(doc, name)
    return doc, issues


def load_project_seeds(path: str | Path) -> tuple[YamlDoc, dict[str, SeedSpec]]:
    """project.yaml's schema and seed checks only, no digests (what ``stamp`` needs: it must work while the
    rest of the project is still being written)."""
    pfile = project_file(path)
    doc, issues = parse(pfile, "project")
    seeds: dict[str, SeedSpec] = {}
    seeds_ok = isinstance(doc.data, dict) and not any(i.json_path.startswith("$.assets") for i in issues)
    if seeds_ok:
        seeds, more = rules.check_seeds(doc, pfile.parent)
        issues += more
    if issues:
        raise SpecError(issues)
    return doc, seeds


class _ProjectLoader:
    def __init__(self, pfile: Path, verify_digests: bool) -> None:
        self.pfile = pfile
        self.root = pfile.parent
        self.verify = verify_digests
        self.result = ProjectLoad(pfile)
        self.issues = self.result.issues
        self._compose: dict[tuple[Path, ...], ComposeSet | None] = {}

    def _parse(self, path: Path, name: str) -> tuple[YamlDoc, bool]:
        """The document and whether it passed YAML and schema (only then is it checked further)."""
        doc, issues = parse(path, name)
        self.issues.extend(issues)
        return doc, not issues

    def run(self) -> ProjectLoad:
        doc, ok = self._parse(self.pfile, "project")
        self.result.doc = doc
        if not ok:
            self._shapes_only(doc)
            return self.result
        seeds, issues = rules.check_seeds(doc, self.root)
        self.result.seeds = seeds
        self.issues.extend(issues)
        models = {s.name: m for s in seeds.values() if (m := self._seed(doc, s)) is not None}
        base = rules.merge_environment(None, doc, ("default_environment",))
        assert base is not None  # the schema requires default_environment.compose_file
        environment = self._environment(base, seeds)
        tasks = self._tasks(doc, base, environment, seeds)
        self.result.run_config_files = self._glob(doc, "run_configs", DEFAULT_RUN_CONFIGS_GLOB)
        if self.issues or environment is None:
            return self.result
        self.result.project = Project(
            name=doc.data["name"],
            root=self.root,
            path=self.pfile,
            description=doc.data.get("description", ""),
            seeds=frozen_map(models),
            environment=environment,
            tasks=tuple(t for t in tasks if t is not None),
            run_configs=tuple(self.result.run_config_files),
            notices=tuple(self.result.notices),
        )
        return self.result

    def _shapes_only(self, doc: YamlDoc) -> None:
        """With project.yaml broken, still check what can be checked alone: task and grading files' shape
        (references into the project wait until project.yaml is fixed)."""
        if not isinstance(doc.data, dict):
            return
        self.result.task_files = self._glob(doc, "tasks", DEFAULT_TASKS_GLOB)
        self.result.run_config_files = self._glob(doc, "run_configs", DEFAULT_RUN_CONFIGS_GLOB)
        for path in self.result.task_files:
            tdoc, ok = self._parse(path, "task")
            if ok:
                self._grading_for(tdoc, None)

    def _seed(self, doc: YamlDoc, spec: SeedSpec) -> Seed | None:
        if spec.path is None or spec.kind is None:
            return None
        declared = spec.declared
        if not self.verify:
            return Seed(spec.name, spec.path, spec.kind, declared or "")
        digest_at = spec.json_path if spec.shorthand else (*spec.json_path, "digest")
        if not declared:
            if spec.shorthand:
                msg = (
                    f"seed {spec.name!r} is written in the shorthand form (a bare path), which carries no "
                    f"digest; {stamp_command(self.root)} to expand it into the full form with its digest"
                )
            else:
                msg = f"seed {spec.name!r} has no digest; {stamp_command(self.root)} to write it"
            self.issues.append(doc.issue(digest_at, msg))
            return None
        if not (declared.startswith(PREFIX) and len(declared) == _DIGEST_LEN):
            self.issues.append(
                doc.issue(
                    digest_at,
                    f"seed {spec.name!r}: {clip(declared)} is not a sha256:<64 hex digits> digest; "
                    f"{stamp_command(self.root)}",
                )
            )
            return None
        try:
            actual = seed_digest(spec.path, spec.kind)
        except DigestError as e:
            self.issues.append(doc.issue(digest_at, str(e)))
            return None
        if actual != declared:
            self.issues.append(
                doc.issue(
                    digest_at,
                    f"seed {spec.name!r} ({spec.raw_path}) changed: declared {declared}, actual {actual}; "
                    f"if the change is intended, {stamp_command(self.root)}",
                )
            )
            return None
        return Seed(spec.name, spec.path, spec.kind, declared)

    def _glob(self, doc: YamlDoc, key: str, default: str) -> list[Path]:
        pattern = doc.get((key, "glob"))
        if not isinstance(pattern, str):
            pattern = None  # absent, or wrong and already reported by the schema
        try:
            found = sorted(p.resolve() for p in self.root.glob(pattern or default) if p.is_file())
        except (ValueError, NotImplementedError) as e:
            self.issues.append(doc.issue((key, "glob"), f"bad glob {pattern!r}: {e}; use a relative pattern"))
            return []
        if pattern and not found:
            self.issues.append(
                doc.issue(
                    (key, "glob"),
                    f"{pattern!r} matches no files under {display_path(self.root)}; fix the pattern "
                    f"(relative to the project directory, e.g. {default}) or remove it to use that default",
                )
            )
        return found

    def _compose_set(self, env: RawEnvironment) -> ComposeSet | None:
        """The environment's compose files read once per distinct list (tasks usually share the project's);
        None when they cannot be read or define no services (the issues say why)."""
        files = env.compose_files
        if files not in self._compose:
            missing = [f for f in files if not f.is_file()]
            if missing:
                doc, at = env.compose_at
                shown = ", ".join(display_path(f) for f in missing)
                self.issues.append(
                    doc.issue(at, f"compose file {shown} not found (paths are relative to {doc.display})")
                )
                self._compose[files] = None
            else:
                cset = load_compose_set(files)
                self.issues.extend(cset.issues)
                if not cset.issues and not cset.services:
                    self.issues.append(
                        SpecIssue(
                            display_path(files[0]),
                            None,
                            None,
                            "$.services",
                            "the compose file defines no services; add services:",
                        )
                    )
                self._compose[files] = cset if not cset.issues and cset.services else None
        return self._compose[files]

    def _environment(self, env: RawEnvironment, seeds: Mapping[str, SeedSpec]) -> EnvironmentManifest | None:
        cset = self._compose_set(env)
        if cset is None:
            return None
        issues = rules.check_environment(env, cset, seeds)
        models: dict[str, Service] = {}
        for name in cset.services:
            labels = env.services.get(name, {})
            isolation = Isolation(labels.get("isolation", Isolation.EPHEMERAL.value))
            reset = labels.get("reset")
            binding = None
            if reset is not None and not issues:
                options = {k: v for k, v in reset.items() if k != "seed"}
                binding = ResetBinding(reset["seed"], frozen_map(options))
            choice = labels.get("checkpoint")
            models[name] = Service(name, isolation, binding, Checkpointing(choice) if choice else None)
        if not issues:
            found = check_trial_safety(cset, {n: s.isolation for n, s in models.items()})
            issues = [i for i in found if i.severity == "error"]
            # Notes and warnings do not fail the load; each is said once however many tasks share the stack.
            self.result.notices.extend(
                i for i in found if i.severity != "error" and i not in self.result.notices
            )
        # A task inheriting the project's services repeats the project's issues; report each once.
        self.issues.extend(i for i in issues if i not in self.issues)
        if issues:
            return None
        return EnvironmentManifest(env.compose_files, frozen_map(models), frozen_map(cset.data()))

    def _tasks(
        self,
        doc: YamlDoc,
        base: RawEnvironment,
        project_env: EnvironmentManifest | None,
        seeds: Mapping[str, SeedSpec],
    ) -> list[Task | None]:
        files = self._glob(doc, "tasks", DEFAULT_TASKS_GLOB)
        self.result.task_files = files
        written = doc.get(("tasks", "glob"))
        pattern = written if isinstance(written, str) else DEFAULT_TASKS_GLOB
        self.issues.extend(
            stray_issue(p, pattern, pattern is written) for p in stray_task_files(self.root, pattern, files)
        )
        tasks: list[Task | None] = []
        names: dict[str, Path] = {}
        for path in files:
            task = self._task(path, base, project_env, seeds)
            tasks.append(task)
            if task is None:
                continue
            if task.name in names:
                tdoc, _ = load_yaml(path)
                self.issues.append(
                    tdoc.issue(
                        ("name",),
                        f"task name {task.name!r} is also used by {display_path(names[task.name])}; "
                        "names must be unique",
                    )
                )
            names.setdefault(task.name, path)
        return tasks

    def _task(
        self,
        path: Path,
        base: RawEnvironment,
        project_env: EnvironmentManifest | None,
        seeds: Mapping[str, SeedSpec],
    ) -> Task | None:
        doc, ok = self._parse(path, "task")
        if not ok:
            return None
        data = doc.data
        environment = project_env
        if "environment_manifest" in data:
            raw = rules.merge_environment(base, doc, ("environment_manifest",))
            environment = self._environment(raw, seeds) if raw is not None else None
        services = environment.compose.get("services") if environment is not None else None
        before = len(self.issues)
        script, issues = rules.check_oracle(doc, services, self.root)
        self.issues.extend(issues)
        captured = None
        if environment is not None:
            kept = environment.reset_services()
            captured = [s.name for s in kept if s.captured and rules.captures_state(seeds, s.reset)]
        setup_script, issues = rules.check_setup(doc, services, captured, self.root)
        self.issues.extend(issues)
        grading = self._grading_for(doc, services, self._ports(environment))
        if environment is None or len(self.issues) > before:
            return None
        return Task(
            name=data.get("name", path.parent.name),
            path=path,
            description=data.get("description", ""),
            environment=environment,
            oracle=_oracle(data.get("oracle"), script),
            grading=grading,
            instruction=data.get("instruction", ""),
            tools=tuple(data["tools"]) if "tools" in data else DEFAULT_TOOLS,
            tools_declared="tools" in data,
            setup=_oracle(data.get("setup"), setup_script),
        )

    def _ports(self, environment: EnvironmentManifest | None) -> dict[str, ServicePorts] | None:
        """What the host reaches of each service of ``environment`` (for http checks), None without one."""
        cset = self._compose.get(environment.compose_files) if environment is not None else None
        if environment is None or cset is None:
            return None
        return service_ports(cset, dict(reset_kinds(environment.services, self.result.seeds)))

    def _grading_for(
        self,
        doc: YamlDoc,
        services: Mapping[str, Any] | None,
        ports: Mapping[str, ServicePorts] | None = None,
    ) -> Grading | None:
        declared = doc.get(("grading",))
        if declared is None:
            path = doc.file.parent / "grading.yaml"
            if not path.is_file():
                return None
        else:
            resolved, problem = rules.check_project_path(declared, doc.file.parent, self.root, "grading file")
            if problem is None and resolved is not None and not resolved.is_file():
                problem = f"grading file {declared!r} not found (paths are relative to {doc.display})"
            if problem or resolved is None:
                self.issues.append(doc.issue(("grading",), problem or "bad grading path"))
                return None
            path = resolved
        grading, issues = collect_grading(path, services, ports)
        self.issues.extend(issues)
        return grading


def deep_freeze(value: Any) -> Any:
    """Mappings become read-only views and lists tuples, all the way down."""
    if isinstance(value, dict):
        return frozen_map({k: deep_freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(deep_freeze(v) for v in value)
    return value


def _oracle(data: Mapping[str, Any] | None, script: Path | None) -> Oracle | None:
    if data is None:
        return None
    command = data.get("command")
    return Oracle(
        service=data["service"],
        command=tuple(command) if command is not None else None,
        script=script,
        interpreter=tuple(data.get("interpreter", ("sh", "-s"))),
        timeout=float(data.get("timeout", 300.0)),
        env=frozen_map({k: str(v) for k, v in (data.get("env") or {}).items()}),
        workdir=data.get("workdir"),
    )


def collect_grading(
    path: Path, services: Mapping[str, Any] | None = None, ports: Mapping[str, ServicePorts] | None = None
) -> tuple[Grading | None, list[SpecIssue]]:
    """A grading file as a model, or its issues. ``services``: the compose services checks may name;
    ``ports``: what the host reaches of each (``spec.ports``), to check every http check's port."""
    doc, issues = parse(path, "grading")
    if not issues:
        issues = rules.check_grading(doc, services)
        if ports is not None:
            issues += check_http_ports(doc, rules.grading_checks(doc.data), ports)
    if issues:
        return None, issues
    data = doc.data
    components = tuple(
        Component(
            name=c["name"],
            weight=float(c["weight"]),
            checks=_checks(c.get("checks")),
            alternatives=frozen_map({r: _checks(v) for r, v in (c.get("alternatives") or {}).items()}),
            judge=_judge(c["judge"]) if "judge" in c else None,
        )
        for c in data.get("components") or []
    )
    return (
        Grading(
            path=path.resolve(),
            checks=_checks(data.get("checks")),
            threshold=float(data.get("threshold", 1.0)),
            gates=_checks(data.get("gates"), gate=True),
            components=components,
        ),
        [],
    )


def _checks(entries: list[Mapping[str, Any]] | None, *, gate: bool = False) -> tuple[Check, ...]:
    built = []
    for entry in entries or []:
        kind = next(t for t in rules.CHECK_TYPES if t in entry)
        built.append(
            Check(
                name=entry["name"],
                type=kind,
                spec=deep_freeze(entry[kind]),
                weight=float(entry.get("weight", 1.0)),
                gate=gate or entry.get("severity") == "gate",
            )
        )
    return tuple(built)


def _judge(data: Mapping[str, Any]) -> Judge:
    given = data.get("input") or {}
    return Judge(
        command=tuple(data["command"]),
        service=data.get("service"),
        input_service=given.get("service"),
        input_path=given.get("path"),
        timeout=float(data.get("timeout", 60.0)),
        env=frozen_map({k: str(v) for k, v in (data.get("env") or {}).items()}),
    )


def load_grading(path: str | Path, services: Mapping[str, Any] | None = None) -> Grading:
    """One grading file; raises SpecError listing every problem."""
    grading, issues = collect_grading(Path(path).resolve(), services)
    if grading is None:
        raise SpecError(issues)
    return grading


def collect_run_config(
    path: Path, project: Project | None = None
) -> tuple[RunConfig | None, list[SpecIssue]]:
    """A run config as a model, or its issues. With ``project``, its task names are checked against it."""
    path = path.resolve()
    doc, issues = parse(path, "run_config")
    if issues:
        return None, issues
    data = doc.data
    base = path.parent
    proj = (base / data["project"]).resolve()
    proj_dir = proj.parent if proj.is_file() else proj
    if not (proj_dir / PROJECT_FILE).is_file():
        issues.append(
            doc.issue(
                ("project",),
                f"{data['project']!r} is not a project directory "
                f"(no {PROJECT_FILE} in {display_path(proj_dir)}); paths are relative to the run config",
            )
        )
    if project is not None and not project.tasks and not data.get("tasks"):
        issues.append(empty_run_issue(doc, project.name))
    if project is not None:
        known = [t.name for t in project.tasks]
        for i, name in enumerate(data.get("tasks", [])):
            if name not in known:
                hint = schema.did_you_mean(name, known)
                issues.append(
                    doc.issue(
                        ("tasks", i),
                        f"no task named {name!r} in the project{hint}; tasks: {', '.join(known)}",
                    )
                )
    agent = _agent(data["agent"], path) if isinstance(data.get("agent"), dict) else None
    if agent is not None and project is not None:
        issues += check_agent_where(agent, doc, ("agent", "where"), project, data.get("tasks") or ())
    if issues:
        return None, issues
    output = data.get("output")
    return (
        RunConfig(
            path=path,
            project=proj_dir,
            tasks=tuple(data.get("tasks", ())),
            repeats=data.get("repeats", 1),
            workers=data.get("workers", 1),
            retries=data.get("retries", 0),
            stacks=data.get("stacks", "fresh"),
            cluster=data.get("cluster"),
            output=(base / output).resolve() if output else proj_dir / "runs",
            capture_logs_on_success=data.get("capture_logs_on_success", False),
            log_tail_lines=data.get("log_tail_lines", LOG_TAIL_LINES),
            timeouts=Timeouts(**{k: float(v) for k, v in (data.get("timeouts") or {}).items()}),
            profiles=tuple(data.get("profiles", ())),
            snapshots=data.get("snapshots", False),
            memory_budget_mb=data.get("memory_budget_mb"),
            agent=agent,
        ),
        [],
    )


PYTHON_PLACEHOLDER = "{python}"  # a host agent's argv[0]: forge's own Python


def _agent(data: Mapping[str, Any], source: Path) -> Agent:
    command = [str(a) for a in data["command"]]
    where = str(data.get("where", HOST))
    if where == HOST and command[0] == PYTHON_PLACEHOLDER:
        # The interpreter running forge: it has forgelib and so the `mcp` SDK, whichever `python3` is on PATH.
        command[0] = sys.executable
    # A host agent's relative program path is relative to the file that declared it (not to wherever
    # forge was started), so the runner finds it; a service's paths are the container's.
    if where == HOST and "/" in command[0] and not Path(command[0]).is_absolute():
        command[0] = str((source.parent / command[0]).resolve())
    return Agent(
        command=tuple(command),
        where=where,
        timeout=float(data.get("timeout", 600.0)),
        env=frozen_map({str(k): str(v) for k, v in (data.get("env") or {}).items()}),
        workdir=data.get("workdir"),
        source=source,
        name=str(data.get("name", "")),
    )


def check_agent_where(
    agent: Agent, doc: YamlDoc, at: tuple[str, ...], project: Project, tasks: Any = ()
) -> list[SpecIssue]:
    """An agent run in a service needs that service in the stack of every task it solves."""
    if agent.on_host:
        return []
    chosen = [t for t in project.tasks if not tasks or t.name in tasks]
    lacking = [t.name for t in chosen if agent.where not in t.environment.services]
    if not lacking:
        return []
    known = sorted({s for t in chosen for s in t.environment.services})
    hint = schema.did_you_mean(agent.where, known)
    return [
        doc.issue(
            at,
            f"no service {agent.where!r} in the stack of task(s) {', '.join(lacking)}{hint}; "
            f"give `host` or one of: {', '.join(known)}",
        )
    ]


def load_agent(path: str | Path, project: Project | None = None, tasks: Any = ()) -> Agent:
    """An agent file (``forge run --agent FILE``); raises SpecError listing every problem."""
    file = Path(path).resolve()
    if not file.is_file():
        raise SpecError(
            [
                SpecIssue(
                    display_path(file), None, None, "$", "no such agent file; give `oracle` or a YAML file"
                )
            ]
        )
    doc, issues = parse(file, "agent")
    if issues:
        raise SpecError(issues)
    agent = _agent(doc.data, file)
    if project is not None:
        issues = check_agent_where(agent, doc, ("where",), project, tasks)
        if issues:
            raise SpecError(issues)
    return agent


def load_run_config(path: str | Path, project: Project | None = None) -> RunConfig:
    """A run config (paths in it are relative to the file); raises SpecError listing every problem."""
    config, issues = collect_run_config(Path(path), project)
    if config is None:
        raise SpecError(issues or [SpecIssue(display_path(Path(path)), None, None, "$", "cannot load")])
    return config
