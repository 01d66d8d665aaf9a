#!/usr/bin/env bash
# The main job: the compfs filesystem demo. Installs what is missing (the Debian packages, and
# Rust >= 1.85 with rustup when cargo is missing or older), builds compfs and installs it as
# /usr/local/bin/compfs (when run as root; else it says how), creates a store in a temporary
# directory, mounts it with compress=zstd:3, copies a few hundred MB of
# data every Debian machine has (text-like /usr/share/doc, executable-like /usr/bin and
# /usr/lib subsets), syncs, prints `compfs usage` and the time taken, verifies the copy byte
# for byte, unmounts and cleans up.
# Usage: scripts/demo.sh [MB]   (default 400: the size of the sample to copy)
set -euo pipefail
cd "$(dirname "$0")/.."
budget_mb=${1:-400}

scripts/deps.sh cc fusermount3
. scripts/toolchain.sh
cargo build --release -p compfs
bin=${CARGO_TARGET_DIR:-$PWD/target}/release/compfs
prefix=${COMPFS_PREFIX:-/usr/local}
if [ -w "$prefix/bin" ] || { [ ! -e "$prefix/bin" ] && [ "$(id -u)" -eq 0 ]; }; then
  install -D -m 0755 "$bin" "$prefix/bin/compfs"
  echo "installed $prefix/bin/compfs (built as $bin)"
else
  echo "built $bin; to put it on PATH: sudo install -m 0755 $bin $prefix/bin/compfs"
fi

# On disk (not tmpfs) so the figures mean something.
work=$(mktemp -d /var/tmp/compfs-demo.XXXXXX)
store=$work/store
mnt=$work/mnt
list=$work/files
mkdir -p "$mnt"
cleanup() {
  if mountpoint -q "$mnt" 2>/dev/null; then
    fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  fi
  # The daemon finishes its last sync after the unmount; wait for it before deleting.
  for _ in $(seq 1 100); do
    pgrep -f "compfs mount $store " >/dev/null || break
    sleep 0.1
  done
  rm -rf "$work"
}
trap cleanup EXIT

# The sample: all of /usr/share/doc (text), then /usr/bin and /usr/lib files (executables,
# libraries) up to the budget. Regular files only; paths relative to /.
budget=$((budget_mb << 20))
(cd / && {
  find usr/share/doc -type f -printf '%s %p\n'
  find usr/bin -maxdepth 1 -type f -printf '%s %p\n' | sort -k2
  find usr/lib -type f \( -name '*.so*' -o -name '*.a' -o -name '*.py' -o -perm -u+x \) -printf '%s %p\n' | sort -k2
} 2>/dev/null) | awk -v b="$budget" '{ if (t + $1 > b) exit; t += $1; sub(/^[0-9]+ /, ""); print }' > "$list" || true
nfiles=$(wc -l < "$list")
bytes=$(cd / && tr '\n' '\0' < "$list" | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)

"$bin" mkfs "$store" --compress zstd:3
"$bin" mount "$store" "$mnt" -o compress=zstd:3
echo "compfs mounted on $mnt (store $store, -o compress=zstd:3)"

echo "copying $nfiles files, $((bytes >> 20)) MiB ..."
start=$(date +%s.%N)
(cd / && tar -cf - --no-recursion --verbatim-files-from -T "$list") | tar -C "$mnt" -xf -
sync
# `sync DIR` fsyncs the mount's root directory, which makes the whole store durable (FUSE does
# not forward syncfs, so a bare `sync` only pushes the page cache to the daemon).
sync "$mnt"
end=$(date +%s.%N)
secs=$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')
echo
"$bin" usage "$mnt"
echo
awk -v s="$secs" -v b="$bytes" 'BEGIN { printf "copy + sync: %.1f s, %.0f MB/s\n", s, b / s / 1e6 }'
store_bytes=$(du -sb "$store" | cut -f1)
awk -v a="$bytes" -v s="$store_bytes" 'BEGIN { printf "store directory: %.0f MiB for %.0f MiB of files (%.2fx)\n", s/1048576, a/1048576, a/s }'

echo "verifying byte for byte ..."
bad=0
while IFS= read -r f; do
  cmp -s "/$f" "$mnt/$f" || { echo "MISMATCH: $f" >&2; bad=1; }
done < "$list"
[ "$bad" -eq 0 ] && echo "all $nfiles files identical"

"$bin" umount "$mnt"
echo "unmounted (everything durable); cleaning up"
exit "$bad"
