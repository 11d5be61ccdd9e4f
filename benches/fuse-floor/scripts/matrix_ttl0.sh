#!/bin/bash
# Round-trip cost: TTL 0 (every stat goes to the daemon: LOOKUP + GETATTR), SCHED_FIFO 10, caller pinned to CPU 0.
ROUNDS=${ROUNDS:-3}; N=${N:-20000}
B=${FLOOR_BIN:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/kaiso-fuse-floor}
D=${FLOOR_DIR:-/tmp/fuse-floor}
S=$(dirname "$0")/run_one.sh
for r in $(seq 1 $ROUNDS); do
  chrt -f 10 $S $B classic $N 0 "classic-1thr-ttl0/p0" --threads 1 --ttl-ms 0
  chrt -f 10 $S $B classic $N 0 "classic-1thr-samecpu-ttl0/p0" --threads 1 --pin-devfuse 0 --ttl-ms 0
  chrt -f 10 $S $B uring $N 0 "uring-plain-ttl0/p0" --ttl-ms 0
  chrt -f 10 $S $B uring $N 0 "uring-plain-fgt0-ttl0/p0" --ttl-ms 0 --pin-devfuse 0
done
echo MATRIX-DONE $(date -u +%T)
