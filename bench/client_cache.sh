#!/usr/bin/env bash
# Client-side caching through saltshaker over a 4-node pool: node-redis with its client
# cache off and on, a Zipf(1.1) read load over 100,000 keys (bench/client_cache.mjs), and
# the same with a `read.client_cache: { keys: hot_only }` rule.
#
# usage: bench/client_cache.sh [--bin target/release/saltshaker] [--reads 50000] [--clients 1]
# (with --clients N, N applications read at once, each --reads reads)
set -euo pipefail
BIN=target/release/saltshaker READS=50000 CLIENTS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$(realpath "$2"); shift 2 ;;
    --reads) READS=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
BIN=$(realpath "$BIN")
for tool in redis-server node npm; do
  command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 1; }
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$ROOT/tests/node/node_modules/redis/package.json" ] || (cd "$ROOT/tests/node" && npm install --no-audit --no-fund --no-package-lock >/dev/null)
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.05; done; echo "port $1 not up" >&2; exit 1; }
run() {
  local rules=$1 label=$2
  local NODES=() SPEC=""
  for i in 1 2 3 4; do
    local p; p=$(port)
    redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >/dev/null & PIDS+=($!)
    NODES+=("127.0.0.1:$p"); SPEC="$SPEC${SPEC:+,}127.0.0.1:$p"
    wait_port "$p"
  done
  local SS AD; SS=$(port); AD=$(port)
  local extra=()
  if [ -n "$rules" ]; then printf '%s' "$rules" > "$TMP/rules.yaml"; extra=(--rules "$TMP/rules.yaml"); fi
  "$BIN" --listen "127.0.0.1:$SS" --admin "127.0.0.1:$AD" --nodes "$SPEC" --log-level warn "${extra[@]}" >/dev/null 2>&1 & PIDS+=($!)
  wait_port "$SS"; wait_port "$AD"
  echo "### $label"
  (cd "$ROOT/tests/node" && node "$ROOT/bench/client_cache.mjs" "127.0.0.1:$SS" "127.0.0.1:$AD" "${NODES[@]}" --reads "$READS" --clients "$CLIENTS" $3)
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  PIDS=()
}
run "" "read.client_cache: all (the default)" ""
run $'version: 1\ndetection: { window_ms: 1000 }\ndefaults:\n  read: { hot_at_per_sec: 200, cool_below_per_sec: 50, client_cache: { keys: hot_only } }\n' "read.client_cache: hot_only, read-hot at 200/s" "--mode on"
