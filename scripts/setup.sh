#!/usr/bin/env bash
# Everything forgelib needs on a bare Debian machine, idempotently: a Docker engine and compose v2,
# forgelib itself with its dev tools (nox, pytest, ruff, mypy, uv), and the offline stand-in images.
# Each step is a no-op when already done, so it is also the "make sure" step before a session.
set -Eeuo pipefail
trap 'echo "setup.sh: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}

bash scripts/engine.sh
# Debian's own python3 is "externally managed" (PEP 668) and comes without pip: install into a venv in
# the checkout instead, and put its forge and nox on PATH. Another python3 (pyenv, a venv) is used as is.
where=$("$PY" -c 'import pathlib, sys, sysconfig
if sys.prefix != sys.base_prefix: print("venv")
elif (pathlib.Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED").exists(): print("managed")
else: print("ok")')
if [ "$where" = managed ] || ! "$PY" -m pip --version >/dev/null 2>&1 && [ "$where" != venv ]; then
  if ! "$PY" -c 'import ensurepip, venv' 2>/dev/null; then
    [ "$(id -u)" -eq 0 ] || { echo "setup.sh: $PY has no venv module: apt-get install python3-venv (as root)" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv >/dev/null
  fi
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  PY=$PWD/.venv/bin/python
  LINK=1
fi
"$PY" -m pip install -q --disable-pip-version-check -e '.[dev]' nox uv
if [ "${LINK:-0}" = 1 ]; then
  for tool in forge nox; do ln -sf "$PWD/.venv/bin/$tool" "/usr/local/bin/$tool"; done
fi
"$PY" -m forgelib images
echo "setup: ready — try: forge run examples/multi_service_postgres_reset/run_configs/dev.yaml --report" >&2
