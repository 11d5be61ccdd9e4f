#!/usr/bin/env bash
# kaiso demo (run by `make demo` after the release build): a 3-tier store in a temporary
# directory - emulated NVM, emulated SSD and an emulated HDD at the bottom - with all data
# starting on the HDD. A Zipf-skewed read workload runs in rounds; between rounds you see
# kaiso promote the hot files (kaiso status, files per tier, kaiso where) and the mean
# read latency fall. Everything is unmounted and removed at the end, also on Ctrl-C.
#
# The devices are emulated in user space (service-time models from crates/device added on
# each tier's data path), because this machine has one kind of disk; see docs/tiering.md.
#
# Environment: KAISO (binary, default target/release/kaiso), DEMO_FILES (default 160),
# DEMO_ROUNDS (default 6), DEMO_ROUND_SECS (default 10).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
kaiso=${KAISO:-${CARGO_TARGET_DIR:-$here/target}/release/kaiso}
files=${DEMO_FILES:-160}
rounds=${DEMO_ROUNDS:-6}
round_secs=${DEMO_ROUND_SECS:-10}

if [ ! -x "$kaiso" ]; then
  echo "demo: $kaiso not found; run 'make demo' (it builds the release binary first)" >&2
  exit 1
fi
if [ ! -e /dev/fuse ]; then
  echo "demo: /dev/fuse is missing: FUSE is needed to mount kaiso" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ] && ! command -v fusermount3 >/dev/null; then
  echo "demo: run as root, or install fuse3 (fusermount3) to mount as a user" >&2
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/kaiso-demo.XXXXXX")
mnt=$work/mnt
daemon=""

cleanup() {
  set +e
  if mountpoint -q "$mnt" 2>/dev/null; then
    fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null
  fi
  if [ -n "$daemon" ]; then
    for _ in $(seq 50); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
    kill "$daemon" 2>/dev/null
    wait "$daemon" 2>/dev/null
  fi
  rm -rf "$work"
  echo "demo: unmounted and removed $work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$work"/{nvm,ssd,hdd,state} "$mnt"
cat >"$work/kaiso.toml" <<EOF
[store]
state_dir = "$work/state"

[store.mover]
interval_ms = 1000
# The demo's own reads keep the emulated HDD busy; let the mover promote anyway
# (the default, 0.5, pauses moves while the foreground is busy).
busy_backoff = 1.0

[[tier]]
name = "nvm"
path = "$work/nvm"
capacity = "12MiB"
[tier.device]
kind = "nvm"

[[tier]]
name = "ssd"
path = "$work/ssd"
capacity = "40MiB"
[tier.device]
kind = "ssd"

[[tier]]
name = "hdd"
path = "$work/hdd"
capacity = "4GiB"
[tier.device]
kind = "hdd"
EOF

echo "== kaiso demo in $work"
echo "   tiers: nvm 12 MiB, ssd 40 MiB, hdd 4 GiB (all emulated devices); $files files of 1 MiB, all on the hdd"
for i in $(seq 0 $((files - 1))); do
  d=$work/hdd/data/d$((i % 8))
  mkdir -p "$d"
  head -c 1048576 /dev/urandom >"$d/file$(printf %04d "$i")"
done

"$kaiso" mount "$work/kaiso.toml" "$mnt" >"$work/mount.log" 2>&1 &
daemon=$!
for _ in $(seq 200); do
  mountpoint -q "$mnt" && break
  kill -0 "$daemon" 2>/dev/null || { echo "demo: kaiso mount failed:"; cat "$work/mount.log"; exit 1; }
  sleep 0.1
done
mountpoint -q "$mnt" || { echo "demo: mount did not appear"; cat "$work/mount.log"; exit 1; }
echo "== mounted at $mnt"

per_tier() {
  printf '   files per tier:'
  for t in nvm ssd hdd; do
    printf '  %s=%s' "$t" "$(find "$work/$t" -type f ! -name '.kaiso*' | wc -l)"
  done
  echo
}

show_status() {
  "$kaiso" status "$work/kaiso.toml" 2>&1 | sed 's/^/   /' || true
  per_tier
  hot=$(find "$work/nvm" -type f ! -name '.kaiso*' 2>/dev/null | head -n 1)
  if [ -n "$hot" ]; then
    rel=${hot#"$work/nvm/"}
    echo "   kaiso where $rel:"
    "$kaiso" where --config "$work/kaiso.toml" "$rel" 2>&1 | sed 's/^/     /' || true
  fi
}

show_status
means=()
for r in $(seq 1 "$rounds"); do
  echo "== round $r/$rounds: Zipf-skewed 64 KiB reads for ${round_secs} s"
  line=$("$kaiso" bench fs --zipf-on "$mnt/data" --seconds "$round_secs" --interval "$round_secs" --seed 7 | grep '^t=' | tail -n 1)
  echo "   $line"
  means+=("$(echo "$line" | sed -n 's/.*mean *\([0-9]*\) us.*/\1/p')")
  show_status
done

echo "== mean read latency per round (us): ${means[*]}"
echo "   first round ${means[0]} us -> last round ${means[-1]} us, as kaiso promoted the hot files"
echo "== unmounting"
fusermount3 -u "$mnt"
for _ in $(seq 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
daemon=""
echo "== after unmount the tiers are plain directories:"
per_tier
