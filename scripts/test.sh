#!/usr/bin/env bash
# Runs every test of the workspace: unit, property, crash, FUSE and NBD integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
. scripts/toolchain.sh
# The local S3 server of the object-store tests (s3s-fs, built once with cargo).
scripts/s3-local.sh install
cargo build --workspace --bins
cargo test --workspace 2>&1
