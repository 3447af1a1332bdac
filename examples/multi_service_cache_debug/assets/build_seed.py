"""Regenerate ``cache_poisoned.rdb``: the redis dump every trial of this pack starts from.

Usage (from anywhere; needs a Docker engine)::

    python3 examples/multi_service_cache_debug/assets/build_seed.py [--image IMAGE]
    forge stamp --project examples/multi_service_cache_debug

The dump is written by a throwaway container of the *same image the pack runs*, so its RDB version is one
that server loads (a newer redis writes versions an older one refuses). The image is resolved the way
forge resolves the compose file's ``${FORGE_IMAGE_REDIS:-redis:7-alpine}``: ``--image``, else
``$FORGE_IMAGE_REDIS``, else the offline stand-in ``forgelib/redis:7.0`` when it exists locally, else
``redis:7-alpine``.

What goes in: ``order:4021`` as orders-api cached it *before* the order shipped (status ``processing``, no
TTL, so it never expires mid-trial), and ``order:4017`` cached after its last update (consistent with
postgres), so only one entry is stale. The RDB carries a creation time, so each regeneration changes the
bytes: stamp the project afterwards or ``forge validate`` reports a digest mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "cache_poisoned.rdb"
STAND_IN = "forgelib/redis:7.0"
COMPOSE_DEFAULT = "redis:7-alpine"
TIMEOUT = 60  # seconds, for any one docker call

# The values orders-api itself writes (json.dumps of the row), frozen at the moment they were cached.
ENTRIES = {
    "order:4021": {
        "id": 4021,
        "customer": "Ada Lovelace",
        "status": "processing",
        "total_cents": 12999,
        "updated_at": "2026-11-27T11:02:00+00:00",
    },
    "order:4017": {
        "id": 4017,
        "customer": "Grace Hopper",
        "status": "delivered",
        "total_cents": 4500,
        "updated_at": "2026-11-20T09:12:00+00:00",
    },
}


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker")
    if exe is None:
        raise SystemExit("build_seed: `docker` is not on PATH (run `forge engine` to install and start one)")
    argv = [exe, *args]
    # An argv list (no shell) of docker plus this script's own arguments.
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)  # noqa: S603
    if check and proc.returncode != 0:
        raise SystemExit(
            f"build_seed: `{' '.join(argv)}` failed (rc={proc.returncode}):\n{proc.stderr.strip()}"
        )
    return proc


def resolve_image(explicit: str | None) -> str:
    if explicit:
        return explicit
    if env := os.environ.get("FORGE_IMAGE_REDIS"):
        return env
    if docker("image", "inspect", STAND_IN, check=False).returncode == 0:
        return STAND_IN
    return COMPOSE_DEFAULT


def redis_cli(container: str, *args: str) -> str:
    return docker("exec", container, "redis-cli", "--raw", *args).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--image", help="redis image to write the dump with (default: the image the pack runs)"
    )
    parser.add_argument("--output", type=Path, default=OUT, help=f"where to write the dump (default: {OUT})")
    args = parser.parse_args()

    image = resolve_image(args.image)
    name = f"forge-build-seed-{uuid.uuid4().hex[:12]}"
    print(f"build_seed: writing {args.output} with {image} (container {name})", file=sys.stderr)
    # The same persistence settings as the pack's redis service; SAVE below writes the dump explicitly.
    docker(
        "run",
        "-d",
        "--name",
        name,
        "--label",
        "io.forgelib.tool=build_seed",
        image,
        "redis-server",
        "--save",
        "",
        "--appendonly",
        "no",
    )
    try:
        deadline = time.monotonic() + 30
        while docker("exec", name, "redis-cli", "ping", check=False).stdout.strip() != "PONG":
            if time.monotonic() > deadline:
                logs = docker("logs", "--tail", "20", name, check=False)
                raise SystemExit(f"build_seed: redis never answered PING:\n{logs.stdout}{logs.stderr}")
            time.sleep(0.2)
        for key, value in ENTRIES.items():
            redis_cli(name, "SET", key, json.dumps(value))
        if redis_cli(name, "SAVE") != "OK":
            raise SystemExit("build_seed: SAVE did not answer OK")
        path = (
            f"{redis_cli(name, 'CONFIG', 'GET', 'dir').splitlines()[-1]}/"
            + redis_cli(name, "CONFIG", "GET", "dbfilename").splitlines()[-1]
        )
        tmp = args.output.with_suffix(".rdb.tmp")
        docker("cp", f"{name}:{path}", str(tmp))
    finally:
        docker("rm", "-f", "-v", name, check=False)

    header = tmp.read_bytes()[:9]
    if not header.startswith(b"REDIS") or not header[5:].isdigit():
        tmp.unlink()
        raise SystemExit(f"build_seed: {path} does not start with an RDB header: {header!r}")
    tmp.replace(args.output)
    print(f"build_seed: wrote {args.output} (RDB version {int(header[5:])}, {len(ENTRIES)} keys)")
    print(f"build_seed: now run `forge stamp --project {HERE.parent}` to record its digest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
