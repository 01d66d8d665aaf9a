#!/bin/bash
# Untar of /usr/include onto compfs (ring, several depths / no ring) and kernel btrfs,
# alternating, ROUNDS rounds. Each run: fresh store or image, `tar xf`, `sync`, `sync MNT`.
# Root; B = the compfs binary (a release build copied to /dev/shm), W = the work directory.
set -u
B=${B:-/dev/shm/compfs-uring}
ROUNDS=${ROUNDS:-5}
CONFIGS=${CONFIGS:-"ring nouring btrfs ring-d1 ring-d4"}
W=${W:-/var/tmp/uring-bench}; mkdir -p $W
TAR=/tmp/inc.tar
[ -f $TAR ] || tar cf $TAR -C /usr include
MNT=$W/mnt; mkdir -p $MNT
run_one() {
  local cfg=$1 t0 t1
  case $cfg in
    btrfs)
      rm -f $W/btrfs.img; truncate -s 2G $W/btrfs.img; mkfs.btrfs -q $W/btrfs.img >/dev/null
      mount -o loop,compress=zstd:3 $W/btrfs.img $MNT ;;
    *)
      local o=compress=zstd:3
      case $cfg in
        ring) o=$o,uring ;; ring-d1) o=$o,uring,uring_depth=1 ;; ring-d4) o=$o,uring,uring_depth=4 ;;
        nouring) o=$o,nouring ;;
      esac
      rm -rf $W/store; $B mkfs $W/store >/dev/null
      $B mount $W/store $MNT -o $o || { echo "mount $cfg failed"; return 1; } ;;
  esac
  sync; sleep 0.5
  t0=$(date +%s.%N)
  tar xf $TAR -C $MNT && sync && sync $MNT
  t1=$(date +%s.%N)
  if [ $cfg = btrfs ]; then umount $MNT; rm -f $W/btrfs.img; else $B umount $MNT; rm -rf $W/store; fi
  echo "$cfg $(echo "$t1 - $t0" | bc)"
}
echo "# $(date -u) load: $(cut -d' ' -f1-3 /proc/loadavg) binary $B"
for r in $(seq 1 $ROUNDS); do
  for c in $CONFIGS; do run_one $c; done
  echo "# after round $r load: $(cut -d' ' -f1-3 /proc/loadavg)"
done
