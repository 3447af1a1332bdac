"""The runner's fast path: a few docker CLI calls answered by the local Docker Engine API instead.

Each docker CLI call starts a Go binary that costs far more CPU than the request it sends; forge makes
dozens of small ones (inspect, ps, start, port) per trial, many on the critical path. ``answer`` takes an
argv the runner was asked to run and, when it is one of the forms below and the engine is the local unix
socket the CLI would use, sends the same request over that socket (stdlib ``http.client``; the handful of
endpoints does not warrant the ``docker`` SDK) and shapes what the CLI would print: the same rc, the same
stdout for callers to parse, and the same error texts on stderr. Anything else, or any surprise (no
socket, an unexpected status or body, a container ``docker inspect`` would look for among other objects),
returns ``None``: the runner runs the CLI as ever. ``FORGE_ENGINE_API=0`` turns it off.

The forms (flags in the order ``forgelib/docker/argv.py`` writes them):

* ``docker inspect [--format {{json .State}}] REF...`` (containers)
* ``docker image inspect [--format T] REF...`` (``T``: one of ``IMAGE_FORMATS``)
* ``docker ps [--all] [--quiet] [--no-trunc] [--filter K=V]... [--format T]`` (``--quiet`` or a ``T``
  made of ``{{.ID}}``, ``{{.Names}}``, ``{{.Label "k"}}`` and plain text)
* ``docker start REF...``, ``docker pause REF...``, ``docker unpause REF...``
* ``docker port REF PORT/PROTO``
* ``docker rm [--force] [--volumes] REF...``, ``docker network disconnect [--force] NETWORK CONTAINER``
* ``docker stats --no-stream --format {{.Name}}\t{{.MemUsage}} REF...`` (one sample each: the CLI waits
  for two, about a second, to work out a CPU share this form does not print)

On the base floor beside the runner (stdlib only), so the runner consults it without importing upward.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SWITCH = "FORGE_ENGINE_API"  # "0": every docker call goes to the CLI
DEFAULT_SOCKET = "/var/run/docker.sock"
_DAEMON = "Error response from daemon: "
_STATE_FORMAT = "{{json .State}}"
_PS_FIELD = re.compile(r'\{\{\s*(\.ID|\.Names|\.Label\s+"([^"]*)")\s*\}\}')
_PS_ANY_ACTION = re.compile(r"\{\{|\}\}")


@dataclass(frozen=True)
class Answer:
    """What the CLI would have returned."""

    rc: int
    stdout: str
    stderr: str


class EngineTimeout(Exception):
    """The engine did not answer within the call's timeout (the runner raises its ``CommandTimeout``)."""


class _Refused(Exception):
    """Not a form answered here, or a surprise: the CLI answers."""


# ------------------------------------------------------------------------------------------ the engine


def local_socket(env: Mapping[str, str]) -> str | None:
    """The unix socket this module may ask under ``env`` (``cli_socket``), or None when the docker CLI would
    talk to anything else, pins an API version, or the switch is off."""
    if env.get(SWITCH, "").strip() == "0" or env.get("DOCKER_API_VERSION"):
        return None
    return cli_socket(env)


def cli_socket(env: Mapping[str, str]) -> str | None:
    """The unix socket of this host's engine that the docker CLI talks to under ``env``, or None when it
    talks to anything else: a remote or tcp ``DOCKER_HOST``, a context chosen by ``DOCKER_CONTEXT`` or by
    the CLI config's ``currentContext``."""
    if env.get("DOCKER_CONTEXT", "default") not in ("", "default"):
        return None
    host = env.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return None
    if not host and _config_context(env) not in ("", "default"):
        return None
    return host.removeprefix("unix://") or DEFAULT_SOCKET


_config_cache: dict[tuple[str, int], str] = {}


def _config_context(env: Mapping[str, str]) -> str:
    """The CLI config's ``currentContext`` ("" without one); a config that cannot be read counts as a
    context (the CLI would fail on it, or know something we do not)."""
    base = env.get("DOCKER_CONFIG") or str(Path(env.get("HOME") or Path.home()) / ".docker")
    path = Path(base) / "config.json"
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return ""
    except OSError:
        return "?"
    key = (str(path), mtime)
    known = _config_cache.get(key)
    if known is not None:
        return known
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
        ctx = data.get("currentContext", "") if isinstance(data, dict) else "?"
    except (OSError, ValueError):
        ctx = "?"
    ctx = ctx if isinstance(ctx, str) else "?"
    _config_cache.clear()  # one config at a time: a changed one replaces it
    _config_cache[key] = ctx
    return ctx


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


@dataclass
class _Engine:
    """One socket's requests, with the API version it speaks (asked once)."""

    path: str
    deadline: float
    version: str = ""
    sent: bool = False  # a request that may have changed something went out: no CLI retry after this

    def api_version(self) -> str:
        if not self.version:
            self.version = _api_version(self)
        return self.version

    def request(
        self, method: str, url: str, query: Mapping[str, str] | None = None, body: Any = None
    ) -> tuple[int, Any]:
        """(status, decoded JSON body or None) of ``method /vX.Y{url}`` (``body``: sent as JSON)."""
        return self._send(method, f"/v{self.api_version()}{url}", query, body)

    def _send(
        self, method: str, url: str, query: Mapping[str, str] | None = None, body: Any = None
    ) -> tuple[int, Any]:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise EngineTimeout
        if query:
            url += "?" + urllib.parse.urlencode(query)
        conn = _UnixConnection(self.path, left)
        try:
            try:
                if body is None:
                    conn.request(method, url, headers={"Host": "docker"})
                else:
                    data = json.dumps(body).encode()
                    conn.request(method, url, data, {"Host": "docker", "Content-Type": "application/json"})
            except (FileNotFoundError, ConnectionRefusedError, PermissionError) as e:
                raise _Refused(f"no engine at {self.path}: {e}") from None
            if method != "GET":
                self.sent = True
            resp = conn.getresponse()
            answer = resp.read()
        except TimeoutError:
            raise EngineTimeout from None
        finally:
            conn.close()
        if not answer.strip():
            return resp.status, None
        try:
            return resp.status, json.loads(answer)
        except ValueError:
            raise _Refused(f"{method} {url}: a body that is not JSON") from None


_versions: dict[str, str] = {}
_versions_lock = threading.Lock()


def _api_version(engine: _Engine) -> str:
    with _versions_lock:
        known = _versions.get(engine.path)
    if known:
        return known
    status, body = engine._send("GET", "/version")
    version = body.get("ApiVersion") if status == 200 and isinstance(body, dict) else None
    if not isinstance(version, str) or not re.fullmatch(r"\d+\.\d+", version):
        raise _Refused("the engine's /version names no API version")
    with _versions_lock:
        _versions[engine.path] = version
    return version


def _message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    raise _Refused("an error without a message")


def _ref(ref: str) -> str:
    """``ref`` as a path segment, as the docker client writes it (an image's ``/`` and ``:`` stay)."""
    return urllib.parse.quote(ref, safe="/:@")


# ------------------------------------------------------------------------------------------- the forms

Form = Callable[[_Engine], Answer]


def recognize(argv: Sequence[str]) -> Form | None:
    """The form ``argv`` is, ready to be answered by an engine; None when the CLI must answer it."""
    if len(argv) < 2 or argv[0] != "docker":
        return None
    verb, rest = argv[1], list(argv[2:])
    try:
        if verb == "inspect":
            return _inspect_form(rest)
        if verb == "image" and rest[:1] == ["inspect"]:
            return _image_inspect_form(rest[1:])
        if verb == "ps":
            return _ps_form(rest)
        if verb in ("start", "pause", "unpause"):
            return _act_form(verb, rest)
        if verb == "port":
            return _port_form(rest)
        if verb == "rm":
            return _rm_form(rest)
        if verb == "network" and rest[:1] == ["disconnect"]:
            return _disconnect_form(rest[1:])
        if verb == "stats":
            return _stats_form(rest)
    except _Refused:
        return None
    return None


def _plain_refs(refs: Sequence[str]) -> list[str]:
    if not refs or any(not r or r.startswith("-") for r in refs):
        raise _Refused("flags or no refs")
    return list(refs)


def _inspect_form(rest: list[str]) -> Form:
    state_only = rest[:2] == ["--format", _STATE_FORMAT]
    refs = _plain_refs(rest[2:] if state_only else rest)

    def form(engine: _Engine) -> Answer:
        found = []
        for ref in refs:
            status, body = engine.request("GET", f"/containers/{_ref(ref)}/json")
            if status != 200 or not isinstance(body, dict):
                # not a container: the CLI goes on to images, networks, volumes... under that name
                raise _Refused(f"inspect {ref}: {status}")
            found.append(body)
        if state_only:
            if not all(isinstance(b.get("State"), dict) for b in found):
                raise _Refused("a container without a State")
            return Answer(0, "".join(_compact(b["State"]) + "\n" for b in found), "")
        return Answer(0, _indented(found), "")

    return form


def _image_line(template: str, image: dict[str, Any]) -> str:
    """One of the templates forge gives ``docker image inspect --format``, filled as Go's would be."""
    iid, config = image.get("Id"), image.get("Config")
    if not isinstance(iid, str):
        raise _Refused("an image without an Id")
    if template == "{{.Id}}":
        return iid
    if template == "{{.Id}} {{.Size}}" and type(image.get("Size")) is int:
        return f"{iid} {image['Size']}"
    if template == "{{.Id}} {{len .RepoTags}}" and isinstance(image.get("RepoTags"), list):
        return f"{iid} {len(image['RepoTags'])}"
    if template == "{{.Id}} {{json .Config.Labels}}" and isinstance(config, dict):
        labels = config.get("Labels")
        if labels is None or isinstance(labels, dict):
            return f"{iid} {_compact(labels, sort_keys=True)}"  # a Go map: its keys in order
    raise _Refused(f"image inspect --format {template!r}")


IMAGE_FORMATS = (
    "{{.Id}}",
    "{{.Id}} {{.Size}}",
    "{{.Id}} {{len .RepoTags}}",
    "{{.Id}} {{json .Config.Labels}}",
)


def _image_inspect_form(rest: list[str]) -> Form:
    template = rest[1] if rest[:1] == ["--format"] and len(rest) > 1 else ""
    if template and template not in IMAGE_FORMATS:
        raise _Refused(f"image inspect --format {template!r}")
    refs = _plain_refs(rest[2:] if template else rest)

    def form(engine: _Engine) -> Answer:
        found, errors = [], []
        for ref in refs:
            status, body = engine.request("GET", f"/images/{_ref(ref)}/json")
            if status == 200 and isinstance(body, dict):
                found.append(body)
            elif status == 404:
                errors.append(_DAEMON + _message(body))
            else:
                raise _Refused(f"image inspect {ref}: {status}")
        out = "".join(_image_line(template, b) + "\n" for b in found) if template else _indented(found)
        return Answer(1 if errors else 0, out, "".join(e + "\n" for e in errors))

    return form


def _act_form(verb: str, rest: list[str]) -> Form:
    refs = _plain_refs(rest)

    def form(engine: _Engine) -> Answer:
        out, errors, failed = [], [], []
        for ref in refs:
            status, body = engine.request("POST", f"/containers/{_ref(ref)}/{verb}")
            if status in (204, 304):
                out.append(ref)
            elif 400 <= status < 600:
                errors.append(_DAEMON + _message(body))
                failed.append(ref)
            else:
                raise _Refused(f"{verb} {ref}: {status}")
        err = "".join(e + "\n" for e in errors)
        if failed and verb == "start":
            err += f"Error: failed to start containers: {', '.join(failed)}\n"
        return Answer(1 if failed else 0, "".join(r + "\n" for r in out), err)

    return form


def _rm_form(rest: list[str]) -> Form:
    flags = [a for a in rest if a.startswith("-")]
    if flags not in ([], ["--force"], ["--volumes"], ["--force", "--volumes"]) or rest[: len(flags)] != flags:
        raise _Refused(f"rm {flags}")
    refs = _plain_refs(rest[len(flags) :])
    query = {"force": "1" if "--force" in flags else "0", "v": "1" if "--volumes" in flags else "0"}

    def form(engine: _Engine) -> Answer:
        out, errors, notes = [], [], []
        for ref in refs:
            status, body = engine.request("DELETE", f"/containers/{_ref(ref)}", query)
            if status == 204:
                out.append(ref)
            elif status == 404 and "--force" in flags:  # forced: gone already is fine, and said
                notes.append(_DAEMON + _message(body))
            elif 400 <= status < 600:
                errors.append(_DAEMON + _message(body))
            else:
                raise _Refused(f"rm {ref}: {status}")
        err = "".join(e + "\n" for e in notes + errors)
        return Answer(1 if errors else 0, "".join(r + "\n" for r in out), err)

    return form


def _disconnect_form(rest: list[str]) -> Form:
    force = rest[:1] == ["--force"]
    args = rest[1:] if force else rest
    if len(args) != 2 or any(not a or a.startswith("-") for a in args):
        raise _Refused("not [--force] NETWORK CONTAINER")
    network, container = args

    def form(engine: _Engine) -> Answer:
        body = {"Container": container, "Force": force}
        status, said = engine.request("POST", f"/networks/{_ref(network)}/disconnect", body=body)
        if status == 200:
            return Answer(0, "", "")
        if 400 <= status < 600:
            return Answer(1, "", _DAEMON + _message(said) + "\n")
        raise _Refused(f"network disconnect: {status}")

    return form


def _port_form(rest: list[str]) -> Form:
    if len(rest) != 2 or rest[0].startswith("-") or not re.fullmatch(r"\d+/(tcp|udp|sctp)", rest[1]):
        raise _Refused("not REF PORT/PROTO")
    ref, mapping = rest

    def form(engine: _Engine) -> Answer:
        status, body = engine.request("GET", f"/containers/{_ref(ref)}/json")
        if status == 404:
            return Answer(1, "", _DAEMON + _message(body) + "\n")
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("NetworkSettings"), dict):
            raise _Refused(f"port {ref}: {status}")
        ports = body["NetworkSettings"].get("Ports") or {}
        if not isinstance(ports, dict):
            raise _Refused("Ports is not a mapping")
        binds = ports.get(mapping) or []
        lines = [_join_host_port(str(b.get("HostIp", "")), str(b.get("HostPort", ""))) for b in binds]
        if not lines:
            return Answer(1, "", f"Error: No public port '{mapping}' published for {ref}\n")
        return Answer(0, "".join(line + "\n" for line in lines), "")

    return form


MEMORY_FORMAT = "{{.Name}}\t{{.MemUsage}}"
_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")


def _stats_form(rest: list[str]) -> Form:
    if rest[:3] != ["--no-stream", "--format", MEMORY_FORMAT]:
        raise _Refused("stats: not the memory form")
    refs = _plain_refs(rest[3:])

    def one(engine: _Engine, ref: str) -> tuple[int, Any]:
        query = {"stream": "false", "one-shot": "true"}
        return engine.request("GET", f"/containers/{_ref(ref)}/stats", query)

    def form(engine: _Engine) -> Answer:
        if tuple(int(n) for n in engine.api_version().split(".")) < (1, 41):
            raise _Refused("one-shot stats need API 1.41")  # an older engine would take two samples
        # All at once, as the CLI asks: the engine answers each at its stats collector's next tick
        with ThreadPoolExecutor(max_workers=min(len(refs), 16)) as pool:
            replies = list(pool.map(lambda ref: one(engine, ref), refs))
        lines = []
        for ref, (status, body) in zip(refs, replies, strict=True):
            if status == 404:  # the CLI prints nothing then, not even the containers it found
                return Answer(1, "", _DAEMON + _message(body) + "\n")
            if status != 200 or not isinstance(body, dict) or not isinstance(body.get("memory_stats"), dict):
                raise _Refused(f"stats {ref}: {status}")
            name = str(body.get("name") or "")
            mem = body["memory_stats"]
            used, limit = _memory_used(mem), float(mem.get("limit") or 0)
            lines.append(f"{name[1:] if len(name) > 1 else '--'}\t{_bytes_size(used)} / {_bytes_size(limit)}")
        return Answer(0, "".join(line + "\n" for line in lines), "")

    return form


def _memory_used(mem: Mapping[str, Any]) -> float:
    """The CLI's figure: the usage without the inactive page cache (cgroup v1's ``total_inactive_file``,
    else ``inactive_file``), so that files read once do not count as the container's memory."""
    usage = int(mem.get("usage") or 0)
    stats = mem.get("stats") or {}
    v1 = stats.get("total_inactive_file")
    if v1 is not None and int(v1) < usage:
        return float(usage - int(v1))
    inactive = int(stats.get("inactive_file") or 0)
    return float(usage - inactive) if inactive < usage else float(usage)


def _bytes_size(size: float) -> str:
    """As the CLI's ``units.BytesSize``: four significant digits and a binary unit (``536KiB``)."""
    unit = 0
    while size >= 1024 and unit < len(_BINARY_UNITS) - 1:
        size /= 1024
        unit += 1
    return f"{size:.4g}{_BINARY_UNITS[unit]}"


def _join_host_port(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class _PsOptions:
    all: bool = False
    quiet: bool = False
    no_trunc: bool = False
    filters: dict[str, dict[str, bool]] = field(default_factory=dict)
    format: str = ""


def _ps_form(rest: list[str]) -> Form:
    o = _PsOptions()
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg in ("--all", "--quiet", "--no-trunc"):
            setattr(o, arg[2:].replace("-", "_"), True)
            i += 1
        elif arg in ("--filter", "--format") and i + 1 < len(rest):
            value = rest[i + 1]
            if arg == "--format":
                o.format = value
            else:
                key, eq, val = value.partition("=")
                if not eq or not key:
                    raise _Refused("a filter without =")
                o.filters.setdefault(key.strip().lower(), {})[val.strip()] = True
            i += 2
        else:
            raise _Refused(f"ps {arg}")
    if o.quiet and o.format:
        raise _Refused("ps --quiet --format")
    template = "{{.ID}}" if o.quiet else o.format
    pieces = _ps_template(template)

    def form(engine: _Engine) -> Answer:
        query = {"all": "1"} if o.all else {}
        if o.filters:
            query["filters"] = json.dumps(o.filters, separators=(",", ":"))
        status, body = engine.request("GET", "/containers/json", query)
        if status != 200 or not isinstance(body, list):
            raise _Refused(f"ps: {status}")
        lines = [_ps_line(pieces, c, not o.no_trunc) for c in body]
        return Answer(0, "".join(line + "\n" for line in lines), "")

    return form


def _ps_template(template: str) -> list[tuple[str, str]]:
    """``template`` as ("text", s) / ("ID"|"Names", "") / ("Label", key) pieces; refused when it holds any
    other action (the CLI's Go template answers those)."""
    pieces: list[tuple[str, str]] = []
    at = 0
    for m in _PS_FIELD.finditer(template):
        pieces.append(("text", template[at : m.start()]))
        if m[2] is not None:
            pieces.append(("Label", m[2]))
        else:
            pieces.append((m[1][1:], ""))
        at = m.end()
    pieces.append(("text", template[at:]))
    fields = [k for k, _ in pieces if k != "text"]
    if (
        not fields
        or template.startswith("table")
        or any(k == "text" and _PS_ANY_ACTION.search(s) for k, s in pieces)
    ):
        raise _Refused(f"ps --format {template!r}")
    return [p for p in pieces if p != ("text", "")]


def _ps_line(pieces: list[tuple[str, str]], c: Any, trunc: bool) -> str:
    if not isinstance(c, dict):
        raise _Refused("a ps row that is not an object")
    out = []
    for kind, arg in pieces:
        if kind == "text":
            out.append(arg)
        elif kind == "ID":
            cid = str(c.get("Id", ""))
            out.append(cid[:12] if trunc else cid)
        elif kind == "Names":
            names = [str(n).removeprefix("/") for n in c.get("Names") or []]
            if trunc:  # the CLI shows a container's own name, not the names links gave it
                names = next(([n] for n in names if "/" not in n), names)
            out.append(",".join(names))
        else:
            out.append(str((c.get("Labels") or {}).get(arg, "")))
    return "".join(out)


def _indented(items: list[Any]) -> str:
    """A JSON list as the CLI prints inspect records (its default format: indented 4)."""
    return json.dumps(items, indent=4) + "\n"


def _compact(value: Any, *, sort_keys: bool = False) -> str:
    """As the CLI templates' ``json`` function prints a value (UTF-8, no HTML escapes)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)


# --------------------------------------------------------------------------------------------- the call


def answer(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Answer | None:
    """What ``argv`` would have returned, asked of the engine; None when the CLI must run it.

    Raises ``EngineTimeout`` when the engine did not answer within ``timeout`` seconds.
    """
    form = recognize(argv)
    if form is None:
        return None
    path = local_socket(os.environ if env is None else env)
    if path is None:
        return None
    engine = _Engine(path, time.monotonic() + timeout)
    try:
        return form(engine)
    except _Refused:
        if engine.sent:  # something may have changed: what the CLI would say about a lost engine
            return Answer(1, "", f"error during connect: the engine at {path} stopped answering\n")
        return None
    except (ConnectionError, http.client.HTTPException) as e:
        if engine.sent:
            return Answer(1, "", f"error during connect: {e}\n")
        return None
