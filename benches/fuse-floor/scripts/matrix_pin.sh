#!/bin/bash
# Control: is it io_uring, or just having the daemon thread on the caller's CPU?
# Caller pinned to CPU 0; classic reader thread pinned to CPU 0 (same) or CPU 1 (other); io_uring with the
# /dev/fuse (FORGET) reader pinned to CPU 0. Run under SCHED_FIFO 10 (RT=1) or normal CFS (RT=0).
ROUNDS=${ROUNDS:-4}; N=${N:-20000}; RT=${RT:-1}
B=${FLOOR_BIN:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/kaiso-fuse-floor}
D=${FLOOR_DIR:-/tmp/fuse-floor}
S=$(dirname "$0")/run_one.sh
C=(); [ "$RT" = 1 ] && C=(chrt -f 10)
tag=$([ "$RT" = 1 ] && echo rt || echo cfs)
nat() { rm -rf "$1"; mkdir -p "$1"
  echo "== $2 mode=native n=$N pin=0 $(date -u +%T) uptime:$(uptime)"
  "${C[@]}" $B work --dir "$1" --n $N --pin 0 --label "$2"; rm -rf "$1"; }
for r in $(seq 1 $ROUNDS); do
  nat $D/nat-ext4/d    "native-ext4img/p0"
  nat /dev/shm/uf-nat  "native-tmpfs/p0"
  "${C[@]}" $S $B classic $N 0 "classic-1thr-samecpu/p0" --threads 1 --pin-devfuse 0
  "${C[@]}" $S $B classic $N 0 "classic-1thr-othercpu/p0" --threads 1 --pin-devfuse 1
  "${C[@]}" $S $B classic $N 0 "classic-1thr-unpinned/p0" --threads 1
  "${C[@]}" $S $B uring $N 0 "uring-plain/p0"
  "${C[@]}" $S $B uring $N 0 "uring-plain-fgt0/p0" --pin-devfuse 0
  "${C[@]}" $S $B uring $N 0 "uring-dt-fgt0/p0" --defer-taskrun --pin-devfuse 0
done
echo MATRIX-DONE $(date -u +%T)
