"""Joining a Ray cluster from ``forge run --cluster`` (the only place the driver imports Ray).

A cluster whose processes are bound to loopback (one machine: the integration tests, a laptop) is only
reachable there, but Ray rewrites a loopback address to the machine's outward address before using it
(``ray._private.services.resolve_ip_for_localhost``). ``keep_loopback`` turns that rewrite off for the
process it runs in; ``python -m forgelib.cluster.connect start …`` is ``ray start …`` with it, which is how
the tests start their loopback-only nodes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from forgelib.cluster import ENGINE_ENV, RESOURCE
from forgelib.errors import ForgeError

log = logging.getLogger("forgelib.cluster")


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ForgeError(
            "--cluster needs Ray on this machine and on every node: pip install 'forgelib[ray]'"
        ) from None
    return ray


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def keep_loopback() -> None:
    # A private Ray function, patched because Ray 2.60 has no public way to keep a loopback address: the
    # rewrite is unconditional unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (Ray's switch for single-node
    # macOS/Windows), and that switch also makes `ray start --address` refuse to start a worker node.
    import ray._private.services as services

    services.resolve_ip_for_localhost = lambda host: host


def _ray_messages_to_stderr() -> None:
    # A private Ray function, patched because forge's stdout is machine-readable output (`run --json`):
    # Ray's driver prints the raylets' error messages (e.g. "Job … already started in worker pool" after a
    # node died) to stdout whatever `log_to_driver` says (worker.listen_error_messages, "is_err": False),
    # and no setting moves them. They are diagnostics, so they go to stderr.
    import ray._private.worker as ray_worker

    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None or getattr(original, "forge_to_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        original({**data, "is_err": True}, ignore_prefix)

    to_stderr.forge_to_stderr = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = to_stderr


def _no_serializer_addons() -> None:
    # A Ray hook (DeveloperAPI), patched in the driver because its cost is the driver's start-up: building
    # its serializer, Ray registers serializers for pydantic, starlette and Arrow types when those packages
    # are installed, importing them (pydantic, which Ray's dashboard pulls in, is a large share of a short
    # run's start-up). The driver ships only forge's own dataclasses, strings and bytes,
    # none of those types; the nodes (other processes) keep Ray's serializers as they are.
    import ray.util.serialization_addons as addons

    addons.apply = lambda context: None


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    address: str
    slots: int


def connect(address: str) -> list[NodeInfo]:
    """Join the cluster at ``address`` (never start one) and list its alive nodes offering forge slots."""
    global _joined
    ray = import_ray()
    _require_answer(address)
    if is_loopback(address):
        keep_loopback()
    logging.getLogger("ray._private.worker").addFilter(_no_sigterm_notice)
    _ray_messages_to_stderr()  # before ray.init starts the thread that prints them
    _no_serializer_addons()
    try:
        ray.init(
            address=address,
            logging_level=logging.WARNING,
            log_to_driver=False,  # node-side progress comes back through the slots, not raw stdout
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ForgeError(f"cannot join the Ray cluster at {address}: {e}") from None
    _joined = True
    # Ray builds its serializer on the first object it ships: now, on the joining thread, rather than on
    # the first trial's hand-off.
    ray.put(None)
    nodes = forge_nodes(ray.nodes())
    if not nodes:
        raise ForgeError(
            f"the Ray cluster at {address} has no node offering the {RESOURCE!r} resource; start each "
            f"Docker host's node with {ENGINE_ENV}=unix:///var/run/docker.sock ray start --address "
            f"{address} --resources '{{\"{RESOURCE}\": SLOTS}}' (README: Running on a cluster)"
        )
    return nodes


ANSWER_SECONDS = 10.0  # no connection, or no greeting, in this long: not a cluster
# A Ray head's GCS is a gRPC server, so HTTP/2: a client that opens with HTTP/2's connection preface (the
# magic string, then an empty SETTINGS frame) gets the server's preface back, a SETTINGS frame (RFC 9113
# §3.4). A frame header is 9 bytes: length (3), type (1; 4 is SETTINGS), flags (1), stream id (4).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 4


def _require_answer(address: str) -> None:
    """Fail at once, naming the address and the fix, where ``ray.init`` would retry for minutes: nothing
    listens there, or something that is not a Ray head does (another service on the port: ray.init's GCS
    client keeps reconnecting to it, warning every few seconds). A gRPC greeting is all that is checked;
    Ray itself says the rest (a version mismatch, say). Only host:port addresses: not "auto", ray://."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in address:
        return
    fix = "give the head node's address as `ray start --head` printed it (its GCS port, 6379 by default)"
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=ANSWER_SECONDS)
    except OSError as e:
        raise ForgeError(
            f"cannot join the Ray cluster at {address}: nothing answers there ({e.strerror or e}); {fix}"
        ) from None
    with conn:
        try:
            conn.sendall(_H2_PREFACE)
            head = _read(conn, 9)
        except OSError as e:  # (a timeout too: a service waiting for its own protocol's first words)
            head, why = b"", f"{e.strerror or e or type(e).__name__}"
        else:
            why = f"it answered {head[:40]!r}" if head else "it closed the connection"
    if len(head) < 9 or head[3] != _H2_SETTINGS:
        raise ForgeError(
            f"cannot join the Ray cluster at {address}: something listens there, but not a Ray head's GCS "
            f"(no gRPC greeting: {why}); {fix}"
        )


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n and (chunk := conn.recv(n - len(data))):
        data += chunk
    return data


def _no_sigterm_notice(record: logging.LogRecord) -> bool:
    # ray.init on a thread other than the main one says it installs no SIGTERM handler: forge wants none
    # (signals.interruptible owns SIGINT/SIGTERM during the run), so the notice is noise on stderr.
    return "SIGTERM handler is not set" not in record.getMessage()


class Joining:
    """``connect(address)`` on a thread, started as early as ``forge run --cluster`` knows the address:
    importing Ray (heavy: it dominates a short run's start-up) and joining overlap the config and project
    loading and the digests. ``result()`` waits for it and raises what ``connect`` raised, as if called
    here."""

    def __init__(self, address: str) -> None:
        global _joining
        self.address = address
        self._nodes: list[NodeInfo] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._join, name="forge-ray-join", daemon=True)
        _joining = self
        self._thread.start()

    @staticmethod
    def started(address: str) -> Joining | None:
        """The join this process already started for ``address`` (``forge``'s command line), if any."""
        return _joining if _joining is not None and _joining.address == address else None

    def _join(self) -> None:
        try:
            self._nodes = connect(self.address)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread by result()
            self._error = e

    def result(self) -> list[NodeInfo]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._nodes

    def running(self) -> bool:
        return self._thread.is_alive()


_joining: Joining | None = None  # this process's join, if it started one
_joined = False  # ray.init succeeded in this process


def leave(code: int) -> None:
    """End a process that joined a cluster now, with exit status ``code``, without Ray's shutdown.

    Ray's atexit hook (``ray.shutdown``) adds a fixed wait at the end of every ``forge run --cluster`` (a
    sleep "so log messages finish printing" — forge has them go to stderr as they come — then the
    driver's disconnect), and an interpreter that exits with Ray connected but not shut down segfaults now
    and then while finalizing (Ray's core worker threads; exit 139). ``os._exit`` does neither:
    the process is gone at once and the cluster cleans up after it — the driver's raylet sees its
    connection close and the GCS marks the job finished (``job_table()`` shows it dead at
    once), which frees what the driver owned (the shipped project's object). Nothing else needs the exit
    hooks: by the time forge leaves, every event is fsync'd and closed, summary.json and the trial files are
    written, no trial is in flight (a Ctrl-C waits for every node to tear its stacks down first), the slots
    are detached actors that outlive drivers by design, and stdio and the debug log are flushed here.
    So does a process whose join is still under way (an error before it was needed): finalizing the
    interpreter under it is as unsafe, and waiting for it could take ray.init's minutes. A process that
    never joined (the local path, a failed join) exits the normal way."""
    joining = _joining is not None and _joining.running()  # first: a join that ends now sets _joined
    if not joining and not _joined:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing left to say
            stream.flush()
    logging.shutdown()
    os._exit(code)


def forge_nodes(nodes: list[dict[str, Any]]) -> list[NodeInfo]:
    return [
        NodeInfo(str(n["NodeID"]), str(n.get("NodeManagerAddress", "?")), int(n["Resources"][RESOURCE]))
        for n in nodes
        if n.get("Alive") and n.get("Resources", {}).get(RESOURCE, 0) >= 1
    ]


# Ray gives a starting node's raylet a fixed time to register (a literal in ray._private.node.Node's
# start-up, no setting or environment variable changes it), and the raylet registers only once the node's
# Python agents have imported; on a loaded machine that can take longer. So the private
# services.get_node it polls is wrapped to keep polling; only the test/laptop loopback start-up uses it.
REGISTER_SECONDS = 240.0


def _patient_registration() -> None:
    import ray._private.services as services

    get_node = services.get_node

    def wait_for_node(*args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + REGISTER_SECONDS
        while True:
            try:
                return get_node(*args, **kwargs)
            except RuntimeError:  # not registered yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    services.get_node = wait_for_node


def main(argv: list[str] | None = None) -> None:
    """``ray …`` (the Ray CLI) with loopback addresses kept as given and a patient node registration."""
    keep_loopback()
    _patient_registration()
    from ray.scripts.scripts import main as ray_main

    sys.argv = ["ray", *(sys.argv[1:] if argv is None else argv)]
    ray_main()


if __name__ == "__main__":
    main()
