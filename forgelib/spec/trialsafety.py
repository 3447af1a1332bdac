"""Is a compose file trial-safe? What forge changes in each trial's stack (notes), what stays risky
(warnings) and what it refuses (errors), each located at the line that says it.

Parallel trials each start their own copy of the stack, so anything a compose file pins to one place on
the host breaks the second copy or lets trials see each other. forge's override fixes what it can
(``compose.labels_override``: published ports, ``container_name``; ``build:`` is built once per run); the
rest is refused where it defeats a reset, or warned about where it is only risky. The table in
docs/compose.md ("Bring your own compose file") lists the same rules.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from forgelib.errors import SpecIssue
from forgelib.kinds import DIRECTORY_SEEDS
from forgelib.spec.composefiles import ComposeSet, ServiceDef, Written
from forgelib.spec.models import Isolation

LOOPBACK = "127.0.0.1"
NOTE = "note"
WARNING = "warning"
ERROR = "error"
PER_TRIAL = (Isolation.RESET, Isolation.EPHEMERAL)
_HOST_NAMESPACES = {
    "network_mode": (
        "shares the host's network: every trial's copy binds the same host ports and reaches the others",
        "remove it and publish what the host needs with ports: (forge maps each to a random 127.0.0.1 "
        "port per trial)",
    ),
    "pid": (
        "shares the host's process table: a trial sees and can signal every process on the machine, other "
        "trials' included",
        "remove it",
    ),
    "ipc": ("shares the host's IPC namespace with every trial", "remove it"),
}


def check_trial_safety(cset: ComposeSet, isolation: Mapping[str, Isolation]) -> list[SpecIssue]:
    """Every note, warning and error for the stack ``cset`` with the services' ``isolation`` (unlabelled
    services are ephemeral)."""
    out: list[SpecIssue] = list(_port_notes(cset))
    for name, sdef in cset.services.items():
        iso = isolation.get(name, Isolation.EPHEMERAL)
        out.extend(_changes(sdef))
        out.extend(_host_namespaces(sdef, iso))
        out.extend(_mounts(cset, sdef, iso))
        out.extend(_networks(cset, sdef, iso))
        priv = sdef.last("privileged")
        if priv is not None and priv.value is True:
            out.append(
                priv.issue(
                    f"service {name!r} is privileged: it gets the host's devices and kernel capabilities, "
                    "so a trial can change the machine every other trial runs on; drop privileged or grant "
                    "only what it needs with cap_add",
                    severity=WARNING,
                )
            )
    return out


# key -> what forge's override does with it ({value}: the key's value as written)
_NOTES = {
    "container_name": "container_name {value!r} is dropped (one name exists once per engine, so a second "
    "trial could not start); compose names the container <project>-<service>-1",
    "build": "built once per run before its first trial (not per trial); the image is labelled with the run "
    "and removed when the run ends",
}


def _changes(sdef: ServiceDef) -> Iterator[SpecIssue]:
    """What forge's override changes (notes): the user should know, nothing is wrong."""
    for key, note in _NOTES.items():
        if (w := sdef.last(key)) is not None:
            yield w.issue(f"service {sdef.name!r}: " + note.format(value=w.value), severity=NOTE)


def _port_notes(cset: ComposeSet) -> Iterator[SpecIssue]:
    """One note per compose file listing the ports it pins to a host port or address, which forge moves to
    127.0.0.1 at a random host port per trial. A bare container port (``ports: ["8000"]``, the form the
    examples use) already asks for that, so it is not mentioned."""
    moved: dict[str, list[tuple[str, Written]]] = {}
    for name, sdef in cset.services.items():
        for w in sdef.items("ports"):
            if _pins_host_side(w.value):
                moved.setdefault(w.doc.display, []).append((name, w))
    for entries in moved.values():
        shown = ", ".join(
            f"{name} {_port_text(w.value)} -> 127.0.0.1:<random>:{_container_port(w.value)}"
            for name, w in entries
        )
        first = entries[0][1]
        yield first.issue(
            "forge publishes each port on 127.0.0.1 at a random host port per trial, not at the fixed "
            f"host port or address written here: {shown}; trial.yaml (ports) and `forge provision` show "
            'where each lands; write a bare container port (ports: ["8000"]) to drop this note',
            severity=NOTE,
        )


def _pins_host_side(item: Any) -> bool:
    """Whether a ``ports`` entry names a host port or a host address other than 127.0.0.1."""
    if isinstance(item, dict):
        return bool(item.get("published")) or item.get("host_ip") not in (None, "", LOOPBACK)
    parts = str(item).split("/")[0].rsplit(":", 2)
    if len(parts) == 1:
        return False  # a bare container port
    host_port = parts[-2]
    host_ip = parts[0] if len(parts) == 3 else ""
    return bool(host_port) or host_ip.strip("[]") not in ("", LOOPBACK)


def _host_namespaces(sdef: ServiceDef, iso: Isolation) -> Iterator[SpecIssue]:
    for key, (why, fix) in _HOST_NAMESPACES.items():
        w = sdef.last(key)
        if w is None or str(w.value) != "host":
            continue
        if iso in PER_TRIAL:
            yield w.issue(
                f"service {sdef.name!r} ({iso.value}) has {key}: host, which {why}; {fix}", severity=ERROR
            )
        else:
            yield w.issue(
                f"service {sdef.name!r} has {key}: host, which {why}; {fix} (allowed for a shared service, "
                "but every per-trial stack still starts its own copy)",
                severity=WARNING,
            )


def _mounts(cset: ComposeSet, sdef: ServiceDef, iso: Isolation) -> Iterator[SpecIssue]:
    for w in sdef.items("volumes"):
        kind, source, target, read_only = _mount(w.value)
        if kind == "volume" and source in cset.volumes and _external(cset.volumes[source].value):
            what = (
                f"service {sdef.name!r} mounts external volume {source!r} at {target}: every trial's stack "
                "uses the same volume"
            )
            if iso is Isolation.RESET:
                yield w.issue(
                    f"{what}, so no trial starts from the seed; use a volume the compose file declares "
                    "(forge creates one per trial) or take the service out of isolation: reset",
                    severity=ERROR,
                )
            else:
                yield w.issue(f"{what}, so trials see each other's writes", severity=WARNING)
        elif kind == "bind" and not read_only and iso in PER_TRIAL:
            yield w.issue(
                f"service {sdef.name!r} ({iso.value}) bind-mounts host path {source} at {target} writable: "
                "every trial writes the same host files; mount it read-only (:ro) or copy the files in "
                f"with a {' or '.join(sorted(DIRECTORY_SEEDS))} seed",
                severity=WARNING,
            )


def _networks(cset: ComposeSet, sdef: ServiceDef, iso: Isolation) -> Iterator[SpecIssue]:
    w = sdef.last("networks")
    if w is None:
        return
    names = list(w.value) if isinstance(w.value, (list, dict)) else []
    for i, net in enumerate(names):
        spec = cset.networks.get(str(net))
        if spec is None or not _external(spec.value):
            continue
        at = Written(net, w.doc, (*w.at, net if isinstance(w.value, dict) else i))
        what = (
            f"service {sdef.name!r} joins external network {net!r}: every trial's stack joins the same "
            "network, so a service name can resolve to another trial's container"
        )
        if iso is Isolation.RESET:
            yield at.issue(
                f"{what}; a reset service must be reachable only in its own trial: use a network the compose "
                "file declares (forge creates one per trial)",
                severity=ERROR,
            )
        else:
            yield at.issue(what, severity=WARNING)


def _external(spec: Any) -> bool:
    return isinstance(spec, dict) and bool(spec.get("external"))


def _mount(item: Any) -> tuple[str, str, str, bool]:
    """(type, source, target, read_only) of a service volume entry, short or long syntax."""
    if isinstance(item, dict):
        kind = str(item.get("type", "volume"))
        return kind, str(item.get("source", "")), str(item.get("target", "")), bool(item.get("read_only"))
    parts = _volume_fields(str(item))
    if len(parts) == 1:
        return "anonymous", "", parts[0], False
    source, target = parts[0], parts[1]
    options = parts[2].split(",") if len(parts) > 2 else []
    kind = "bind" if source.startswith((".", "/", "~", "$")) else "volume"
    return kind, source, target, "ro" in options


def _volume_fields(text: str) -> list[str]:
    """A short-syntax volume split on its colons, but not those inside ``${...}``: the compose files are
    read as written (not interpolated), and a variable's default or message can hold a colon
    (``${DATA:?set DATA}:/data``, ``${DATA:-./data}:/data``). ``$$`` is an escaped dollar sign."""
    fields: list[str] = []
    field: list[str] = []
    depth = 0
    i = 0
    while i < len(text):
        if text.startswith(("$$", "${"), i):
            if text[i + 1] == "{":
                depth += 1
            field.append(text[i : i + 2])
            i += 2
            continue
        c = text[i]
        i += 1
        if c == ":" and not depth:
            fields.append("".join(field))
            field = []
            continue
        if c == "}" and depth:
            depth -= 1
        field.append(c)
    fields.append("".join(field))
    return fields


def _port_text(item: Any) -> str:
    if isinstance(item, dict):
        pub = item.get("published")
        return f"{pub}:{item.get('target')}" if pub else str(item.get("target"))
    return str(item)


def _container_port(item: Any) -> str:
    """The container side of a ports entry (``8000`` of ``127.0.0.1:8080:8000/tcp``)."""
    if isinstance(item, dict):
        return str(item.get("target"))
    text = str(item).split("/")[0]
    return text.rsplit(":", 1)[-1]
