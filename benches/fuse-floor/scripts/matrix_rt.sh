#!/bin/bash
# Same alternation as matrix.sh but every process (benchmark caller and daemon) runs SCHED_FIFO prio 10
# (chrt -f 10), so our threads do not wait behind the other engineers' compilers. Root-disk native left out.
ROUNDS=${ROUNDS:-4}
N=${N:-20000}
B=${FLOOR_BIN:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/kaiso-fuse-floor}
D=${FLOOR_DIR:-/tmp/fuse-floor}
S=$(dirname "$0")/run_one.sh
nat() { rm -rf "$1"; mkdir -p "$1"
  echo "== $2 mode=native n=$N pin=$3 $(date -u +%T) uptime:$(uptime)"
  P=(); [ "$3" != none ] && P=(--pin $3)
  chrt -f 10 $B work --dir "$1" --n $N "${P[@]}" --label "$2"; rm -rf "$1"; }
for r in $(seq 1 $ROUNDS); do
  for pin in none 0; do
    nat $D/nat-ext4/d    "native-ext4img/p$pin" $pin
    nat /dev/shm/uf-nat  "native-tmpfs/p$pin" $pin
    chrt -f 10 $S $B classic $N $pin "classic-1thr/p$pin" --threads 1
    chrt -f 10 $S $B classic $N $pin "classic-2thr/p$pin" --threads 2
    chrt -f 10 $S $B uring $N $pin "uring-plain/p$pin"
    chrt -f 10 $S $B uring $N $pin "uring-dt/p$pin" --defer-taskrun
  done
done
echo MATRIX-DONE $(date -u +%T)
