#!/bin/bash
# Issue 16: cold read of a small file, per sample on a fresh mount (first read after mount) and in a
# running daemon (another small file read first, then drop_caches). Needs root.
# usage: smallfiles-coldread.sh TREE WORKDIR BIN:LABEL[:OPTS]...
set -euo pipefail
tree=$1; work=$2; shift 2
mkdir -p $work
dc() { sync; echo 3 > /proc/sys/vm/drop_caches; }
mapfile -t smalls < <(cd $tree && find . -type f -size -3k | sort | awk 'NR%97==1' | head -15)
mapfile -t warms < <(cd $tree && find . -type f -size -3k | sort -r | awk 'NR%89==1' | head -15)
for arg in "$@"; do
  bin=${arg%%:*}; rest=${arg#*:}; label=${rest%%:*}; opts=compress=zstd:3; [ "$rest" != "$label" ] && opts="$opts,${rest#*:}"
  st=$work/st-$label; mnt=$work/mnt-$label; rm -rf $st; mkdir -p $mnt
  $bin mkfs $st >/dev/null; $bin mount -o $opts $st $mnt; cp -r $tree $mnt/t; sync -f $mnt; $bin umount $mnt
  ts=(); cs=()
  for i in "${!smalls[@]}"; do
    f=${smalls[$i]}; w=${warms[$i]}
    $bin mount -o $opts $st $mnt; dc
    s2=$(date +%s%N); cat "$mnt/t/$f" > /dev/null; e2=$(date +%s%N); cs+=($(( (e2 - s2) / 1000 )))
    cat "$mnt/t/$w" > /dev/null; dc
    s2=$(date +%s%N); cat "$mnt/t/$f" > /dev/null; e2=$(date +%s%N)
    $bin umount $mnt
  done
  for i in "${!smalls[@]}"; do
    f=${smalls[$i]}; w=${warms[$i]}
    $bin mount -o $opts $st $mnt; cat "$mnt/t/$w" > /dev/null; dc
    s2=$(date +%s%N); cat "$mnt/t/$f" > /dev/null; e2=$(date +%s%N); ts+=($(( (e2 - s2) / 1000 )))
    $bin umount $mnt
  done
  med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)] " (" a[1] "-" a[NR] ")"}'; }
  echo "$label: first read after mount $(med "${cs[@]}") us; cold file in a warm daemon $(med "${ts[@]}") us"
  rm -rf $st
done
