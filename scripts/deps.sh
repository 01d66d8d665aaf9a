#!/usr/bin/env bash
# Installs the Debian packages compfs's demo and tests use, when missing. Idempotent.
# Usage: scripts/deps.sh [PACKAGE...]   (no arguments: the full set)
set -euo pipefail
want=("$@")
if [ ${#want[@]} -eq 0 ]; then
  want=(fuse3 zstd lz4 xz-utils qemu-utils libnbd-bin nbdkit nbdfuse e2fsprogs btrfs-progs btrfs-compsize fio)
fi
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
echo "installing: ${missing[*]}" >&2
"${sudo_cmd[@]}" apt-get update -qq >/dev/null
# Install one by one so a package absent from this release does not block the others.
for p in "${missing[@]}"; do
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "$p" >/dev/null \
    || echo "warning: could not install $p; tests that need it will say so" >&2
done
