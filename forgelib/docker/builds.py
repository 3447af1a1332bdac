"""Images of ``build:`` services: built once per run, before the first trial that needs them, and removed
when the run ends.

Compose would build per compose project, so per trial: N trials, N builds of the same context, N images
left behind. Instead the first trial that needs a service's image builds it (``docker compose build`` with
an override naming the image ``forgelib-build/<project>-<service>:<run>-<hash>`` and labelling it with the
run's labels); the trials running beside it wait for that build, and every trial's override points the
service at the image with ``build`` removed, so ``up`` never builds. A failed build fails every trial of
the run the same way, at once, without building again. ``finish`` removes the images when the run ends,
Ctrl-C included (``docker image rm`` is not a launch, so a stopping runner still runs it); a SIGKILLed run
leaves its image, labelled with its run, owner and the compose project of the trial that built it, which
``forge reap`` removes once the owner is provably gone (never while a container uses it). A stack kept by
``forge provision --keep`` keeps its image until ``forge teardown`` removes both.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from forgelib.docker import argv as dk
from forgelib.docker import labels as lab
from forgelib.docker.compose import (
    BUILD_HEADER,
    ComposeProject,
    build_override,
    sanitize_name,
    write_override,
)
from forgelib.docker.resolved import ResolvedConfig
from forgelib.errors import ForgeError, Interrupted, ProvisionError
from forgelib.runner import Runner

BUILD_FILE = "compose.forge-build.yaml"
REPOSITORY = "forgelib-build"


def build_services(config: Mapping[str, Any]) -> list[str]:
    """The services of a resolved config that compose would build."""
    return [s.name for s in ResolvedConfig.of(config).services.values() if s.build]


class Builds:
    """The run's built images: (compose files, service) -> image tag, or the error its build ended with."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one build at a time; trials needing it wait instead of rebuilding
        self._done: dict[tuple[str, str], str | ProvisionError] = {}

    def images(
        self,
        project: str,
        compose: ComposeProject,
        config: Mapping[str, Any],
        labels: Mapping[str, str],
        work_dir: Path,
        timeout: float,
    ) -> dict[str, str]:
        """service -> image for every ``build:`` service of ``config``, building those not built yet."""
        wanted = build_services(config)
        if not wanted:
            return {}
        files = "\n".join(str(f) for f in compose.files)
        run_id = labels.get(lab.RUN, "run")
        with self._lock:
            todo = {s: _tag(project, files, s, run_id) for s in wanted if (files, s) not in self._done}
            if todo:
                self._build(compose, todo, labels, work_dir, timeout, files)
            out: dict[str, str] = {}
            for s in wanted:
                got = self._done[(files, s)]
                if isinstance(got, ProvisionError):
                    raise ProvisionError(got.stage, got.reason)
                out[s] = got
            return out

    def _build(
        self,
        compose: ComposeProject,
        todo: Mapping[str, str],
        labels: Mapping[str, str],
        work_dir: Path,
        timeout: float,
        files: str,
    ) -> None:
        override = write_override(work_dir / BUILD_FILE, build_override(todo, labels), header=BUILD_HEADER)
        try:
            compose.with_files(*compose.files, override).build(list(todo), timeout=timeout)
        except Interrupted:  # Ctrl-C is no broken Dockerfile: nothing cached, nothing blamed
            raise
        except ForgeError as e:
            err = ProvisionError(
                "build",
                f"building service(s) {', '.join(todo)} failed (built once for the whole run, so every trial "
                f"of it fails the same way); fix the Dockerfile or its context and run again: {e}",
            )
            for s in todo:
                self._done[(files, s)] = err
            raise ProvisionError(err.stage, err.reason) from e
        for s, tag in todo.items():
            self._done[(files, s)] = tag

    def built(self) -> list[str]:
        return sorted({t for t in self._done.values() if isinstance(t, str)})

    def finish(self, runner: Runner, timeout: float) -> None:
        """Remove the run's images (a failed removal is reported; the labels let ``forge reap`` retry)."""
        with self._lock:
            tags = self.built()
            self._done.clear()
        if tags:
            res = runner.run(dk.rm(tags, kind="image"), timeout=timeout, check=False)
            if res.rc != 0 and "No such image" not in res.stderr:
                raise ForgeError(
                    f"removing the run's built images {', '.join(tags)} failed: {res.stderr.strip()}"
                )


def built_images(runner: Runner, labels: Mapping[str, str], *, timeout: float = 60.0) -> list[str]:
    """Ids of the images built here (``REPOSITORY``) that carry all of ``labels``: what ``forge teardown``
    removes with a kept stack and ``forge reap`` with a dead owner's."""
    filters = ["--filter", f"reference={REPOSITORY}/*", *lab.filters(labels)]
    out = runner.run(dk.ls("image", quiet=True, no_trunc=True, filters=filters), timeout=timeout).stdout
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


def _tag(project: str, files: str, service: str, run_id: str) -> str:
    """``forgelib-build/<project>-<service>:<run id>-<hash of the files and service>``."""
    digest = hashlib.sha256(f"{files}\n{service}".encode()).hexdigest()[:8]
    run = re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)[:100]
    return f"{REPOSITORY}/{sanitize_name(f'{project}-{service}')}:{run}-{digest}"
