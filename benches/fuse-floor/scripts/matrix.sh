#!/bin/bash
# Main measurement: ROUNDS rounds, configurations alternating inside each round, caller unpinned and pinned to CPU 0.
# Natives: root-disk dir (/dev/vda ext4), fresh ext4 loop image on the same disk, tmpfs (/dev/shm).
ROUNDS=${ROUNDS:-8}
N=${N:-20000}
B=${FLOOR_BIN:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/kaiso-fuse-floor}
D=${FLOOR_DIR:-/tmp/fuse-floor}
S=$(dirname "$0")/run_one.sh
nat() { # dir label pin
  rm -rf "$1"; mkdir -p "$1"
  echo "== $2 mode=native n=$N pin=$3 $(date -u +%T) uptime:$(uptime)"
  P=(); [ "$3" != none ] && P=(--pin $3)
  $B work --dir "$1" --n $N "${P[@]}" --label "$2"
  rm -rf "$1"
}
for r in $(seq 1 $ROUNDS); do
  for pin in none 0; do
    nat $D/native        "native-rootfs/p$pin" $pin
    nat $D/nat-ext4/d    "native-ext4img/p$pin" $pin
    nat /dev/shm/uf-nat  "native-tmpfs/p$pin" $pin
    $S $B classic $N $pin "classic-1thr/p$pin" --threads 1
    $S $B classic $N $pin "classic-2thr/p$pin" --threads 2
    $S $B uring $N $pin "uring-plain/p$pin"
    $S $B uring $N $pin "uring-dt/p$pin" --defer-taskrun
  done
  if [ $r -le ${TTL0_ROUNDS:-3} ]; then
    $S $B classic $N none "classic-2thr-ttl0/pnone" --threads 2 --ttl-ms 0
    $S $B uring $N none "uring-dt-ttl0/pnone" --defer-taskrun --ttl-ms 0
    $S $B uring $N 0 "uring-dt-ttl0/p0" --defer-taskrun --ttl-ms 0
    $S $B classic $N 0 "classic-2thr-ttl0/p0" --threads 2 --ttl-ms 0
  fi
done
echo MATRIX-DONE $(date -u +%T)
