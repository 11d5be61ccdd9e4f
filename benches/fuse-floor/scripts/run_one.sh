#!/bin/bash
# usage: run_one.sh BIN MODE(native|classic|uring) N PIN(cpu|none) LABEL [extra serve args...]
# Prints `uptime`, the RESULT lines, and the daemon's exit line (rusage).
set -u
BIN=$1; MODE=$2; N=$3; PIN=$4; LABEL=$5; shift 5
D=${FLOOR_DIR:-/tmp/fuse-floor}
MNT=$D/mnt
mkdir -p "$MNT"
PINARG=(); [ "$PIN" != none ] && PINARG=(--pin "$PIN")
echo "== $LABEL mode=$MODE n=$N pin=$PIN extra=[$*] $(date -u +%T) uptime:$(uptime)"
if [ "$MODE" = native ]; then
  rm -rf $D/native; mkdir -p $D/native
  $BIN work --dir $D/native --n $N "${PINARG[@]}" --label "$LABEL"
  exit $?
fi
mountpoint -q $MNT && { echo "mnt busy"; exit 1; }
LOG=$(mktemp /tmp/uf-daemon.XXXXXX)
$BIN serve --mnt $MNT --transport $MODE "$@" >$LOG.out 2>$LOG.err &
DPID=$!
for i in $(seq 1 100); do grep -q READY $LOG.out 2>/dev/null && break; sleep 0.05; done
if ! grep -q READY $LOG.out; then echo "daemon not ready"; cat $LOG.err; kill $DPID; umount -l $MNT 2>/dev/null; exit 1; fi
timeout 300 $BIN work --dir $MNT --n $N "${PINARG[@]}" --daemon-pid $DPID --label "$LABEL"
RC=$?
umount -l $MNT
for i in $(seq 1 100); do kill -0 $DPID 2>/dev/null || break; sleep 0.05; done
if kill -0 $DPID 2>/dev/null; then echo "daemon did not exit; killing"; kill -9 $DPID; fi
wait $DPID 2>/dev/null
sed 's/^/  daemon: /' $LOG.err
rm -f $LOG $LOG.out $LOG.err
exit $RC
