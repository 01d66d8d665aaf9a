#!/usr/bin/env bash
# Installs the Debian packages that provide the commands compfs's build, demo and tests use,
# for the commands that are missing. Idempotent: it checks for commands, not package names
# (on Debian 12 `nbdfuse` is a virtual package that dpkg never reports as installed).
# Waits for another apt/dpkg (unattended-upgrades on a fresh machine) instead of giving up.
# Usage: scripts/deps.sh [COMMAND...]   (no arguments: the full set)
set -euo pipefail

# command -> Debian package providing it
declare -A pkg=(
  [cc]=build-essential [curl]=curl [fusermount3]=fuse3 [zstd]=zstd [lz4]=lz4 [xz]=xz-utils
  [qemu-img]=qemu-utils [qemu-io]=qemu-utils [nbdcopy]=libnbd-bin [nbdinfo]=libnbd-bin
  [nbdkit]=nbdkit [nbdfuse]=nbdfuse [mkfs.ext4]=e2fsprogs [mkfs.btrfs]=btrfs-progs
  [compsize]=btrfs-compsize [fio]=fio [bonnie++]=bonnie++ [mkfs.xfs]=xfsprogs [bindfs]=bindfs
  [rclone]=rclone
)
want=("$@")
if [ ${#want[@]} -eq 0 ]; then
  want=(cc fusermount3 zstd lz4 xz qemu-img qemu-io nbdcopy nbdinfo nbdkit nbdfuse mkfs.ext4
        mkfs.btrfs compsize fio bonnie++ mkfs.xfs bindfs rclone)
fi

# sbin directories are not on every user's PATH, but the tools there still count.
have() { PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null 2>&1; }

missing=()
for c in "${want[@]}"; do
  have "$c" && continue
  p=${pkg[$c]:-$c}
  case " ${missing[*]:-} " in *" $p "*) ;; *) missing+=("$p") ;; esac
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
# Wait up to 10 minutes for the dpkg lock (and the frontend lock) held by another apt.
apt=("${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)

# apt-get update takes the lists lock, which DPkg::Lock::Timeout does not cover on every apt
# release: retry while another process holds it.
update() {
  local i out
  for i in $(seq 1 120); do
    if out=$("${apt[@]}" update -qq 2>&1); then return 0; fi
    case "$out" in
      *"Could not get lock"*|*"is held by process"*) [ "$i" = 1 ] && echo "waiting for another apt/dpkg to finish ..." >&2; sleep 5 ;;
      *) echo "$out" >&2; return 1 ;;
    esac
  done
  echo "$out" >&2
  return 1
}

echo "installing: ${missing[*]}" >&2
update || echo "warning: apt-get update failed; trying the installed package lists" >&2
# One by one, so a package absent from this release does not block the others.
for p in "${missing[@]}"; do
  "${apt[@]}" install -y -qq --no-install-recommends "$p" >/dev/null \
    || echo "warning: could not install $p; what needs it will say so" >&2
done
still=()
for c in "${want[@]}"; do have "$c" || still+=("$c"); done
if [ ${#still[@]} -gt 0 ]; then
  echo "warning: still missing: ${still[*]}" >&2
fi
exit 0
