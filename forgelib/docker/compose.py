"""docker compose: pure argv builders, and a ``ComposeProject`` bound to one project name, its files and env.

Builders follow python-on-whales: one function per verb, options as keywords, ``None``/``False`` skipped,
so unit tests assert exact argv without an engine. ``ComposeProject`` runs them through the runner with
a timeout from ``Timeouts`` on every call and an env where no ambient ``COMPOSE_*`` variable leaks in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import tempfile
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from forgelib.docker import argv as dk
from forgelib.docker import engine
from forgelib.docker import labels as lab
from forgelib.docker.argv import flags
from forgelib.docker.labels import COMPOSE_PROJECT
from forgelib.docker.resolved import ResolvedConfig, ServiceConfig
from forgelib.errors import CommandError, CommandTimeout, ForgeError, ServiceCommandError
from forgelib.runner import Result, Runner, secret_values
from forgelib.spec.models import Timeouts

MAX_NAME = 63
_NAME_OK = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_PART = 12  # characters of the project and task names kept in a project name
_WAIT_GRACE = 30.0  # runner timeout beyond --wait-timeout, so compose's own message explains a slow start
# What `docker exec` says when the container is missing or not running (then compose explains it).
_NO_CONTAINER = re.compile(
    r"Error( response from daemon)?: (No such container|Container \S+ is (not running|paused))"
)


# ---------------------------------------------------------------------------------------------- names


def is_valid_name(name: str) -> bool:
    return len(name) <= MAX_NAME and bool(_NAME_OK.match(name))


def sanitize_name(raw: str, *, key: str | None = None) -> str:
    """A valid compose project name for ``raw``; unique per ``key`` (default ``raw``).

    Whenever the mapping loses information (case folded, characters replaced, length cut, or ``raw`` is
    already a shortened ``key``) an 8-hex hash of ``key`` is appended, so two different keys never collide
    (``a.b`` vs ``a-b``, ``Read`` vs ``read``).
    """
    key = raw if key is None else key
    name = re.sub(r"[^a-z0-9_-]+", "-", raw.lower())
    name = re.sub(r"-{2,}", "-", name).lstrip("-_").rstrip("-")
    if name == key and is_valid_name(name):
        return name
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    head = name[: MAX_NAME - len(digest) - 1].rstrip("-_")
    return f"{head}-{digest}" if head else f"f{digest}"


def project_name(
    project: str, run_id: str, task: str, trial_index: int | None, attempt: int = 1, *, tail: str = ""
) -> str:
    """The compose project name of one trial (``trial_index=None``: the run's shared stack for ``task``);
    a retried trial's later attempts get ``-a<attempt>`` (a fresh project). ``tail``: another stack of the
    task's than a trial's (``setup``: the one its setup step runs on).

    Long project and task names are shortened first, so the run id and trial index stay readable.
    """
    if not tail:
        tail = "shared" if trial_index is None else str(trial_index) + (f"-a{attempt}" if attempt > 1 else "")
    full = f"{project}-{run_id}-{task}-{tail}"
    return sanitize_name(f"{project[:_PART]}-{run_id}-{task[:_PART]}-{tail}", key=full)


# ---------------------------------------------------------------------------------------- argv builders


def base_argv(name: str, files: Sequence[Path] = (), profiles: Sequence[str] = ()) -> list[str]:
    argv = dk.compose("--ansi", "never", "--project-name", name)
    for f in files:
        argv += ["--file", str(f)]
    for p in profiles:  # flags, not COMPOSE_PROFILES: clean_env drops every ambient COMPOSE_* variable
        argv += ["--profile", p]
    return argv


def config_argv() -> list[str]:
    return ["config", "--format", "json"]


def renamed(config: Any, old: str, new: str) -> Any:
    """``config``, the ``config`` of project ``old``, as compose resolves it for project ``new``. The
    name is text wherever compose puts it (the top-level ``name``, the default network's and named
    volumes' names, a ``${COMPOSE_PROJECT_NAME}`` interpolated anywhere): every occurrence in a key or a
    string is replaced. ``old`` must occur nowhere else: a placeholder of the caller's (``unique_name``)."""
    if isinstance(config, str):
        return config.replace(old, new)
    if isinstance(config, dict):
        return {renamed(k, old, new): renamed(v, old, new) for k, v in config.items()}
    if isinstance(config, list):
        return [renamed(v, old, new) for v in config]
    return config


def unique_name(prefix: str = "forgeconfig") -> str:
    """A project name no compose file, image or label can contain by chance: ``renamed``'s ``old``."""
    return f"{prefix}{secrets.token_hex(8)}"


def up_argv(
    services: Sequence[str] = (),
    *,
    wait: bool = True,
    wait_timeout: float | None = None,
    no_deps: bool = False,
    force_recreate: bool = False,
    no_start: bool = False,
    no_recreate: bool = False,
    scale: Mapping[str, int] | None = None,
) -> list[str]:
    # --renew-anon-volumes with --force-recreate: a recreated container must not inherit the old one's
    # anonymous volumes (compose keeps them by default). --no-start: created, not started (no --wait then).
    opts = flags(detach=True, wait=wait and not no_start, wait_timeout=None if no_start else wait_timeout)
    opts += flags(no_deps=no_deps, no_start=no_start)
    opts += flags(force_recreate=force_recreate, renew_anon_volumes=force_recreate, no_recreate=no_recreate)
    for svc, n in (scale or {}).items():
        opts += ["--scale", f"{svc}={n}"]
    return ["up", *opts, *services]


def down_argv(*, volumes: bool = True, remove_orphans: bool = True, timeout: int | None = None) -> list[str]:
    return ["down", *flags(volumes=volumes, remove_orphans=remove_orphans, timeout=timeout)]


def stop_argv(services: Sequence[str], *, timeout: int | None = None) -> list[str]:
    return ["stop", *flags(timeout=timeout), *services]


def start_argv(services: Sequence[str]) -> list[str]:
    return ["start", *services]


def exec_argv(
    service: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    user: str | None = None,
) -> list[str]:
    out = ["exec", "-T"]  # -T: no TTY, so stdin streams and output is plain
    for k, v in (env or {}).items():
        out += ["--env", f"{k}={v}"]
    out += flags(workdir=workdir, user=user)
    return [*out, service, *argv]


def cp_argv(src: str, dst: str) -> list[str]:
    return ["cp", src, dst]


def build_argv(services: Sequence[str]) -> list[str]:
    return ["build", *services]


def port_argv(service: str, container_port: int, *, protocol: str | None = None) -> list[str]:
    return ["port", *flags(protocol=protocol), service, str(container_port)]


def ps_argv(services: Sequence[str] = (), *, all: bool = True) -> list[str]:
    return ["ps", *flags(all=all, format="json"), *services]


# ------------------------------------------------------------------------------------------ override


LOOPBACK = "127.0.0.1"


class Override(list[Any]):
    """A list written as ``!override [...]``: it replaces the compose file's list instead of adding to it."""


class Reset:
    """Written as ``!reset null``: the key is removed, as if the compose file never set it."""


class _OverrideDumper(yaml.SafeDumper):
    pass


_OverrideDumper.add_representer(Override, lambda d, v: d.represent_sequence("!override", list(v)))
_OverrideDumper.add_representer(Reset, lambda d, v: d.represent_scalar("!reset", "null"))


_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_GO_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
# Docker's defaults for a healthcheck that leaves them out.
DOCKER_INTERVAL, DOCKER_RETRIES, DOCKER_TIMEOUT = 30.0, 3, 30.0
QUIET_RETRIES = 3  # the fewest consecutive failures Docker counts once forge spaces the probes out
QUIET_MAX_INTERVAL = 30.0  # seconds: Docker's own default interval


def go_seconds(text: Any) -> float | None:
    """A Go duration as compose prints it (``1s``, ``1m30s``, ``500ms``) in seconds; None if it is not one."""
    if isinstance(text, (int, float)):
        return float(text) / 1e9  # compose's JSON form: nanoseconds
    parts = _GO_PART.findall(str(text or "").strip())
    if not parts or "".join(n + u for n, u in parts) != str(text).strip():
        return None
    return sum(float(n) * _GO_UNITS[u] for n, u in parts)


def quiet_healthcheck(hc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``interval``/``retries`` forge gives a service's healthcheck in place of its own (None: keep them).

    Why: Docker runs a healthcheck for a container's whole life, and each run is a ``docker exec``, which
    costs CPU. Frequent checks make many idle stacks cost whole cores (benchmarks/README.md, "Figures
    behind the code's choices"). forge does not need them often: ``forgelib.docker.readiness`` runs the same
    command itself until it passes, and reads Docker's state only for ``unhealthy``. So the probes are
    spaced out: the interval is what the compose file's interval x retries allows over ``QUIET_RETRIES``
    retries (at most ``QUIET_MAX_INTERVAL``), and there are as many retries as keep a service whose every
    probe times out (a loaded box: Docker's timeout is per probe) from turning ``unhealthy`` sooner than
    written, retries x (interval + timeout). A service whose probe fails fast then turns unhealthy later
    than written (the run's ``compose_up`` limit usually ends it first). Fewer retries would let a loaded
    machine's slow probes mark healthy services unhealthy and fail their trials."""
    test = hc.get("test") or []
    if hc.get("disable") or not test or test[0] == "NONE":
        return None
    interval = go_seconds(hc.get("interval")) or DOCKER_INTERVAL
    retries = int(hc.get("retries") or DOCKER_RETRIES)
    timeout = go_seconds(hc.get("timeout")) or DOCKER_TIMEOUT
    spaced = min(QUIET_MAX_INTERVAL, interval * retries / min(retries, QUIET_RETRIES))
    if spaced <= interval:
        return None
    fewer = min(retries, max(QUIET_RETRIES, math.ceil(retries * (interval + timeout) / (spaced + timeout))))
    return {"interval": f"{spaced:g}s", "retries": fewer}


# A long-syntax mount's ``volume.labels`` reaches the volume compose creates from compose 2.35 on; older
# versions refuse the key. Only then is an ephemeral service's image VOLUME an anonymous volume of each
# container's own that label queries still see (``labels_override``'s ``per_container``).
VOLUME_LABELS_SINCE = (2, 35)


class ComposeFacts:
    """What the compose plugin can do, asked once per owner (``docker compose version --short``), as
    ``ImageFacts`` holds what the engine's images are: the same answer for a stack's provisioning and for
    the warm pool that later renews its volumes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # trials start together on --workers N: ask once
        self._version: tuple[int, ...] | None = None

    def volume_labels(self, runner: Runner, timeout: float) -> bool:
        """Whether compose puts a mount's ``volume.labels`` on the anonymous volume it creates."""
        with self._lock:
            if self._version is None:
                self._version = _compose_version(runner, timeout)
            return self._version >= VOLUME_LABELS_SINCE


def _compose_version(runner: Runner, timeout: float) -> tuple[int, ...]:
    """compose's major and minor version; () when it does not say (then the path every version takes)."""
    found = re.match(r"v?(\d+)\.(\d+)", engine.compose_version(runner, timeout) or "")
    return (int(found[1]), int(found[2])) if found else ()


def labels_override(
    config: Mapping[str, Any],
    labels: Mapping[str, str],
    image_volumes: Mapping[str, Sequence[str]] | None = None,
    loopback: Mapping[str, Sequence[int]] | None = None,
    built: Mapping[str, str] | None = None,
    mounts: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    environment: Mapping[str, Mapping[str, str]] | None = None,
    *,
    quiet_health: bool = False,
    process: Mapping[str, Mapping[str, Any]] | None = None,
    per_container: Collection[str] = (),
) -> dict[str, Any]:
    """A compose override making one trial's stack independent of every other stack on the engine.

    - ``labels`` on every service, the default network and every declared network and volume the project
      creates (external ones belong to someone else and are left alone);
    - every published port (``trial_ports``) on 127.0.0.1 at a host port the engine picks, and ``loopback``
      (service -> container ports) published the same way, so forge reaches the service directly
      (``forgelib.stacks.connect``): fixed host ports would collide between parallel stacks, and loopback
      keeps a trial's database off the network;
    - ``container_name`` removed (``!reset``): a fixed name exists once per engine, so a second stack
      could not start;
    - ``built`` (service -> image the run built, ``forgelib.docker.builds``): the service runs that image,
      with ``build`` removed and never pulled, so ``up`` never builds per trial.

    ``image_volumes`` (image -> the VOLUME paths it declares): Docker would back each such path that the
    service does not mount itself with an anonymous volume, which carries no labels, so no label query
    (leak checks, ``forge reap``) could see it. Each gets a named, labelled volume instead; in a service of
    ``per_container`` (the ephemeral ones: new every trial) an anonymous volume carrying the labels
    (``volume.labels``), created with each container and removed with it (``rm --volumes``, ``down
    --volumes``): so a warm stack can create a service's next container beside the running one, each with
    its own new, empty volume, where a named one is shared by both.

    ``mounts`` (service -> long-syntax volume entries) and ``environment`` (service -> variables) are added
    to the services: a seed's extra mount and the variable naming it (``Recipe.seed_mount``: ``seeds.bare``).

    ``process`` (service -> ``entrypoint``/``command``): what runs in the service instead of its own
    process (a reset service's ``Recipe.warm_process``, in every mode: ``kinds.supervisor``).

    ``quiet_health``: each healthcheck spaced out as ``quiet_healthcheck`` says (forge's own readiness
    decides when a stack is ready; compose's ``up --wait`` would wait for the spaced-out probes).
    """
    lab = dict(labels)
    resolved = ResolvedConfig.of(config)
    services: dict[str, Any] = {}
    # A container's own volume carries its project's label too, as compose puts on the volumes it names:
    # label queries that group by project (``forge reap``) then count it with its stack, not on its own.
    own_labels = {**lab, **({COMPOSE_PROJECT: str(config["name"])} if config.get("name") else {})}
    volumes = {name: {"labels": lab} for name, spec in resolved.volumes.items() if not spec.get("external")}
    for name, svc in resolved.services.items():
        services[name] = {"labels": lab}
        mounted = {m.get("target") for m in svc.volumes}
        declared = (image_volumes or {}).get(svc.image, ())
        extra = [path for path in declared if path not in mounted]
        for i, path in enumerate(extra):
            mount: dict[str, Any] = {"type": "volume", "target": path, "volume": {"labels": own_labels}}
            if name not in per_container:
                mount = {"type": "volume", "source": f"forge-image-vol-{name}-{i}", "target": path}
                volumes[mount["source"]] = {"labels": lab}
            services[name].setdefault("volumes", []).append(mount)
        for m in (mounts or {}).get(name, ()):
            services[name].setdefault("volumes", []).append(dict(m))
        if (env := (environment or {}).get(name)) is not None:
            services[name]["environment"] = dict(env)
        services[name].update((process or {}).get(name) or {})
        ports = trial_ports(svc, (loopback or {}).get(name, ()))
        if ports is not None:
            services[name]["ports"] = ports
        if svc.container_name:
            services[name]["container_name"] = Reset()
        if name in (built or {}):
            services[name].update({"image": (built or {})[name], "build": Reset(), "pull_policy": "never"})
        if quiet_health and (health := quiet_healthcheck(svc.healthcheck)) is not None:
            services[name]["healthcheck"] = health
    networks: dict[str, Any] = {"default": {"labels": lab}}
    for name, spec in resolved.networks.items():
        if not spec.get("external"):
            networks[name] = {"labels": lab}
    out: dict[str, Any] = {"services": services, "networks": networks}
    if volumes:
        out["volumes"] = volumes
    return out


def trial_ports(service: ServiceConfig, loopback: Sequence[int] = ()) -> Override | None:
    """The service's ``ports`` for one trial (None: leave them alone, it publishes nothing).

    ``service``'s ports are as ``docker compose config`` prints them (long syntax). Every port it
    publishes keeps its container port and protocol but is bound to 127.0.0.1 at a host port the engine
    picks; each of ``loopback`` not already among them is added the same way. The list replaces the
    file's (``!override``; compose would otherwise add the fixed ports back)."""
    out = Override()
    for p in service.ports:
        kept = {k: v for k, v in p.items() if k not in ("published", "host_ip", "mode")}
        out.append({**kept, "host_ip": LOOPBACK})
    have = {(int(p["target"]), p.get("protocol", "tcp")) for p in out if "target" in p}
    out.extend(loopback_port(port) for port in loopback if (int(port), "tcp") not in have)
    return out or None


def loopback_port(container_port: int) -> dict[str, Any]:
    """A ``ports`` entry publishing ``container_port`` on 127.0.0.1 at a host port the engine picks."""
    return {"target": int(container_port), "host_ip": LOOPBACK, "protocol": "tcp"}


def build_override(images: Mapping[str, str], labels: Mapping[str, str]) -> dict[str, Any]:
    """The override ``docker compose build`` runs with (``forgelib.docker.builds``): each service's image
    named ``images[service]`` and labelled with ``labels``."""
    return {"services": {s: {"image": tag, "build": {"labels": dict(labels)}} for s, tag in images.items()}}


TRIAL_HEADER = "ownership labels, loopback ports at random host ports, no fixed names"
BUILD_HEADER = "build once per run"


def write_override(path: Path, doc: Mapping[str, Any], *, header: str = TRIAL_HEADER) -> Path:
    """Write ``doc`` (``labels_override``'s or ``build_override``'s) as a compose file, its
    ``!override``/``!reset`` tags intact: the one writer of a compose file forge generates."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = f"# generated by forgelib: {header}\n"
    path.write_text(text + yaml.dump(doc, Dumper=_OverrideDumper, sort_keys=True))
    return path


@dataclass(frozen=True)
class ImageProcess:
    """What an image starts by default and as whom (its ``docker image inspect`` Config)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    user: str = ""


@dataclass(frozen=True)
class ImageConfig:
    """What forge reads of an image: the VOLUME paths it declares and its default process."""

    volumes: tuple[str, ...] = ()
    process: ImageProcess = ImageProcess()


def inspect_images(runner: Runner, images: Sequence[str], timeout: float) -> dict[str, ImageConfig]:
    """image -> its ``ImageConfig``, for those of ``images`` present locally (one ``docker image
    inspect``; ``images.ImageFacts`` remembers the answers)."""
    todo = sorted({i for i in images if i})
    if not todo:
        return {}
    # rc 1 when some image is missing; stdout still lists the ones found.
    res = runner.run(dk.inspect(todo, kind="image"), timeout=timeout, check=False)
    try:
        found = json.loads(res.stdout or "[]")
    except json.JSONDecodeError:
        found = []
    out: dict[str, ImageConfig] = {}
    for info in found if isinstance(found, list) else []:
        cfg = info.get("Config") or {}
        process = ImageProcess(
            tuple(str(a) for a in cfg.get("Entrypoint") or ()),
            tuple(str(a) for a in cfg.get("Cmd") or ()),
            str(cfg.get("User") or ""),
        )
        config = ImageConfig(tuple(sorted(cfg.get("Volumes") or {})), process)
        tags = info.get("RepoTags") or []
        # `image: redis` in a compose file is `redis:latest` to the engine.
        for ref in [*tags, *(t.removesuffix(":latest") for t in tags), info.get("Id")]:
            if ref in todo:
                out[ref] = config
    return out


# ------------------------------------------------------------------------------------------ project


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The env overlay for compose calls: every ambient ``COMPOSE_*`` removed (``COMPOSE_PROJECT_NAME``
    or ``COMPOSE_FILE`` would silently retarget the call), then ``extra`` (the image env) merged."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("COMPOSE_")}
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class ComposeProject:
    """One compose project: every method is one ``docker compose`` call through the runner."""

    name: str
    files: tuple[Path, ...]
    runner: Runner
    timeouts: Timeouts = field(default_factory=Timeouts)
    image_env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None  # None: the first compose file's directory
    profiles: tuple[str, ...] = ()  # compose profiles to enable (the run config's `profiles`)
    # Values redacted from every call's log line and error (the services' passwords, once the config is
    # resolved: ``with_secrets``).
    secrets: frozenset[str] = frozenset()
    # ``exec`` straight into the service's container with ``docker exec`` (see ``exec``): set on a
    # provisioned stack, whose container names are known (the override drops any ``container_name``).
    direct: bool = False
    # service -> the name of the container that serves it, where that is not compose's first (a warm
    # stack's ephemeral services run in a new compose-numbered container every trial: forgelib.stacks.warm).
    containers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not is_valid_name(self.name):
            raise ValueError(f"invalid compose project name {self.name!r}")

    def with_files(self, *files: Path) -> ComposeProject:
        return dataclasses.replace(self, files=tuple(files))

    def with_secrets(self, config: Mapping[str, Any]) -> ComposeProject:
        """This project, redacting the secret-named environment values of every service in ``config``."""
        found = set(self.secrets)
        for svc in ResolvedConfig.of(config).services.values():
            found |= secret_values(svc.environment)
        return dataclasses.replace(self, secrets=frozenset(found))

    def run(
        self,
        args: Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        secrets: Iterable[str] = (),
        **kw: Any,
    ) -> Result:
        """One ``docker compose`` call, tagged with its verb (``args[0]``) so a stop can find it."""
        cwd = self.cwd or (self.files[0].parent if self.files else None)
        return self.runner.run(
            [*base_argv(self.name, self.files, self.profiles), *args],
            timeout=self.timeouts.command if timeout is None else timeout,
            env=clean_env(self.image_env),
            cwd=cwd,
            check=check,
            secrets=(*self.secrets, *secrets),
            tag=args[0] if args else "",
            **kw,
        )

    def config(self) -> dict[str, Any]:
        """The resolved configuration (interpolated, normalised: ``environment`` a dict, ``depends_on`` a
        dict of dicts)."""
        out = self.run(config_argv()).stdout
        data = json.loads(out)
        if not isinstance(data, dict):
            raise ForgeError(f"docker compose config printed {type(data).__name__}, not an object")
        return data

    def up(
        self,
        services: Sequence[str] = (),
        *,
        wait: bool = True,
        timeout: float | None = None,
        no_deps: bool = False,
        force_recreate: bool = False,
        no_start: bool = False,
        no_recreate: bool = False,
        scale: Mapping[str, int] | None = None,
    ) -> Result:
        """``no_deps``: start only ``services`` (their dependencies are up already); compose then skips
        re-checking those dependencies' health, which costs a healthcheck round per call.
        ``force_recreate``: new containers (and anonymous volumes) even where the old ones are up; the old
        ones are removed first, with their anonymous volumes (``remove``).
        ``no_start``: create the containers (networks, volumes) but start nothing.
        ``no_recreate`` with ``scale``: add containers (numbered on) beside the ones there, untouched."""
        limit = self.timeouts.compose_up if timeout is None else timeout
        if force_recreate:
            self.remove(services)
        wait_timeout = int(limit) if wait else None
        argv = up_argv(
            services,
            wait=wait,
            wait_timeout=wait_timeout,
            no_deps=no_deps,
            force_recreate=force_recreate,
            no_start=no_start,
            no_recreate=no_recreate,
            scale=scale,
        )
        return self.run(argv, timeout=limit + _WAIT_GRACE)

    def remove(self, services: Sequence[str] = ()) -> None:
        """Remove every container of ``services`` (all of them: every service), in any state, with its
        anonymous volumes. Compose's own recreate removes the old container without them, and with
        ``--renew-anon-volumes`` leaves them behind unlabelled, where no reaper can tell them from anyone's.
        A container already gone is fine; anything else the engine refuses raises."""
        ids = [cid for cid, _, svc in self.container_rows() if not services or svc in services]
        if not ids:
            return
        argv = dk.rm(ids, force=True, volumes=True)
        gone = self.runner.run(argv, timeout=self.timeouts.command, check=False)
        if gone.rc != 0 and "No such container" not in gone.stderr:
            raise CommandError(gone.argv, gone.rc, gone.stdout, gone.stderr)

    def down(
        self,
        *,
        volumes: bool = True,
        remove_orphans: bool = True,
        check: bool = True,
        stop_timeout: int | None = None,
    ) -> Result:
        """``stop_timeout``: seconds each container gets to stop before it is killed (None: compose's)."""
        return self.run(
            down_argv(volumes=volumes, remove_orphans=remove_orphans, timeout=stop_timeout),
            timeout=self.timeouts.teardown,
            check=check,
        )

    def stop(self, services: Sequence[str], *, timeout: float | None = None) -> Result:
        return self.run(stop_argv(services), timeout=timeout)

    def start(self, services: Sequence[str], *, timeout: float | None = None) -> Result:
        return self.run(start_argv(services), timeout=timeout)

    def exec(
        self,
        service: str,
        argv: Sequence[str],
        *,
        stdin: Path | None = None,
        input: str | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        check: bool = True,
        user: str | None = None,
        secrets: Sequence[str] = (),
        stdout_path: Path | None = None,
        stderr_path: Path | None = None,
    ) -> Result:
        """``argv`` in ``service``. With ``direct``, through ``docker exec`` into its container: the same
        process, environment and exit status as ``compose exec -T``, without the compose CLI's start and
        project load (paid on every oracle, check and judge input, seed recipe and warm reset); when
        the container is not there (or not running), through compose, whose message names the service.
        This is forge's one way to exec into a service's container: tagged ``exec``, so a stop kills it
        and refuses new ones (``Interrupted``), and the services' secrets are redacted from its log line
        and errors. Without ``stdin``/``input`` (or with empty ones) the command reads /dev/null.
        ``stdout_path``: the command's stdout goes to this file, never into memory (the result's is "");
        ``stderr_path``: its stderr too (the result keeps its tail)."""
        if self.direct:
            r = self._exec_direct(
                service, argv, stdin, input, timeout, env, workdir, user, secrets, stdout_path, stderr_path
            )
            if r is not None:
                if check and r.rc != 0:
                    failed = CommandError(r.argv, r.rc, r.stdout, r.stderr)
                    raise ServiceCommandError(failed, argv[0] if argv else "?", service)
                return r
        try:
            return self.run(
                exec_argv(service, argv, env=env, workdir=workdir, user=user),
                timeout=timeout,
                stdin=stdin,
                input=input,
                check=check,
                secrets=secrets,
                stdout_path=stdout_path,
                stderr_path=stderr_path,
            )
        except CommandTimeout:
            raise
        except CommandError as e:  # the cause first, then `psql` in service `app-db`, not the whole argv
            raise ServiceCommandError(e, argv[0] if argv else "?", service) from e

    def _exec_direct(
        self,
        service: str,
        argv: Sequence[str],
        stdin: Path | None,
        input: str | None,
        timeout: float | None,
        env: Mapping[str, str] | None,
        workdir: str | None,
        user: str | None,
        secrets: Sequence[str],
        stdout_path: Path | None,
        stderr_path: Path | None,
    ) -> Result | None:
        # -i only when there is something to read: Docker can lose the EOF of a stdin that ends while the
        # exec is still starting (moby#37870; under load a zero-byte write can hang until the timeout).
        # Without -i the process reads /dev/null, whose EOF nothing can lose.
        feeds = bool(input) or (stdin is not None and stdin.stat().st_size > 0)
        r = self.runner.run(
            dk.exec(self.container(service), argv, interactive=feeds, env=env, workdir=workdir, user=user),
            timeout=self.timeouts.command if timeout is None else timeout,
            stdin=stdin,
            input=input,
            check=False,
            secrets=(*self.secrets, *secrets),
            stdout_path=stdout_path,
            stderr_path=stderr_path,
            tag="exec",
        )
        if r.rc != 0 and _NO_CONTAINER.match(r.stderr.strip()):  # it never ran: compose says why
            return None
        return r

    def container(self, service: str) -> str:
        """The name of ``service``'s container: ``containers``' entry, else the first one, which compose v2
        names ``<project>-<service>-1`` (the override drops any ``container_name``)."""
        return self.containers.get(service) or f"{self.name}-{service}-1"

    def serves(self, service: str, container_id: str, container_name: str) -> bool:
        """Whether that container (of ``service``) is one the trial uses: the one ``containers`` names for
        the service (a warm stack's retired and spare containers are not), else every one of it."""
        current = self.containers.get(service)
        return current is None or current in (container_id, container_name)

    def build(self, services: Sequence[str], *, timeout: float | None = None) -> Result:
        return self.run(build_argv(services), timeout=timeout)

    def cp(self, src: str | Path, dst: str, *, timeout: float | None = None) -> Result:
        return self.run(cp_argv(str(src), dst), timeout=timeout)

    def port(self, service: str, container_port: int, *, protocol: str | None = None) -> tuple[str, int]:
        """Where the host reaches ``service:container_port``; a wildcard bind is reported as 127.0.0.1.
        ``docker port`` of the service's container (cheap, where ``compose port`` pays the compose CLI's
        start and project load, on every HTTP check and client); compose answers where that fails (no such
        container, nothing published), so the error names the service. Not for a service ``containers``
        names a container for (a warm stack's ephemeral one): compose could answer for another container of
        it (retired or spare), so that failure is the answer."""
        mapping = f"{container_port}/{protocol or 'tcp'}"
        ref = self.container(service)
        r = self.runner.run(dk.port(ref, mapping), timeout=self.timeouts.command, check=False)
        out = r.stdout.strip() if r.rc == 0 else ""
        if not out and service in self.containers:
            said = (r.stderr.strip() or r.stdout.strip() or f"exit status {r.rc}").splitlines()[-1]
            if r.rc == 0 or "No public port" in said:
                raise ForgeError(
                    f"service {service!r} does not publish container port {container_port} (container {ref})"
                )
            raise ForgeError(
                f"service {service!r}: where its container {ref} publishes port {mapping} could not be read"
                f" ({said})"
            )
        if not out:
            out = self.run(port_argv(service, container_port, protocol=protocol)).stdout.strip()
        found = published_address(out)
        if found is None:
            raise ForgeError(f"service {service!r} does not publish container port {container_port}")
        return found

    def ps(self, services: Sequence[str] = ()) -> list[dict[str, Any]]:
        """One dict per container (``Service``, ``State``, ``Publishers``, ...), stopped ones included."""
        return parse_ps(self.run(ps_argv(services)).stdout)

    def container_rows(self, status: str = "") -> list[tuple[str, str, str]]:
        """(id, name, service) of this stack's containers in ``status`` (any: ``""``), by compose's project
        label: one ``docker ps`` (no compose CLI start or project load). With ``inspect``, the
        only listing of a stack's containers (the warm stacks' ephemerals read it around every trial)."""
        fmt = '{{.ID}}\t{{.Names}}\t{{.Label "' + lab.COMPOSE_SERVICE + '"}}'
        only = ["--filter", f"status={status}"] if status else []
        filters = [*only, *lab.filters({lab.COMPOSE_PROJECT: self.name})]
        res = self.runner.run(
            dk.ps(all=True, no_trunc=True, filters=filters, format=fmt), timeout=self.timeouts.command
        )
        rows = [[*line.split("\t"), "", ""][:3] for line in res.stdout.splitlines()]
        return [(r[0], r[1], r[2]) for r in rows]

    def inspect(self, refs: Sequence[str] = ()) -> list[dict[str, Any]]:
        """The ``docker inspect`` records of this project's containers (``refs``: exactly these names or
        ids), found by compose's labels with one ``docker ps``: two docker CLI calls, where a compose call
        would add its CLI start and project load. ``compose run`` one-offs are not the
        stack's. A container gone meanwhile is simply absent; an engine that did not answer raises
        (CommandError), never looks like "no containers"."""
        ids = list(refs)
        if not ids:
            only = {lab.COMPOSE_PROJECT: self.name, lab.COMPOSE_ONEOFF: "False"}
            argv = dk.ps(all=True, quiet=True, no_trunc=True, filters=lab.filters(only))
            ids = self.runner.run(argv, timeout=self.timeouts.command).stdout.split()
        if not ids:
            return []
        # rc 1 when one went meanwhile; stdout still holds the others ("[]" when all went)
        res = self.runner.run(dk.inspect(ids), timeout=self.timeouts.command, check=False)
        try:
            found = json.loads(res.stdout or "")
        except json.JSONDecodeError:
            if res.rc != 0:
                raise CommandError(res.argv, res.rc, res.stdout, res.stderr) from None
            return []
        return [f for f in found if isinstance(f, dict)] if isinstance(found, list) else []

    def service_states(self, services: Sequence[str] = ()) -> dict[str, list[tuple[str, str]]]:
        """service -> ``(status, health)`` of each of its containers (``"running"``, ``"exited"``, ...;
        health ``""`` without a healthcheck) the trial uses (``served``: a warm stack's retired and spare
        containers are not), from ``inspect`` (cheaper than ``compose ps``); only ``services`` when
        given. A service without a container is absent. An engine that did not answer raises (a
        ForgeError), so a failed look is never taken for stopped containers."""
        out: dict[str, list[tuple[str, str]]] = {}
        for svc, infos in self.served(services).items():
            for info in infos:
                state = info.get("State") or {}
                health = str((state.get("Health") or {}).get("Status") or "")
                out.setdefault(svc, []).append((str(state.get("Status") or ""), health))
        return out

    def served(
        self, services: Sequence[str] = (), found: Sequence[Mapping[str, Any]] | None = None
    ) -> dict[str, list[Mapping[str, Any]]]:
        """service -> the ``docker inspect`` records of the containers the trial uses for it (``serves``:
        on a warm stack, not its retired or spare ones), by name; only ``services`` when given. From
        ``found`` (records a caller just inspected), else one ``inspect``. A service without one is absent;
        an engine that did not answer raises, as ``inspect`` does."""
        out: dict[str, list[Mapping[str, Any]]] = {}
        records = self.inspect() if found is None else found
        for info in sorted(records, key=lambda i: str(i.get("Name", ""))):
            if lab.HELPER in lab.of_inspect(info):
                continue
            svc = str(lab.of_inspect(info).get(lab.COMPOSE_SERVICE, "?"))
            if services and svc not in services:
                continue
            if self.serves(svc, str(info.get("Id")), str(info.get("Name", "")).lstrip("/")):
                out.setdefault(svc, []).append(info)
        return out

    def published_ports(self) -> dict[str, list[str]]:
        """service -> ["127.0.0.1:49153->5432/tcp", ...] (IPv4/IPv6 duplicates folded) for every service
        with a container; a service served by a given container (``containers``) lists that one's only."""
        out: dict[str, list[str]] = {}
        for svc, infos in self.served().items():
            ports = out.setdefault(svc, [])
            for info in infos:
                ports += [p for p in published_of_inspect(info) if p not in ports]
        return out

    def container_logs(self, ref: str, dest: Path, *, tail: int | None = None) -> Result:
        """One container's (``ref``: id or name) last ``tail`` log lines into ``dest``, stdout and stderr
        merged in order as compose's ``logs`` shows them, streamed to the file (never held in memory);
        ``tail`` None or 0: the whole log (``--tail 0`` would capture nothing). ``docker logs`` reads the
        engine's log file directly, where a ``compose logs`` call adds its CLI start and project load (per
        service, every trial)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        argv = dk.logs(ref, tail=tail or None)
        return self.runner.run(
            argv, timeout=self.timeouts.command, stdout_path=dest, stderr_path=dest, check=False
        )

    def service_log(self, containers: Sequence[Mapping[str, Any]], dest: Path, *, tail: int | None) -> None:
        """A service's log into ``dest``, from ``containers`` (its ``served`` records): one container's
        ``container_logs``; several (replicas) each under a ``==> name <==`` header, as tail(1) shows
        files; none (never created): an empty file. forge's one way to read a service's log: the trial's
        captured logs and every log tail in an error message."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        if len(containers) <= 1:
            if containers:
                self.container_logs(str(containers[0].get("Id")), dest, tail=tail)
            else:
                dest.write_bytes(b"")
            return
        with dest.open("wb") as out:
            for info in containers:
                cid, name = str(info.get("Id")), str(info.get("Name", "")).lstrip("/")
                part = dest.parent / f".{dest.name}.{cid[:12]}.part"
                try:
                    self.container_logs(cid, part, tail=tail)
                    out.write(f"==> {name} <==\n".encode())
                    with part.open("rb") as f:
                        shutil.copyfileobj(f, out)
                finally:
                    part.unlink(missing_ok=True)

    def log_tail(self, service: str, lines: int) -> str:
        """The last ``lines`` log lines of ``service``'s container(s) as text (``service_log``), for error
        messages (never raises: it explains a failure)."""
        try:
            with tempfile.TemporaryDirectory(prefix="forge-log-") as tmp:
                path = Path(tmp) / f"{service}.log"
                self.service_log(self.served([service]).get(service, []), path, tail=lines)
                return path.read_text(errors="replace").rstrip()
        except (ForgeError, OSError) as e:
            return f"(could not read the log: {e})"


def published_of_inspect(info: Mapping[str, Any]) -> list[str]:
    """A container's published ports from its ``docker inspect`` record, as ``published_ports`` lists them
    (``NetworkSettings.Ports``: ``{"8000/tcp": [{"HostIp": ..., "HostPort": ...}]}``; a created container,
    never started, has none yet)."""
    out: list[str] = []
    for spec, binds in sorted(((info.get("NetworkSettings") or {}).get("Ports") or {}).items()):
        target, _, proto = str(spec).partition("/")
        for b in binds or []:
            if str(b.get("HostPort") or "0") != "0":
                text = _port_text(str(b.get("HostIp") or ""), b["HostPort"], target, proto or "tcp")
                if text not in out:
                    out.append(text)
    return out


def published_address(out: str) -> tuple[str, int] | None:
    """The first address ``docker port`` (or ``compose port``) printed, a wildcard bind as 127.0.0.1; None
    when it printed none (some compose versions print ":0" for "not published")."""
    line = out.strip().splitlines()[0].strip() if out.strip() else ""
    host, _, port = line.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return None
    return _loopback(host), int(port)


def _loopback(host: str) -> str:
    host = host.strip("[]")
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def _port_text(host: str, published: Any, target: Any, protocol: Any) -> str:
    return f"{_loopback(host)}:{published}->{target}/{protocol or 'tcp'}"


def parse_ps(out: str) -> list[dict[str, Any]]:
    """``ps --format json``: a JSON array (compose < 2.21) or one object per line (later)."""
    out = out.strip()
    if not out:
        return []
    if out.startswith("["):
        rows = json.loads(out)
    else:
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [r for r in rows if isinstance(r, dict)]
