#!/usr/bin/env bash
# The harbor suite (tests/harbor) in a Python 3.12+ venv: harbor needs 3.12, forgelib's own suites run on
# 3.11. Made from the machine's pyenv Python; skipped, saying so, where there is none.
set -Eeuo pipefail
trap 'echo "harbor-tests: ${BASH_SOURCE[0]}:$LINENO: \"$BASH_COMMAND\" failed (rc=$?)" >&2' ERR

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY312=""
for v in 3.12.1 3.13.0; do
  if [ -x "/root/.pyenv/versions/$v/bin/python3" ]; then PY312=/root/.pyenv/versions/$v/bin/python3; break; fi
done
if [ -z "$PY312" ]; then
  echo "harbor-tests: SKIPPED: no Python 3.12/3.13 under /root/.pyenv/versions; harbor needs >= 3.12"
  exit 0
fi
VENV=${FORGE_HARBOR_VENV:-${TMPDIR:-/tmp}/forge-ci-harbor-venv}
[ -x "$VENV/bin/python" ] || "$PY312" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q -e '.[harbor]' pytest
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/harbor
