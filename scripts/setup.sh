#!/usr/bin/env bash
# Everything forgelib needs on a bare Debian machine, idempotently: a Docker engine and compose v2,
# forgelib itself with its dev tools (nox, pytest, ruff, mypy, uv), and the offline stand-in images.
# Each step is a no-op when already done, so it is also the "make sure" step before a session.
set -Eeuo pipefail
trap 'echo "setup.sh: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}

bash scripts/engine.sh
"$PY" -m pip install -q --disable-pip-version-check -e '.[dev]' nox uv
"$PY" -m forgelib images
echo "setup: ready — try: forge run --config examples/multi_service_postgres_reset/run_configs/dev.yaml --report" >&2
