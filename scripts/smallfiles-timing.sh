#!/bin/bash
# usage: [COMPFS_BIN=...] smallfiles-timing.sh TREE WORKDIR ROUNDS LABEL[:OPTS]... (root: FUSE, drop_caches)
# alternating pack=off / pack=on copies of TREE: size, cp -r + sync time, cold tar c | cat time,
# cold reads of single small files (fresh mount + drop_caches before each)
set -u
tree=$1; work=$2; rounds=$3; shift 3
bin=${COMPFS_BIN:-target/debug/compfs}
mkdir -p $work
dc() { sync; echo 3 > /proc/sys/vm/drop_caches; }
find "$tree" -type f -size -3k | sort | awk 'NR % 97 == 1' | head -5 > $work/small.list
for r in $(seq $rounds); do
for cfg in "$@"; do
  label=${cfg%%:*}; extra=${cfg#$label}; opts=compress=zstd:3${extra/:/,}
  st=$work/st-$label; mnt=$work/mnt-$label; rm -rf $st; mkdir -p $mnt
  $bin mkfs $st >/dev/null
  $bin mount -o $opts $st $mnt
  s=$(date +%s.%N); cp -r "$tree" $mnt/t; sync -f $mnt; e=$(date +%s.%N)
  $bin umount $mnt
  size=$(du -sb $st | cut -f1); meta=$(stat -c %s $st/meta.redb)
  $bin mount -o $opts $st $mnt
  dc; s2=$(date +%s.%N); tar c -C $mnt t | cat > /dev/null; e2=$(date +%s.%N)
  $bin umount $mnt
  reads=""
  while read -r f; do
    rel=${f#$tree/}
    $bin mount -o $opts $st $mnt; dc
    a=$(date +%s%N); cat "$mnt/t/$rel" > /dev/null; b=$(date +%s%N)
    reads="$reads $(( (b - a) / 1000 ))"
    $bin umount $mnt
  done < $work/small.list
  echo "round $r $label ($opts): store $size (meta.redb $meta); cp+sync $(echo "$e - $s" | bc) s; cold tar $(echo "$e2 - $s2" | bc) s; cold small reads us:$reads"
  rm -rf $st
done
done
