"""Joining a Ray cluster from ``forge run --cluster`` (the only place the driver imports Ray).

A cluster whose processes are bound to loopback (one machine: the integration tests, a laptop) is only
reachable there, but Ray rewrites a loopback address to the machine's outward address before using it
(``ray._private.services.resolve_ip_for_localhost``). ``keep_loopback`` turns that rewrite off for the
process it runs in; ``python -m forgelib.cluster.connect start …`` is ``ray start …`` with it, which is how
the tests start their loopback-only nodes.
"""

from __future__ import annotations

import ipaddress
import logging
import sys
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


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    address: str
    slots: int


def connect(address: str) -> list[NodeInfo]:
    """Join the cluster at ``address`` (never start one) and list its alive nodes offering forge slots."""
    ray = import_ray()
    if is_loopback(address):
        keep_loopback()
    try:
        ray.init(
            address=address,
            logging_level=logging.WARNING,
            log_to_driver=False,  # node-side progress comes back through the slots, not raw stdout
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ForgeError(f"cannot join the Ray cluster at {address}: {e}") from None
    _ray_messages_to_stderr()
    nodes = forge_nodes(ray.nodes())
    if not nodes:
        ray.shutdown()
        raise ForgeError(
            f"the Ray cluster at {address} has no node offering the {RESOURCE!r} resource; start each "
            f"Docker host's node with {ENGINE_ENV}=unix:///var/run/docker.sock ray start --address "
            f"{address} --resources '{{\"{RESOURCE}\": SLOTS}}' (README: Running on a cluster)"
        )
    return nodes


def forge_nodes(nodes: list[dict[str, Any]]) -> list[NodeInfo]:
    return [
        NodeInfo(str(n["NodeID"]), str(n.get("NodeManagerAddress", "?")), int(n["Resources"][RESOURCE]))
        for n in nodes
        if n.get("Alive") and n.get("Resources", {}).get(RESOURCE, 0) >= 1
    ]


# Ray gives a starting node's raylet a fixed 30 s to register (a literal in ray._private.node.Node's
# start-up, no setting or environment variable changes it), and the raylet registers only once the node's
# Python agents have imported; on a loaded 2-core box that can take longer. So the private
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
