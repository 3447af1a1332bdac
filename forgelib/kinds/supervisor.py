"""A data-directory service's server run under a small ``sh`` loop, the same in every mode forge starts it in,
so that its exact warm reset can restart the server inside its own container: the data directory put back
in between, without stopping the container, copying through a helper and starting it again.

The server is its container's main process (a postgres image's entrypoint ``exec``s it), so stopping the
server stops the container. When a kind asks for it (postgres and mysql with the exact reset: their
``warm_process``), every override forge writes for the service (a fresh stack, a warm one, one from a
golden, a fork) runs the service's own entrypoint and command under the loop instead (``wrap``:
``SUPERVISOR``): it starts them as its child, forwards every signal Docker sends it (``docker stop`` ends
the server, then the loop, as before), and exits with the server's status whenever the server ends on its
own. Only a request forge makes (``Supervised``, through ``docker exec`` as root) makes it stop the server,
put the data directory back from its pristine copy (``datadir.RESTORE_SCRIPT``; the first time: keep the
copy) and start the same command again.

What a trial can see of it is the same in a fresh stack and a restored one, by construction: the loop as
the container's first process, with the same command line, and one directory ``/forge`` (root's, mode
0700) holding one directory ``s`` (root's, 0700) in which the loop keeps its files and the copy. So
``/forge``'s mode, owner, link count and size never change, whatever a reset keeps in ``s``; the server's
user (the only one a trial reaches, through the server) can look into neither, and the reset's fingerprint
checks the restored content anyway.

``wrap`` declines (None: the service runs as its image says, and the exact reset falls back to the helper
container's ``datadir.PristineDir``) when the service runs as another user than root (the loop could not
keep its files from the server), when the image's entrypoint and command are unknown (not present
locally), or when they hold a ``$`` (compose would interpolate it). The decision reads only the service's
config and its image, so it is the same in every mode.
"""

from __future__ import annotations

import posixpath
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from forgelib.docker import argv as dk
from forgelib.docker.compose import ImageProcess
from forgelib.docker.resolved import ServiceConfig
from forgelib.errors import CommandError
from forgelib.kinds import checkpointcopy
from forgelib.kinds.base import ApplyContext, CheckpointCopy
from forgelib.kinds.datadir import RESTORE_SCRIPT, SYNC_SCRIPT, check_path

MARKER = "forge-supervise"  # the loop's $0: how forge recognises a supervised container
CONTROL = "/forge"  # root's, 0700, always holding exactly STATE: its stat is the same in every mode
STATE = "/forge/s"  # the loop's files and the pristine copy

# Its arguments: the service's own entrypoint and command. A request: ``req`` and its files (the signal that
# stops the server, the restore script, data directory, marker and sync script, the request's own pid)
# written, then SIGUSR1; the answer: one line on the ``ack`` FIFO, ``ok`` or why not (then the loop exits 3
# and the container with it). SIGUSR1 without a request is the server's, as any other signal. Once the
# server has exited, every other process in the container but the loop and the request is killed, as
# stopping the container would: nothing a trial started there (``COPY … TO PROGRAM '… &'``) outlives the
# reset to change the restored data directory. A stop that came during a restore ends the loop instead of
# starting the server again.
SUPERVISOR = (
    "c=/forge/s; "
    'mkdir -p "$c" && chmod 700 /forge "$c" && rm -f "$c/ack" "$c/req" && mkfifo "$c/ack" '
    '&& echo "$$" > "$c/pid" || exit 3; '
    "req=; stop=; pid=; "
    'fwd() { [ -z "$pid" ] || kill -"$1" "$pid" 2>/dev/null; }; '
    'trap \'if [ -e "$c/req" ]; then req=1; fwd "$(cat "$c/signal")"; else fwd USR1; fi\' USR1; '
    "trap 'stop=1; fwd INT' INT; trap 'stop=1; fwd TERM' TERM; trap 'stop=1; fwd QUIT' QUIT; "
    "trap 'fwd HUP' HUP; trap 'fwd USR2' USR2; "
    '"$@" & pid=$!; '
    "while :; do "
    'wait "$pid"; rc=$?; '
    'if kill -0 "$pid" 2>/dev/null; then continue; fi; '
    'if [ -n "$stop" ] || [ -z "$req" ]; then exit "$rc"; fi; '
    'req=; r=$(cat "$c/rpid"); '
    'for p in /proc/[0-9]*; do p="${p#/proc/}"; '
    '[ "$p" = "$$" ] || [ "$p" = "$r" ] || kill -KILL "$p" 2>/dev/null; done; '
    'if out=$(sh "$c/script" "$(cat "$c/dir")" "$(cat "$c/marker")" "$(cat "$c/sync")" "$c" 2>&1); '
    "then st=ok; "
    'else st="failed: $(printf %s "$out" | tr "\\n" " ")"; fi; '
    'rm -f "$c/req"; echo "$st" > "$c/ack"; '
    '[ "$st" = ok ] || exit 3; '
    '[ -z "$stop" ] || exit 0; '
    '"$@" & pid=$!; '
    "done"
)

# Run by ``docker exec`` as root: hand the loop a request and wait for its answer.
_REQUEST = (
    "c=/forge/s; "
    '[ -p "$c/ack" ] && [ -s "$c/pid" ] || { echo "no forge supervisor in it" >&2; exit 3; }; '
    'printf %s "$1" > "$c/script"; printf %s "$2" > "$c/dir"; printf %s "$3" > "$c/marker"; '
    'printf %s "$4" > "$c/sync"; printf %s "$5" > "$c/signal"; echo "$$" > "$c/rpid"; : > "$c/req"; '
    'kill -USR1 "$(cat "$c/pid")"; '
    'read -r st < "$c/ack"; [ "$st" = ok ] || { echo "$st" >&2; exit 3; }'
)

_ROOT = ("", "0", "root")


def wrap(service: ServiceConfig, image: ImageProcess | None) -> dict[str, Any] | None:
    """The override's ``entrypoint`` and ``command`` running ``service``'s own process under the loop, or
    None when it cannot (see the module's docstring)."""
    if image is None:
        return None
    user = service.user or image.user
    if user.split(":")[0] not in _ROOT:
        return None
    # compose's rule: a service's own entrypoint drops the image's CMD unless it sets a command too
    own = service.entrypoint
    entrypoint = own if own is not None else image.entrypoint
    command = service.command or (() if own is not None else image.cmd)
    argv = [*entrypoint, *command]
    if not argv or any("$" in a for a in argv):
        return None
    script = SUPERVISOR.replace("$", "$$")  # the override is a compose file: `$$` is a literal `$`
    return {"entrypoint": ["sh", "-c", script, MARKER], "command": argv}


def supervised(info: Mapping[str, Any]) -> bool:
    """Whether the container (its ``docker inspect``) runs its process under the loop."""
    ep = (info.get("Config") or {}).get("Entrypoint") or []
    return len(ep) == 4 and ep[:2] == ["sh", "-c"] and ep[3] == MARKER


@dataclass
class Supervised:
    """A supervised service's data directory ``path``; its pristine copy is in the container, root's.

    ``stop``: the signal that stops the server cleanly, before the copy is taken. ``kill``: the one that
    stops it for a reset, at once: whatever the stopped server left (unflushed pages, its pid file) is
    undone by the restore like a trial's changes, so it needs no shutdown checkpoint; it must still end
    the server's children before the server exits (postgres's SIGQUIT does)."""

    ctx: ApplyContext
    path: str
    container: str
    marker: str
    stop: str
    kill: str

    @classmethod
    def capture(
        cls,
        ctx: ApplyContext,
        path: str,
        *,
        marker: str = "PG_VERSION",
        stop: str = "INT",
        kill: str = "QUIT",
    ) -> Supervised | None:
        """Keep the copy (the server restarts once), or None when the service's container is not
        supervised (``wrap`` declined): the caller falls back to ``datadir.PristineDir``."""
        check_path(ctx, path)
        container = ctx.compose.container(ctx.service)
        found = ctx.compose.inspect([container])
        if not found or not supervised(found[0]):
            return None
        s = cls(ctx, path, container, marker, stop, kill)
        s.request("prepare", stop)
        return s

    @property
    def restarts_container(self) -> bool:
        return False  # the same container, the same host ports

    def restore(self, *, healthcheck: bool = True) -> None:
        """Stop the server, put back what changed in its data directory, start it again; returns once the
        loop started it (``healthcheck``: ``PristineDir``'s signature; the kind waits for its server)."""
        self.request("reset", self.kill)

    def request(self, step: str, signal: str, script: str = RESTORE_SCRIPT) -> None:
        """Ask the loop to stop the server with ``signal``, run ``script`` on the data directory (the
        warm reset's restore by default) and start it again; ``step`` names a failure's step."""
        args = [script, self.path, self.marker, SYNC_SCRIPT, signal]
        argv = dk.exec(self.container, ["sh", "-c", _REQUEST, "forge-reset", *args], user="0")
        try:
            self.ctx.compose.runner.run(argv, timeout=self.ctx.timeouts.recipe, tag="exec")
        except CommandError as e:  # the scripts would bury the reason: the loop's answer and the rc only
            why = e.stderr_tail.strip() or e.reason
            raise self.ctx.fail(
                step, f"restoring {self.path} in {self.container} failed ({e.reason}): {why}"
            ) from e


# ---------------------------------------------------------------------------------- checkpoints
#
# A checkpoint's restore in place is the same request with another copy: the checkpoint's captured
# directory, staged once per container in ``STATE`` (``c-<key>/data``, complete once ``.done`` exists),
# where the loop restores from. ``RESTORE_SCRIPT`` pointed there: the first time (no ``.stamp`` yet, so
# ``find -cnewer`` fails) it empties the data directory and copies the whole capture in; every later
# restore from the same copy puts back only what changed since the last one, as the warm reset does. A
# warm reset or a restore from another copy in between changes the files it touches after this copy's
# stamp, so those are put back too. The clock is then moved past the stamp, as the warm reset's
# incremental path does, so that nothing the restarted server writes shares the stamp's tick.
_STAGED_SCRIPT = (
    'set -- "$1" "$2" "$3" "$4/c-{key}"; '
    '[ -e "$4/.done" ] || {{ echo "no staged copy in $4" >&2; exit 3; }}; {restore}; {tick}'
)
_TICK = (
    'p="$4"; touch "$p/.tick"; until [ -n "$(find "$p/.tick" -newer "$p/.stamp")" ]; '
    'do sleep 0.001; touch "$p/.tick"; done'
)
# Put a copy ``docker cp`` wrote into ``$1`` (its top directory named ``$3``) in place as ``$2``.
_STAGE_SCRIPT = (
    'set -e; t="$1"; p="$2"; b="$3"; [ "$b" = data ] || mv "$t/$b" "$t/data"; '
    '[ -d "$t/data" ]; touch "$t/.done"; rm -rf "$p"; mv "$t" "$p"'
)
_staged_lock = threading.Lock()
_staged: set[tuple[str, str]] = set()  # (container ID, key): staged by this process


def restore_copy(
    ctx: ApplyContext,
    info: Mapping[str, Any],
    copy: CheckpointCopy,
    *,
    marker: str = "PG_VERSION",
    kill: str = "QUIT",
) -> bool:
    """Put the data directory ``copy.path`` of the supervised container ``info`` (its ``docker
    inspect``) back at ``copy``'s content, in place: staged first if this container has no copy of it
    (``checkpointcopy.read``, ``docker cp`` in), then the loop's request with the staged copy. False
    when the container is not supervised (the caller restores another way); returns once the loop
    started the server again (the kind waits for it)."""
    check_path(ctx, copy.path)
    if not supervised(info):
        return False
    container = str(info.get("Id"))
    key = "".join(c for c in copy.key if c in "0123456789abcdef")[:32]
    if not key:
        raise ctx.fail("restore", f"checkpoint copy key {copy.key!r} holds no hex digits")
    staged = f"{STATE}/c-{key}"
    _stage(ctx, container, copy, key, staged)
    s = Supervised(ctx, copy.path, container, marker, "INT", kill)
    script = _STAGED_SCRIPT.format(key=key, restore=RESTORE_SCRIPT, tick=_TICK)
    s.request("restore", kill, script)
    return True


def _stage(ctx: ApplyContext, container: str, copy: CheckpointCopy, key: str, staged: str) -> None:
    with _staged_lock:
        if (container, key) in _staged:
            return
    runner, t = ctx.compose.runner, ctx.timeouts
    probe = dk.exec(container, ["test", "-e", f"{staged}/.done"], user="0")
    if runner.run(probe, timeout=t.command, check=False, tag="exec").rc != 0:
        tmp = f"{STATE}/t-{key}"
        try:
            prep = dk.exec(
                container, ["sh", "-c", 'rm -rf "$1" && mkdir -p "$1"', "forge-stage", tmp], user="0"
            )
            runner.run(prep, timeout=t.command, tag="exec")
            with checkpointcopy.as_file(checkpointcopy.read(ctx, copy)) as tar:
                cp = dk.cp("-", f"{container}:{tmp}", archive=True)
                runner.run(cp, stdin=tar, timeout=t.recipe, tag="cp")
            top = posixpath.basename(copy.path.rstrip("/"))
            done = dk.exec(container, ["sh", "-c", _STAGE_SCRIPT, "forge-stage", tmp, staged, top], user="0")
            runner.run(done, timeout=t.recipe, tag="exec")
        except CommandError as e:
            raise ctx.fail(
                "restore", f"could not stage {copy.path} of {copy.image} in {container}: {e}"
            ) from e
    with _staged_lock:
        _staged.add((container, key))
