#!/usr/bin/env bash
# Instructions per request, counted by callgrind: saltshaker (--threads 1) and nutcracker
# in front of the same redis-server, each under valgrind in turn, while
# `redis-benchmark -c 50 -r 100000 -n N -t T -P P` runs through it. Counting starts after
# a warm-up of 5,000 requests (`callgrind_control -z`) and stops at the end of the run
# (`-d`), so start-up is not counted.
#
# Instructions, unlike seconds, hardly depend on what else the machine runs: the same
# binary and load gave the same count within about 1% (15,343 and 15,468 for one build in
# two runs), which makes this the figure to compare builds with on a shared machine. It
# counts user-space work only (a system call is one instruction); `cpu_per_request.py`
# gives the time.
#
# Beside each count, in brackets, the *wakes* per request: the task polls tokio ran for
# saltshaker (calls of `tokio::runtime::task::raw::poll`), and the events nutcracker's loop
# handled (calls of `core_core`, one per socket event). A wake is one turn of the loop's
# work for one socket or task; twemproxy runs one callback per event, saltshaker a task.
#
# usage: bench/instructions_per_request.sh [--bin target/release/saltshaker]
#        [--bin-b OTHER] [-n 20000] [--tests get,set] [--pipelines 1]
set -euo pipefail
BIN=target/release/saltshaker BIN_B="" N=20000 TESTS=get,set PIPES=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --bin-b) BIN_B=$2; shift 2 ;;
    -n) N=$2; shift 2 ;;
    --tests) TESTS=$2; shift 2 ;;
    --pipelines) PIPES=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
for tool in valgrind callgrind_control redis-server redis-benchmark redis-cli nutcracker; do
  command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 1; }
done
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
R=$(port)
redis-server --port "$R" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >/dev/null & PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$R" ping >/dev/null 2>&1 && break; sleep 0.05; done

# count TARGET TEST PIPELINE: prints the instructions per request.
count() {
  local target=$1 t=$2 p=$3 lp pid out=$TMP/cg.$RANDOM
  lp=$(port)
  if [ "$target" = nutcracker ]; then
    printf 'pool:\n  listen: 127.0.0.1:%s\n  redis: true\n  server_connections: 1\n  servers:\n    - 127.0.0.1:%s:1\n' \
      "$lp" "$R" > "$TMP/nc.yml"
    valgrind --tool=callgrind --callgrind-out-file="$out" \
      nutcracker -c "$TMP/nc.yml" -s "$(port)" >/dev/null 2>&1 & pid=$!
  else
    valgrind --tool=callgrind --callgrind-out-file="$out" "$target" --listen "127.0.0.1:$lp" \
      --admin "127.0.0.1:$(port)" --nodes "127.0.0.1:$R" --threads 1 --log-level warn \
      >/dev/null 2>&1 & pid=$!
  fi
  for _ in $(seq 300); do redis-cli -p "$lp" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-benchmark -p "$lp" -c 50 -r 100000 -n 5000 -t "$t" -P "$p" -q >/dev/null 2>&1
  callgrind_control -z "$pid" >/dev/null
  redis-benchmark -p "$lp" -c 50 -r 100000 -n "$N" -t "$t" -P "$p" -q >/dev/null 2>&1
  callgrind_control -d "$pid" >/dev/null
  sleep 0.3
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  awk -v n="$N" '/^summary:/ {printf "%d", $2 / n}' "$out".1
  printf ' (%s)' "$(wakes "$out".1)"
}

# Calls, per request, of the functions that run one task or one event (see above), summed
# over callgrind's call lines (`cfn=(id) name` names a callee once; `calls=N` follows).
wakes() {
  awk -v n="$N" '
    /^fn=/ {
      id = $1; sub(/^fn=/, "", id); name = $0; sub(/^fn=\([0-9]+\) ?/, "", name)
      if (name != "") names[id] = name
      next
    }
    /^cfn=/ {
      id = $1; sub(/^cfn=/, "", id); name = $0; sub(/^cfn=\([0-9]+\) ?/, "", name)
      if (name != "") names[id] = name
      cur = names[id]; next
    }
    /^calls=/ && (cur ~ /tokio::runtime::task::raw::poll($|<)/ || cur ~ /^core_core$/) {
      split($1, a, "="); total += a[2]
    }
    END { printf "%.2f", total / n }' "$1"
}

targets=(nutcracker "$BIN")
[ -n "$BIN_B" ] && targets+=("$BIN_B")
echo "| test | $(printf '%s | ' "${targets[@]}")saltshaker ÷ nutcracker |"
echo "|---|$(printf -- '---|%.0s' "${targets[@]}")---|"
for t in ${TESTS//,/ }; do
  for p in ${PIPES//,/ }; do
    row=() nc=""
    for target in "${targets[@]}"; do
      v=$(count "$target" "$t" "$p")
      [ -z "$nc" ] && nc=$v
      row+=("$v")
    done
    ratio=$(awk -v a="${row[1]}" -v b="$nc" 'BEGIN {printf "%.2f", a / b}')
    echo "| P$p ${t^^} | $(printf '%s | ' "${row[@]}")$ratio |"
  done
done
