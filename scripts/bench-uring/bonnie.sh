#!/bin/bash
# bonnie++ -s 0 -n 64 (file creates/stats/deletes only) on compfs ring / no ring / btrfs.
set -u
B=${B:-/dev/shm/compfs-uring}
ROUNDS=${ROUNDS:-2}
CONFIGS=${CONFIGS:-"ring nouring btrfs"}
W=${W:-/var/tmp/uring-bench}; mkdir -p $W
MNT=$W/mnt; mkdir -p $MNT
echo "# $(date -u) load: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 $ROUNDS); do
  for cfg in $CONFIGS; do
    case $cfg in
      btrfs) rm -f $W/btrfs.img; truncate -s 4G $W/btrfs.img; mkfs.btrfs -q $W/btrfs.img >/dev/null
             mount -o loop,compress=zstd:3 $W/btrfs.img $MNT ;;
      ring) rm -rf $W/store; $B mkfs $W/store >/dev/null; $B mount $W/store $MNT -o compress=zstd:3,uring ;;
      nouring) rm -rf $W/store; $B mkfs $W/store >/dev/null; $B mount $W/store $MNT -o compress=zstd:3,nouring ;;
    esac
    mkdir $MNT/b
    csv=$(bonnie++ -u root -s 0 -n 64 -d $MNT/b -q 2>/dev/null | tail -1)
    if [ $cfg = btrfs ]; then umount $MNT; rm -f $W/btrfs.img; else $B umount $MNT; rm -rf $W/store; fi
    echo "$cfg $csv"
  done
  echo "# after round $r load: $(cut -d' ' -f1-3 /proc/loadavg)"
done
