#!/bin/bash
# Round trip of a FUSE request (getxattr of a missing xattr: always answered by the daemon),
# requester pinned to CPU 0 or unpinned; ring vs /dev/fuse; microseconds per request.
B=${B:-/dev/shm/compfs-uring}; W=${W:-/var/tmp/uring-bench}; mkdir -p $W; MNT=$W/mnt; mkdir -p $MNT
for r in 1 2 3; do
for cfg in uring nouring; do
  rm -rf $W/store; $B mkfs $W/store >/dev/null; $B mount $W/store $MNT -o $cfg
  a=$(taskset -c 0 python3 $(dirname "$0")/rtt.py $MNT/f 20000); b=$(python3 $(dirname "$0")/rtt.py $MNT/f 20000)
  $B umount $MNT; rm -rf $W/store
  echo "$cfg pinned-cpu0 ${a}us unpinned ${b}us load $(cut -d' ' -f1 /proc/loadavg)"
done; done
