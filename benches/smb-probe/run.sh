#!/usr/bin/env bash
# Starts Samba's smbd on loopback over a generated tree, runs smb_probe (kaiso's SMB
# source against the smb2 crate, alternated) and stops smbd again. No delay proxy.
#
#   cargo build --release --manifest-path benches/smb-probe/Cargo.toml
#   benches/smb-probe/run.sh [ROUNDS] [TESTS...]
#
# ROUNDS (default 3): how many kaiso/smb2 pairs each test gets. TESTS (default
# "large small meta"). Needs smbd, smbpasswd, smbclient, python3; run as root
# (the share's account is root, as in crates/source/tests). Env: PROBE (the binary, default
# benches/smb-probe/target/release/kaiso-smb-probe or $CARGO_TARGET_DIR's), WORK (where the tree
# and smbd's state go, default a new directory under /tmp), EXTRA (more probe flags),
# SMB2_EXTRA (more flags for the smb2 runs only, e.g. "--piece 8388608" or
# "--no-compound 1"), DELAY_MS (put smb_probe's own delay proxy, DELAY_MS each way,
# between the clients and smbd; its CPU is not counted as either side's), RUN_TIMEOUT
# (seconds a run may take, default 300), PROBE_ENV (environment for the measured runs
# only, e.g. "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432").
set -euo pipefail

rounds=${1:-3}
shift || true
tests=${*:-large small meta}
here=$(cd "$(dirname "$0")" && pwd)
probe=${PROBE:-${CARGO_TARGET_DIR:-$here/target}/release/kaiso-smb-probe}
[ -x "$probe" ] || { echo "build it first: no $probe" >&2; exit 2; }
for p in smbd smbpasswd smbclient python3; do
    command -v "$p" >/dev/null || { echo "missing $p" >&2; exit 2; }
done

work=${WORK:-$(mktemp -d /tmp/smb-probe.XXXXXX)}
share=$work/share
state=$work/samba
smbd_pid=
proxy_pid=
cleanup() {
    [ -z "$proxy_pid" ] || { kill "$proxy_pid" 2>/dev/null || true; wait "$proxy_pid" 2>/dev/null || true; }
    if [ -n "$smbd_pid" ]; then
        kill -TERM "$smbd_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$smbd_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$smbd_pid" 2>/dev/null || true
        wait "$smbd_pid" 2>/dev/null || true
    fi
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# The tree: large/f00..f19 of 25 MiB; small/d00..d19/f000..f099 of 700-900 KiB, every
# tenth small file with a user.* xattr (an EA over SMB).
mkdir -p "$share" "$state"
python3 - "$share" <<'EOF'
import os, sys, random
root = sys.argv[1]
rnd = random.Random(7)
blob = os.urandom(25 << 20)
os.makedirs(f"{root}/large")
for i in range(20):
    with open(f"{root}/large/f{i:02}", "wb") as f:
        f.write(blob[i:] + blob[:i])
for d in range(20):
    os.makedirs(f"{root}/small/d{d:02}")
    for i in range(100):
        size = (700 << 10) + rnd.randrange(200 << 10)
        off = rnd.randrange(len(blob) - size)
        path = f"{root}/small/d{d:02}/f{i:03}"
        with open(path, "wb") as f:
            f.write(blob[off:off + size])
        if i % 10 == 0:
            os.setxattr(path, "user.color", f"blue-{d}-{i}".encode())
EOF

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
for d in private lock state cache pid ncalrpc log; do mkdir -p "$state/$d"; done
cat >"$state/smb.conf" <<EOF
[global]
  log level = 1
  smb ports = $port
  interfaces = 127.0.0.1
  bind interfaces only = yes
  private dir = $state/private
  lock directory = $state/lock
  state directory = $state/state
  cache directory = $state/cache
  pid directory = $state/pid
  ncalrpc dir = $state/ncalrpc
  log file = $state/log/log.%m
  passdb backend = tdbsam:$state/private/passdb.tdb
  server role = standalone server
  disable netbios = yes
  load printers = no
  printcap name = /dev/null
  disable spoolss = yes
  server min protocol = SMB2_02
  ea support = yes
  vfs objects = acl_xattr streams_xattr
[src]
  path = $share
  read only = no
  valid users = root
EOF
password="Probe-$$-pw"
printf '%s\n%s\n' "$password" "$password" |
    smbpasswd -c "$state/smb.conf" -a -s root >/dev/null
# smbd makes itself a session leader (setsid) unless told otherwise.
smbd --foreground -s "$state/smb.conf" </dev/null >/dev/null 2>&1 &
smbd_pid=$!
for _ in $(seq 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done

# Named streams on five small files, written by the real client.
head -c 3000 /dev/urandom >"$work/stream"
cmds=""
for d in 00 05 10 15 19; do cmds+="put $work/stream small/d$d/f001:extra;"; done
smbclient "//127.0.0.1/src" -p "$port" -U "root%$password" -c "$cmds" >/dev/null

client_port=$port
if [ -n "${DELAY_MS:-}" ]; then
    "$probe" --proxy-to "$port" --delay-ms "$DELAY_MS" >"$work/proxy.out" &
    proxy_pid=$!
    for _ in $(seq 100); do grep -q proxy_port "$work/proxy.out" && break; sleep 0.1; done
    client_port=$(sed -n 's/^proxy_port=//p' "$work/proxy.out")
    echo "# delay proxy: ${DELAY_MS} ms each way, port $client_port -> $port"
fi

run() {
    echo "# $(date -u +%H:%M:%S) UTC, uptime:$(uptime | sed 's/.*load average/ load average/')"
    # A run that hangs (the smb crate can wait for credits forever) is stopped and
    # reported; the next run starts on fresh connections.
    local rc=0
    # shellcheck disable=SC2086
    timeout "${RUN_TIMEOUT:-300}" env ${PROBE_ENV:-} "$probe" --port "$client_port" \
        --password "$password" --smbd-sid "$smbd_pid" "$@" ${EXTRA:-} ||
        rc=$?
    [ "$rc" = 0 ] || echo "# run failed (exit $rc; 124 = stopped after ${RUN_TIMEOUT:-300} s): $*"
}

run --client smb2 --test verify
for t in $tests; do
    for _ in $(seq "$rounds"); do
        run --client kaiso --test "$t"
        # shellcheck disable=SC2086
        run --client smb2 --test "$t" ${SMB2_EXTRA:-}
    done
done
