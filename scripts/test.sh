#!/usr/bin/env bash
# Runs every test of the workspace: unit, property, crash, FUSE and NBD integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
. scripts/toolchain.sh
cargo build --workspace --bins
cargo test --workspace 2>&1
