"""A service's data directory restored whole from a pristine copy that no trial can see or reach.

Used by the seed kinds whose server owns a data directory (``sql_dump``'s default, ``exact`` warm reset)
where ``kinds.supervisor`` cannot run the server under its loop (which restarts it in place instead):
right after the first seeding the service's container is stopped (its server shuts down cleanly), a helper
container copies the data directory into its own writable layer, and the service starts again. A reset
stops the service, has the helper put back from the pristine copy what changed in the data directory since
the last copy (contents, owners, modes; whatever a trial added is gone; ``RESTORE_SCRIPT``), and starts the
service again.

The helper is created from the service's own image (it has ``sh``, ``find`` and ``cp``), with the service's
volumes (``--volumes-from``), no network, and never started by anyone else: nothing of it is inside the
service's container or on a network a trial is on. The copy lives in the helper's own container layer,
never on a volume of its own: ``down --remove-orphans`` removes an orphan container without its volumes,
so an anonymous volume at ``/forge-pristine`` outlived every warm stack. It carries the service
container's ``io.forgelib`` labels (the reaper finds it after a crash) and compose's project labels with a
service name the project does not have, so ``down --remove-orphans`` removes it like any orphan (compose
counts a container as the project's only with a config-hash label).

The service's server must be its container's main process (a postgres image's entrypoint ``exec``s it):
stopping the container is how the server stops. Its published host ports change on every start, so a
reset drops the context's cached addresses, and what holds a ``PristineDir`` says ``restarts_container``
(``PreparedSeed.restarts``): the pool reads the service's published ports again for the trial's record.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from forgelib.docker import argv as dk
from forgelib.docker import labels as lab
from forgelib.docker import readiness
from forgelib.errors import CommandError, ForgeError, Interrupted
from forgelib.kinds.base import ApplyContext

# First start (no copy yet): keep one, and stamp it. Every later start puts back what changed since the last
# stamp: a file or directory whose inode changed after it (``find -cnewer``: the ctime, which no one can set
# back, unlike the mtime ``touch -d`` sets) is copied back from the copy, or removed when the copy has no such
# path; a changed directory also gets the copy's entries back and loses the ones the copy lacks (a new or
# removed database, a renamed file). The stamp is taken while the service is stopped, and the script ends only
# once the clock has moved past it, so whatever its server writes later is newer. Only GNU find tells a ctime
# (``-cnewer``, ``-printf``): with another find (busybox) the whole directory is emptied and copied back. The
# copy is complete only once ``.done`` exists, so a helper killed mid-copy is never restored from. Its
# arguments: the data directory, the marker file, ``SYNC_SCRIPT``, and where the copy is kept (the
# helper's ``/forge-pristine`` unless told otherwise: ``kinds.supervisor`` keeps it in ``/forge``).
RESTORE_SCRIPT = (
    'set -e; d="$1"; p="${4:-/forge-pristine}"; '
    'if [ ! -e "$p/.done" ]; then rm -rf "$p/data"; mkdir -p "$p/data"; cp -a "$d/." "$p/data/"; '
    'touch "$p/.stamp" "$p/.done"; '
    'elif find "$d" -maxdepth 0 -cnewer "$p/.stamp" -printf \'\' 2>/dev/null; then '
    'find "$d" -cnewer "$p/.stamp" -printf \'%P\\0\' > "$p/.list"; touch "$p/.stamp"; '
    'xargs -0 -r sh -c "$3" forge-restore "$p/data" "$d" < "$p/.list" > "$p/.copy"; '
    '(cd "$p/data" && xargs -0 -r cp -a --parents -t "$d" < "$p/.copy"); '
    'touch "$p/.tick"; until [ -n "$(find "$p/.tick" -newer "$p/.stamp")" ]; '
    'do sleep 0.001; touch "$p/.tick"; done; '
    'else find "$d" -mindepth 1 -delete; cp -a "$p/data/." "$d/"; touch "$p/.stamp"; fi; '
    '[ -s "$d/$2" ] || { echo "no $2 in $d after the copy" >&2; exit 3; }'
)
# One batch of changed paths (relative to the data directory): removed when the copy lacks them; a regular
# file in both is printed (NUL-ended) for one ``cp --parents`` of them all; a directory in both gets the
# copy's entries, owner and mode; anything else (a type changed) is replaced by the copy's.
SYNC_SCRIPT = (
    'p="$1"; d="$2"; shift 2; '
    'for r; do t="$d/$r"; s="$p/$r"; '
    '[ -e "$t" ] || [ -L "$t" ] || continue; '
    'if [ ! -e "$s" ] && [ ! -L "$s" ]; then rm -rf "$t" || exit 1; continue; fi; '
    'if [ -f "$s" ] && [ ! -L "$s" ] && [ -f "$t" ] && [ ! -L "$t" ]; then printf "%s\\000" "$r"; '
    'elif [ -d "$s" ] && [ ! -L "$s" ] && [ -d "$t" ] && [ ! -L "$t" ]; then '
    'for e in "$t"/* "$t"/.[!.]* "$t"/..?*; do [ -e "$e" ] || [ -L "$e" ] || continue; n="${e##*/}"; '
    '[ -e "$s/$n" ] || [ -L "$s/$n" ] || rm -rf "$e" || exit 1; done; '
    'for e in "$s"/* "$s"/.[!.]* "$s"/..?*; do [ -e "$e" ] || [ -L "$e" ] || continue; n="${e##*/}"; '
    '[ -e "$t/$n" ] || [ -L "$t/$n" ] || cp -a "$e" "$t/$n" || exit 1; done; '
    'chown --reference="$s" "$t" && chmod --reference="$s" "$t" || exit 1; '
    'else rm -rf "$t" && cp -a "$s" "$t" || exit 1; fi; done'
)


@dataclass
class PristineDir:
    """The helper container holding ``path``'s pristine copy for ``service`` of ``ctx``'s stack."""

    ctx: ApplyContext
    path: str  # the data directory in the service's container
    container: str  # the service's container (name)
    helper: str  # the helper container (name)

    @classmethod
    def capture(cls, ctx: ApplyContext, path: str, *, marker: str = "PG_VERSION") -> PristineDir:
        """Stop the service, keep a copy of ``path`` in a new helper container, start the service again.
        ``marker``: a file every valid data directory holds (checked after each copy)."""
        check_path(ctx, path)
        compose = ctx.compose
        container = compose.container(ctx.service)
        helper = f"{compose.name}-forge-pristine-{ctx.service}"
        info = _inspect(ctx, container)
        labels = {k: v for k, v in lab.of_inspect(info).items() if k.startswith("io.forgelib.")}
        labels.update(
            {
                lab.COMPOSE_PROJECT: compose.name,
                lab.COMPOSE_SERVICE: f"{ctx.service}-forge-pristine",
                lab.COMPOSE_ONEOFF: "False",
                lab.COMPOSE_CONFIG_HASH: "forge-pristine",
                lab.HELPER: "pristine-data",
            }
        )
        argv = dk.create(
            str(info.get("Image")),
            ["-c", RESTORE_SCRIPT, "forge-pristine", path, marker, SYNC_SCRIPT],
            name=helper,
            network="none",
            user="0",
            volumes_from=container,
            entrypoint="sh",
            label=[f"{k}={v}" for k, v in sorted(labels.items())],
        )
        p = cls(ctx, path, container, helper)
        try:
            p._docker(argv)
        except CommandError as e:
            raise ctx.fail("prepare", f"could not create the pristine-copy helper for {path}: {e}") from e
        p._cycle("prepare")
        return p

    @property
    def restarts_container(self) -> bool:
        return True  # `docker start` publishes its ports on new host ports

    def restore(self, *, healthcheck: bool = True) -> None:
        """Stop the service, put the pristine copy back in place of its data directory, start it again.
        ``healthcheck=False``: return once it runs, for a kind that waits for its server itself (one
        connection on the new port says more, and sooner, than the healthcheck's ``docker exec``)."""
        self._cycle("reset", healthcheck=healthcheck)

    def _cycle(self, step: str, *, healthcheck: bool = True) -> None:
        t = self.ctx.timeouts
        try:
            self._docker(dk.stop([self.container]), timeout=t.teardown)
        except CommandError as e:
            raise self.ctx.fail(step, f"could not stop {self.container}: {e}") from e
        try:
            self._docker(dk.start([self.helper], attach=True), timeout=t.recipe)
        except CommandError as e:
            hint = ""
            if step == "prepare":  # the helper sees the service's volumes only
                hint = (
                    f" ({self.path} must be on a volume of the service, as the image's VOLUME is;"
                    " or reset this service with `strategy: template`)"
                )
            raise self.ctx.fail(step, f"copying {self.path} (helper {self.helper}) failed{hint}: {e}") from e
        try:
            self._docker(dk.start([self.container]), timeout=t.compose_up)
        except CommandError as e:
            raise self.ctx.fail(step, f"could not start {self.container} again: {e}") from e
        # A new host port for every published container port (``docker start`` allocates them anew).
        for key in [k for k in self.ctx.addresses if k[0] == self.ctx.service]:
            del self.ctx.addresses[key]
        if not healthcheck:
            return
        try:  # ready as a fresh stack's service is: its own healthcheck passes
            refs = [self.container]
            readiness.wait_ready(self.ctx.compose, [self.ctx.service], refs=refs, timeout=t.compose_up)
        except Interrupted:
            raise
        except ForgeError as e:
            raise self.ctx.fail(step, f"{self.container} did not become ready again: {e}") from e

    def _docker(self, argv: list[str], *, timeout: float | None = None) -> None:
        compose = self.ctx.compose
        compose.runner.run(
            argv, timeout=compose.timeouts.command if timeout is None else timeout, tag=argv[1]
        )


def check_path(ctx: ApplyContext, path: str) -> None:
    """A data directory must be absolute and not ``/`` (a reset empties what changed in it)."""
    if not path.startswith("/") or posixpath.normpath(path) in ("/", ""):
        raise ctx.fail("prepare", f"data directory {path!r} must be an absolute path other than '/'")


def _inspect(ctx: ApplyContext, container: str) -> dict[str, Any]:
    found = ctx.compose.inspect([container])
    info = dict(found[0]) if found else {}
    if not info.get("Image"):
        raise ctx.fail("prepare", f"container {container} of service {ctx.service!r} not found")
    return info
