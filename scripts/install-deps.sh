#!/usr/bin/env bash
# Installs what building and testing kaiso needs on a fresh Debian machine: the Rust
# toolchain (if missing) and the Debian packages listed in scripts/deps/*.list (one
# package a line; each capability keeps its own list). Idempotent and quiet when done.
set -euo pipefail
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

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    echo "install-deps: cargo is in ~/.cargo/bin; add it to PATH"
  else
    echo "install-deps: installing the Rust toolchain from Debian (rustup is not reachable here)"
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cargo rustc >/dev/null
  fi
fi

# FUSE needs the device and, for allow_other, fusermount3; both come with fuse3.
[ -e /dev/fuse ] || echo "install-deps: warning: /dev/fuse is missing; FUSE tests will be skipped" >&2
exit 0
