#!/bin/bash
# Control 2: classic transport with one reader thread pinned per CPU (what affinity alone can do with today's
# /dev/fuse), next to io_uring; caller unpinned and pinned to CPU 0; RT=1 runs everything SCHED_FIFO 10.
ROUNDS=${ROUNDS:-3}; N=${N:-20000}; RT=${RT:-1}
B=${FLOOR_BIN:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/kaiso-fuse-floor}
D=${FLOOR_DIR:-/tmp/fuse-floor}
S=$(dirname "$0")/run_one.sh
C=(); [ "$RT" = 1 ] && C=(chrt -f 10)
nat() { rm -rf "$1"; mkdir -p "$1"
  echo "== $2 mode=native n=$N pin=$3 $(date -u +%T) uptime:$(uptime)"
  P=(); [ "$3" != none ] && P=(--pin $3)
  "${C[@]}" $B work --dir "$1" --n $N "${P[@]}" --label "$2"; rm -rf "$1"; }
for r in $(seq 1 $ROUNDS); do
  for pin in none 0; do
    nat $D/nat-ext4/d    "native-ext4img/p$pin" $pin
    nat /dev/shm/uf-nat  "native-tmpfs/p$pin" $pin
    "${C[@]}" $S $B classic $N $pin "classic-1thr/p$pin" --threads 1
    "${C[@]}" $S $B classic $N $pin "classic-2thr-percpu/p$pin" --threads 2 --pin-devfuse each
    "${C[@]}" $S $B classic $N $pin "classic-4thr-percpu/p$pin" --threads 4 --pin-devfuse each
    "${C[@]}" $S $B uring $N $pin "uring-plain/p$pin"
  done
done
echo MATRIX-DONE $(date -u +%T)
