#!/usr/bin/env bash
# A local S3-compatible server for tests and benchmarks: s3s-fs (crates.io), an S3 server over
# a local directory, listening on 127.0.0.1 only.
#
#   scripts/s3-local.sh install      installs s3s-fs with cargo if it is missing (idempotent)
#   scripts/s3-local.sh start DIR    starts a server with its data in DIR/data on a free port,
#                                    creates the bucket `compfs`, and prints `export NAME=value`
#                                    lines (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
#                                    AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP)
#   scripts/s3-local.sh stop DIR     stops the server started in DIR
#
# Use: eval "$(scripts/s3-local.sh start /tmp/s3)"; compfs mkfs s3://compfs/test; ...
set -euo pipefail

S3S_VERSION=0.14.1   # 0.17 needs rustc 1.96; 0.14.1 builds with 1.92 and later
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

install() {
  if command -v s3s-fs >/dev/null 2>&1; then
    return 0
  fi
  echo "installing s3s-fs $S3S_VERSION from crates.io (once) ..." >&2
  cargo install --quiet --locked s3s-fs --version "$S3S_VERSION" --features binary >&2
}

# A port nothing listens on (a connection to it is refused); the start loop retries when the
# server cannot bind it after all.
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
}

start() {
  local dir=$1
  install
  mkdir -p "$dir/data/compfs"
  dir=$(cd "$dir" && pwd)
  if [ -f "$dir/server.pid" ] && kill -0 "$(cat "$dir/server.pid")" 2>/dev/null; then
    echo "a server already runs for $dir (pid $(cat "$dir/server.pid"))" >&2
    return 1
  fi
  local port key=compfs-test secret=compfs-test-secret i
  for i in 1 2 3 4 5; do
    port=$(free_port)
    setsid s3s-fs --host 127.0.0.1 --port "$port" --access-key "$key" --secret-key "$secret" \
      "$dir/data" </dev/null >"$dir/server.log" 2>&1 &
    echo $! >"$dir/server.pid"
    echo "$port" >"$dir/server.port"
    for _ in $(seq 1 100); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        cat <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_ACCESS_KEY_ID=$key
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_REGION=us-east-1
export AWS_ALLOW_HTTP=true
EOF
        return 0
      fi
      kill -0 "$(cat "$dir/server.pid")" 2>/dev/null || break
      sleep 0.05
    done
    # The port was taken meanwhile, or the server died: try another.
    kill "$(cat "$dir/server.pid")" 2>/dev/null || true
  done
  echo "s3s-fs did not start; its log:" >&2
  cat "$dir/server.log" >&2
  return 1
}

stop() {
  local dir=$1 pid
  [ -f "$dir/server.pid" ] || return 0
  pid=$(cat "$dir/server.pid")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/server.pid"
}

case "${1:-}" in
  install) install ;;
  start) [ $# -eq 2 ] || { echo "usage: $0 start DIR" >&2; exit 2; }; start "$2" ;;
  stop) [ $# -eq 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
