#!/usr/bin/env bash
# Debian's headless Chromium and its WebDriver, idempotently, for the report's browser test
# (tests/e2e/test_report_browser.py runs this from its fixture; nothing else needs a browser).
# Does nothing when both answer. Otherwise, on Debian as root, installs `chromium` and `chromium-driver`.
# Prints the two paths (chromium, chromedriver) on stdout, one per line.
set -Eeuo pipefail
trap 'echo "browser.sh: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR

say() { printf 'browser: %s\n' "$*" >&2; }
die() { printf 'browser: error: %s\n' "$*" >&2; exit 1; }

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }

if ! have; then
  [ "$(id -u)" -eq 0 ] || die "not root: install Debian's chromium and chromium-driver yourself (apt-get install chromium chromium-driver)"
  [ -f /etc/debian_version ] || die "not Debian: install chromium and chromedriver for this OS yourself"
  say "installing chromium and chromium-driver from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  # Another apt run (a parallel setup step) holds the dpkg lock for a while: wait for it, bounded.
  apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null || die "apt-get update failed (is Debian's mirror reachable?)"
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium chromium-driver >/dev/null \
    || die "apt-get install chromium chromium-driver failed"
  have || die "chromium or chromedriver still missing after the install"
fi
command -v chromium
command -v chromedriver
