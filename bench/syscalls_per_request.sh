#!/usr/bin/env bash
# System calls and context switches per request, saltshaker (--threads 1) against
# nutcracker in front of the same redis-server: `perf stat` attached to each proxy while
# `redis-benchmark -c 50 -r 100000 -n N -t T -P P` runs through it.
#
# usage: bench/syscalls_per_request.sh [--bin target/release/saltshaker] [-n 200000]
#        [--tests get,set] [--pipelines 1,16]
set -euo pipefail
BIN=target/release/saltshaker N=200000 TESTS=get,set PIPES=1,16
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    -n) N=$2; shift 2 ;;
    --tests) TESTS=$2; shift 2 ;;
    --pipelines) PIPES=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
for tool in perf redis-server redis-benchmark nutcracker; do
  command -v "$tool" >/dev/null || { echo "missing tool: $tool" >&2; exit 1; }
done
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.05; done; echo "port $1 not up" >&2; exit 1; }
R=$(port); NC=$(port); SS=$(port)
redis-server --port "$R" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >/dev/null & PIDS+=($!)
wait_port "$R"
printf 'pool:\n  listen: 127.0.0.1:%s\n  redis: true\n  server_connections: 1\n  servers:\n    - 127.0.0.1:%s:1\n' "$NC" "$R" > "$TMP/nc.yml"
nutcracker -c "$TMP/nc.yml" -s "$(port)" >/dev/null 2>&1 & NCPID=$!; PIDS+=($NCPID)
"$BIN" --listen "127.0.0.1:$SS" --admin "127.0.0.1:$(port)" --nodes "127.0.0.1:$R" --threads 1 --log-level warn >/dev/null 2>&1 & SSPID=$!; PIDS+=($SSPID)
wait_port "$NC"; wait_port "$SS"
EVENTS='syscalls:sys_enter_recvfrom,syscalls:sys_enter_read,syscalls:sys_enter_sendto,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_readv,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_futex,context-switches'
echo "| test | proxy | $(echo "$EVENTS" | tr ',' '\n' | sed 's/syscalls:sys_enter_//' | paste -sd'|' | sed 's/|/ | /g') |"
echo "|---|---|$(echo "$EVENTS" | tr ',' '\n' | sed 's/.*/---/' | paste -sd'|')|"
for t in ${TESTS//,/ }; do
  for p in ${PIPES//,/ }; do
    for name in nutcracker saltshaker; do
      if [ $name = nutcracker ]; then pid=$NCPID; lp=$NC; else pid=$SSPID; lp=$SS; fi
      perf stat -x, -e "$EVENTS" -p "$pid" -o "$TMP/stat" -- \
        redis-benchmark -p "$lp" -c 50 -r 100000 -n "$N" -t "$t" -P "$p" -q >/dev/null
      row=$(awk -F, -v n="$N" '/^[0-9]/ {printf " %.3f |", $1/n}' "$TMP/stat")
      echo "| P$p ${t^^} | $name |$row"
    done
  done
done
