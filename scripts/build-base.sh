#!/usr/bin/env bash
# Build a Debian bookworm base image without a registry: debootstrap a minbase root filesystem and
# `docker import` it. Used when debian:bookworm-slim is neither present nor pullable (forge images decides).
#
#   scripts/build-base.sh [TAG] [LABEL=VALUE ...]      (default TAG: forgelib/debian:bookworm)
#
# Needs root (debootstrap chroots) and Debian's mirror (FORGE_DEBIAN_MIRROR). Prints TAG on stdout when done.
set -Eeuo pipefail
trap 'echo "build-base.sh: line $LINENO: \"$BASH_COMMAND\" failed" >&2' ERR

TAG=${1:-forgelib/debian:bookworm}
shift || true
SUITE=bookworm
MIRROR=${FORGE_DEBIAN_MIRROR:-http://deb.debian.org/debian}

say() { printf 'build-base: %s\n' "$*" >&2; }
die() { printf 'build-base: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "not root: debootstrap needs root (run with sudo, or make debian:bookworm-slim available: docker load/pull)"
if ! command -v debootstrap >/dev/null 2>&1; then
  [ -f /etc/debian_version ] || die "debootstrap is missing and this is not Debian: install debootstrap, or docker load debian:bookworm-slim"
  say "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq debootstrap >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && apt-get install -y -qq debootstrap >/dev/null; } \
    || die "apt-get install debootstrap failed"
fi

ROOTFS=$(mktemp -d /var/tmp/forge-rootfs.XXXXXX)
cleanup() { rm -rf --one-file-system "$ROOTFS"; }
trap cleanup EXIT

say "debootstrap --variant=minbase $SUITE from $MIRROR"
debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
  || { tail -n 20 "$ROOTFS.log" >&2; rm -f "$ROOTFS.log"; die "debootstrap failed (log tail above)"; }
rm -f "$ROOTFS.log"

# Make it behave like debian:bookworm-slim: updates in sources, no docs/man pages installed by later
# apt-get runs (smaller, faster image builds), no recommends, and no caches shipped in the layer.
cat >"$ROOTFS/etc/apt/sources.list" <<SRC
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
SRC
cat >"$ROOTFS/etc/dpkg/dpkg.cfg.d/docker-slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
CFG
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' >"$ROOTFS/etc/apt/apt.conf.d/docker-no-recommends"
cat >"$ROOTFS/etc/apt/apt.conf.d/docker-clean" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CFG
# No init system runs in a container: package postinst scripts must not try to start services.
printf '#!/bin/sh\nexit 101\n' >"$ROOTFS/usr/sbin/policy-rc.d"
chmod 755 "$ROOTFS/usr/sbin/policy-rc.d"
rm -rf "${ROOTFS:?}"/var/lib/apt/lists/* "${ROOTFS:?}"/var/cache/apt/*.bin "${ROOTFS:?}"/var/cache/apt/archives/*.deb \
  "${ROOTFS:?}"/var/log/*.log "${ROOTFS:?}"/tmp/* "${ROOTFS:?}"/proc/* "${ROOTFS:?}"/sys/* "${ROOTFS:?}"/dev/* 2>/dev/null || true

changes=(--change 'CMD ["bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin')
for label in "$@"; do
  changes+=(--change "LABEL $label")
done
say "importing as $TAG"
tar --numeric-owner -C "$ROOTFS" -c . | docker import "${changes[@]}" - "$TAG" >/dev/null
echo "$TAG"
