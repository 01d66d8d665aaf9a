#!/bin/bash
# Store size of a tree copied onto compfs (compress=zstd:3) and onto kernel btrfs, and the sum of
# each file compressed alone with zstd -3 (with and without a dictionary trained on 2,000 of
# the files). Issue 16's measurement. Needs root (loop device, FUSE, drop_caches).
# usage: smallfiles-measure.sh TREE WORKDIR COMPFS_BIN:LABEL[:OPTS]... [btrfs] [zstd]
# (OPTS: more mount options after compress=zstd:3, e.g. dict=off; KEEP_STORES=1 keeps the stores)
set -euo pipefail
tree=$1; work=$2; shift 2
mkdir -p "$work"
files=$(find "$tree" -type f | wc -l); bytes=$(find "$tree" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')
echo "tree $tree: $files files, $bytes bytes"
dc() { sync; echo 3 > /proc/sys/vm/drop_caches; }
for arg in "$@"; do
  case $arg in
  btrfs)
    img=$work/btrfs.img; mnt=$work/bmnt; mkdir -p "$mnt"
    rm -f "$img"; truncate -s 4G "$img"; mkfs.btrfs -q -f "$img"
    mount -o loop,compress=zstd:3 "$img" "$mnt"
    before=$(df -B1 --output=used "$mnt" | tail -1)
    s=$(date +%s.%N); cp -r "$tree" "$mnt/t"; sync -f "$mnt"; e=$(date +%s.%N)
    after=$(df -B1 --output=used "$mnt" | tail -1)
    echo "btrfs: df used delta $((after - before)) bytes; cp -r + sync $(echo "$e - $s" | bc) s"
    umount "$mnt"; rm -f "$img" ;;
  zstd)
    sum=0; while IFS= read -r -d '' f; do n=$(zstd -3 -c -q "$f" | wc -c); sum=$((sum + n)); done < <(find "$tree" -type f -print0)
    echo "each file alone, zstd -3: $sum bytes"
    find "$tree" -type f | sort | shuf -n 2000 --random-source=<(yes) > "$work/sample.list" || true
    zstd -q -f --train $(cat "$work/sample.list") -o "$work/dict" 2>/dev/null
    sum=0; while IFS= read -r -d '' f; do n=$(zstd -3 -c -q -D "$work/dict" "$f" | wc -c); sum=$((sum + n)); done < <(find "$tree" -type f -print0)
    echo "each file alone, zstd -3 with a dictionary trained on 2,000 files: $sum bytes (+ dictionary $(stat -c %s "$work/dict"))" ;;
  *)
    bin=${arg%%:*}; rest=${arg#*:}; label=${rest%%:*}; opts=compress=zstd:3
    [ "$rest" != "$label" ] && opts="$opts,${rest#*:}"
    st=$work/store-$label; mnt=$work/mnt-$label
    rm -rf "$st"; mkdir -p "$mnt"
    "$bin" mkfs "$st" >/dev/null
    "$bin" mount --log "$work/compfs-$label.log" -o "$opts" "$st" "$mnt"
    s=$(date +%s.%N); cp -r "$tree" "$mnt/t"; sync -f "$mnt"; e=$(date +%s.%N)
    mounted=$(du -sb "$st" | cut -f1)
    "$bin" umount "$mnt"
    seg=$(du -sb "$st/segments" | cut -f1); meta=$(stat -c %s "$st/meta.redb"); all=$(du -sb "$st" | cut -f1)
    echo "compfs $label ($opts): store after unmount $all bytes (segments $seg, meta.redb $meta; $mounted while mounted); cp -r + sync $(echo "$e - $s" | bc) s"
    "$bin" mount --log "$work/compfs-$label.log" -o "$opts" "$st" "$mnt"
    dc; s=$(date +%s.%N); tar c -C "$mnt" t | cat > /dev/null; e=$(date +%s.%N)
    one=$(find "$mnt/t" -type f -size -3k -print -quit)
    dc; s2=$(date +%s%N); cat "$one" > /dev/null; e2=$(date +%s%N)
    echo "compfs $label: cold tar c | cat $(echo "$e - $s" | bc) s; cold read of one small file $(( (e2 - s2) / 1000 )) us"
    "$bin" usage "$mnt/t" | sed "s/^/  /"
    "$bin" umount "$mnt"; [ -n "${KEEP_STORES:-}" ] || rm -rf "$st" ;;
  esac
done
