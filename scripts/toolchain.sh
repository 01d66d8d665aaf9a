#!/usr/bin/env bash
# Makes a Rust toolchain new enough for compfs (rust-version in Cargo.toml) available, installing
# rustup's stable toolchain (minimal profile, from https://sh.rustup.rs) into ~/.cargo when
# cargo is missing or older. Debian 12's own cargo package (1.63) is too old.
# Source it (`. scripts/toolchain.sh`): it puts the toolchain on PATH for the calling script.
# Running it directly installs and prints what to add to PATH.

compfs_need_rust() {
  sed -n 's/^rust-version = "\(.*\)"/\1/p' "$(dirname "${BASH_SOURCE[0]}")/../Cargo.toml" | head -1
}

# True when `cargo` on PATH reports at least version $1.
compfs_cargo_ok() {
  local have
  have=$(cargo --version 2>/dev/null | awk '{ print $2 }') || return 1
  [ -n "$have" ] || return 1
  [ "$(printf '%s\n%s\n' "$1" "$have" | sort -V | head -1)" = "$1" ]
}

compfs_toolchain() {
  local need
  need=$(compfs_need_rust)
  need=${need:-1.85}
  # A rustup installed earlier (by this script or by hand) comes first.
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    case ":$PATH:" in *":$HOME/.cargo/bin:"*) ;; *) PATH="$HOME/.cargo/bin:$PATH" ;; esac
    export PATH
  fi
  compfs_cargo_ok "$need" && return 0
  if command -v cargo >/dev/null 2>&1; then
    echo "toolchain: $(cargo --version) is older than the Rust $need compfs needs" >&2
  else
    echo "toolchain: cargo is missing; compfs needs Rust $need or newer" >&2
  fi
  if command -v rustup >/dev/null 2>&1; then
    echo "toolchain: rustup toolchain install stable --profile minimal" >&2
    rustup toolchain install stable --profile minimal >&2 && rustup default stable >&2 || return 1
  else
    "$(dirname "${BASH_SOURCE[0]}")/deps.sh" curl || return 1
    echo "toolchain: installing Rust with rustup (https://sh.rustup.rs, minimal profile) into ~/.cargo" >&2
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
      | sh -s -- -y --profile minimal --default-toolchain stable --no-modify-path >&2 || return 1
    PATH="$HOME/.cargo/bin:$PATH"
    export PATH
  fi
  hash -r
  if ! compfs_cargo_ok "$need"; then
    echo "toolchain: still no cargo >= $need on PATH ($(command -v cargo || echo none))" >&2
    return 1
  fi
  echo "toolchain: using $(cargo --version) from $(command -v cargo)" >&2
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  compfs_toolchain
  echo "cargo: $(command -v cargo) ($(cargo --version)); add $HOME/.cargo/bin to PATH if it is not there"
else
  compfs_toolchain || { echo "toolchain: cannot set up Rust; see README.md (Set-up)" >&2; return 1; }
fi
