"""``docker compose config`` once per run for every stack of the same environment, not once per stack.

Every stack a run provisions resolves its compose files (``ComposeProject.config``): a compose CLI start on
the path of every trial, for an answer that differs between two stacks of the same environment only in
the project name. ``ConfigMemo.config`` asks compose once, under a placeholder name no file can contain
(``compose.unique_name``), and gives every stack that answer with the placeholder replaced by its own name
(``compose.renamed``): wherever compose put the name (the project's ``name``, the networks' and volumes'
names it derives, ``${COMPOSE_PROJECT_NAME}`` interpolated in a value) it is text. Stacks of one
environment asking at once (a fork's) wait for that one answer.

The key is everything compose reads to resolve the files, so an answer is reused only while none of it
changed: the compose files' paths and contents, the ``.env`` of the project directory, every ``env_file``
and ``label_file`` the services name (by content; absent is a value too), the profiles, the working
directory and the whole environment the call runs with (interpolation may read any variable). Files that
pull in other files compose would read (``include``, ``extends`` from a file) or a referenced path that is
interpolated (``${...}``) are not followed: such an environment is resolved by compose every time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from forgelib.docker.compose import ComposeProject, clean_env, renamed, unique_name
from forgelib.runner import merged_env

DOTENV = ".env"


class ConfigMemo:
    """Resolved compose configs by ``key``, one owner's (a run's ``ProvisionCache``): thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[str, tuple[str, dict[str, Any]]] = {}  # key -> (the placeholder, its answer)
        self._asking: dict[str, threading.Lock] = {}  # key -> held while compose is asked for it

    def config(self, compose: ComposeProject) -> dict[str, Any]:
        """``compose.config()``, from the memo when the same files, referenced files and environment were
        resolved before; a fresh dict every call (callers may change it)."""
        k = key(compose)
        if k is None:
            return compose.config()
        with self._lock:
            asking = self._asking.setdefault(k, threading.Lock())
        with asking:
            with self._lock:
                known = self._answers.get(k)
            if known is None:
                placeholder = unique_name()
                known = (placeholder, dataclasses.replace(compose, name=placeholder).config())
                with self._lock:
                    self._answers[k] = known
        placeholder, answer = known
        out: dict[str, Any] = renamed(answer, placeholder, compose.name)
        return out


def key(compose: ComposeProject) -> str | None:
    """The digest of everything ``docker compose config`` reads for ``compose`` but its project name, or
    None when that cannot be told from here (see the module doc): then compose is asked every time."""
    files = [Path(f).resolve() for f in compose.files]
    if not files:
        return None
    cwd = (compose.cwd or files[0].parent).resolve()
    parts: dict[str, Any] = {
        "files": [],
        "referenced": [],
        "dotenv": [_content(files[0].parent / DOTENV), _content(cwd / DOTENV)],
        "cwd": str(cwd),
        "profiles": list(compose.profiles),
        "env": sorted(merged_env(clean_env(compose.image_env)).items()),
    }
    for f in files:
        try:
            raw = f.read_bytes()
            doc = yaml.safe_load(raw)
        except (OSError, yaml.YAMLError):
            return None  # compose says what is wrong with it
        parts["files"].append([str(f), hashlib.sha256(raw).hexdigest()])
        refs = _referenced(doc)
        if refs is None:
            return None
        for ref in refs:  # relative to the project directory, as compose reads it, or to its own file
            for base in dict.fromkeys([files[0].parent, f.parent, cwd]):
                path = (base / ref).resolve()
                parts["referenced"].append([str(path), _content(path)])
    if None in parts["dotenv"] or any(c is None for _, c in parts["referenced"]):
        return None
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _referenced(doc: Any) -> list[str] | None:
    """The files a compose document's services name for compose to read (``env_file``, ``label_file``), or
    None when it names files this module does not follow (``include``, ``extends`` a file, a path with
    ``$``)."""
    if doc is None:
        return []
    if not isinstance(doc, Mapping) or "include" in doc:
        return None
    services = doc.get("services") or {}
    if not isinstance(services, Mapping):
        return None
    out: list[str] = []
    for svc in services.values():
        if not isinstance(svc, Mapping):
            return None
        extends = svc.get("extends")
        if isinstance(extends, Mapping) and "file" in extends:
            return None
        for field in ("env_file", "label_file"):
            for path in _paths(svc.get(field)):
                if path is None or "$" in path:
                    return None
                out.append(path)
    return out


def _paths(value: Any) -> Iterator[str | None]:
    """The paths of an ``env_file``-like value (a string, or a list of strings or ``{path: ...}``); None for
    an entry of another shape."""
    items: Sequence[Any] = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if value is not None and not isinstance(value, str | list):
        yield None
    for item in items:
        if isinstance(item, str):
            yield item
        elif isinstance(item, Mapping) and isinstance(item.get("path"), str):
            yield str(item["path"])
        else:
            yield None


def _content(path: Path) -> str | None:
    """A referenced file by content: its sha256, ``absent`` (compose may accept a missing one), or None when
    it cannot be read from here (a directory, no permission): then no key."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return "absent"
    except OSError:
        return None
