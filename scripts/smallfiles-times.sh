#!/bin/bash
# Issue 16 timings: for each COMPFS_BIN:LABEL[:OPTS], cp -r TREE onto a fresh store (compress=zstd:3),
# cold tar c | cat after a remount, and the cold read of 15 small files, each after a remount and
# drop_caches (median). Needs root. Put the binaries in tmpfs: drop_caches would otherwise evict
# the daemon's own code. ROUNDS="1 2" alternates the binaries. usage: smallfiles-times.sh TREE WORKDIR BIN:LABEL[:OPTS]...
set -euo pipefail
tree=$1; work=$2; shift 2
mkdir -p $work
dc() { sync; echo 3 > /proc/sys/vm/drop_caches; }
mapfile -t smalls < <(cd $tree && find . -type f -size -3k | sort | awk 'NR%97==1' | head -15)
for round in ${ROUNDS:-1 2}; do
for arg in "$@"; do
  bin=${arg%%:*}; rest=${arg#*:}; label=${rest%%:*}; opts=compress=zstd:3; [ "$rest" != "$label" ] && opts="$opts,${rest#*:}"
  st=$work/st-$label; mnt=$work/mnt-$label; rm -rf $st; mkdir -p $mnt
  $bin mkfs $st >/dev/null
  $bin mount --log $work/log-$label -o $opts $st $mnt
  dc; s=$(date +%s.%N); cp -r $tree $mnt/t; sync -f $mnt; e=$(date +%s.%N)
  cp_t=$(echo "$e - $s" | bc)
  $bin umount $mnt; size=$(du -sb $st | cut -f1)
  $bin mount --log $work/log-$label -o $opts $st $mnt
  dc; s=$(date +%s.%N); tar c -C $mnt t | cat > /dev/null; e=$(date +%s.%N); tar_t=$(echo "$e - $s" | bc)
  $bin umount $mnt
  ts=()
  for f in "${smalls[@]}"; do
    $bin mount --log $work/log-$label -o $opts $st $mnt; dc
    s2=$(date +%s%N); cat "$mnt/t/$f" > /dev/null; e2=$(date +%s%N); ts+=($(( (e2 - s2) / 1000 )))
    $bin umount $mnt
  done
  med=$(printf '%s\n' "${ts[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)] " (min " a[1] ", max " a[NR] ")"}')
  echo "round $round $label: size $size B; cp -r + sync ${cp_t} s; cold tar c|cat ${tar_t} s; cold small-file read median ${med} us over ${#ts[@]}"
  rm -rf $st
done
done
