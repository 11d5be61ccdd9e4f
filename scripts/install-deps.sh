#!/usr/bin/env bash
# Installs what building and testing kaiso needs on a fresh Debian machine: the Rust
# toolchain (if missing) and the Debian packages listed in scripts/deps/*.list (one
# package a line; each capability keeps its own list). Idempotent and quiet when done.
set -euo pipefail
ORIG_PATH=$PATH
here=$(cd "$(dirname "$0")" && pwd)

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

want=$(cat "$here"/deps/*.list | sed 's/#.*//' | tr -s ' \t' '\n' | grep -v '^$' | sort -u)
missing=()
for pkg in $want; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Rust toolchain: the workspace's rust-version or newer. Debian's own rustc is older
# than that (1.63 in Debian 12), so it comes from rustup (minimal profile) when missing or
# too old; the Makefile puts ~/.cargo/bin first on PATH.
need=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' "$here/../Cargo.toml" | head -n 1)
export PATH="$HOME/.cargo/bin:$PATH"
rust_version() { { rustc --version 2>/dev/null || true; } | awk '{print $2}' | sed 's/-.*//'; }
new_enough() { [ -n "$1" ] && [ "$(printf '%s\n%s\n' "$need" "$1" | sort -V | head -n 1)" = "$need" ]; }
have=$(rust_version)
if ! command -v cargo >/dev/null 2>&1 || ! new_enough "$have"; then
  too_old="install-deps: error: kaiso needs Rust $need or newer (found: ${have:-none})"
  for pkg in curl ca-certificates; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || {
      sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get update -qq
      sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl ca-certificates >/dev/null
      break
    }
  done
  if command -v rustup >/dev/null 2>&1; then
    echo "install-deps: Rust ${have:-none} is older than $need; updating it with rustup"
    { rustup toolchain install stable --profile minimal && rustup default stable; } ||
      { echo "$too_old and rustup could not install it; run: rustup default stable" >&2; exit 1; }
  elif curl --proto '=https' --tlsv1.2 -sf --max-time 20 -o /dev/null https://sh.rustup.rs; then
    echo "install-deps: installing Rust (stable, at least $need) with rustup into ~/.cargo"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain stable
  else
    echo "$too_old and https://sh.rustup.rs is not reachable; install Rust $need or newer (https://rustup.rs) and rerun" >&2
    exit 1
  fi
  have=$(rust_version)
  if ! new_enough "$have"; then
    echo "install-deps: error: kaiso needs Rust $need or newer, and rustup left ${have:-none} on PATH" >&2
    exit 1
  fi
fi
if ! PATH=$ORIG_PATH command -v cargo >/dev/null 2>&1; then
  echo "install-deps: Rust $have is in ~/.cargo/bin; add it to PATH (make does)"
fi

# FUSE needs the device and, for allow_other, fusermount3; both come with fuse3.
[ -e /dev/fuse ] || echo "install-deps: warning: /dev/fuse is missing; FUSE tests will be skipped" >&2
exit 0
