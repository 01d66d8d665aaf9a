#!/usr/bin/env bash
# The main job: build compfs and run the codec benchmark on data every Debian machine has.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh zstd lz4
cargo build --release -p compfs
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
# Text-like and executable-like samples, ~64 MB in all.
find /usr/share/doc -type f ! -name '*.gz' -size -1M 2>/dev/null | head -n 4000 | xargs -r cat > "$data/doc.txt" 2>/dev/null || true
find /usr/bin -maxdepth 1 -type f -size +100k 2>/dev/null | head -n 40 | xargs -r cat | head -c 48000000 > "$data/bin.exe" || true
./target/release/compfs bench codecs --levels zstd:-5..9,zlib:1..9,lzo,lz4 "$data/doc.txt" "$data/bin.exe"
