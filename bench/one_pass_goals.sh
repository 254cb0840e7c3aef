#!/usr/bin/env bash
# Every measure of the one-pass goals (bench/README.md, "The one-pass issue's goals"), one
# after the other on one build, so that the table is filled from one run. Each driver's own
# output is kept in the log directory it prints; the table is read off them.
#
#   1. CPU per request, P1/P16 GET/SET: saltshaker --threads 1 against nutcracker and the
#      node, and the same binary at --threads 2 as the second target (cpu_per_request.py).
#   2. Throughput over one node, two threads (the default here), P1/P16 (proxy_bench.sh).
#   3. Throughput in front of a 3-master Redis Cluster, two threads (cluster_bench.sh).
#   4. Latency at 1 and 4 connections, default threads (latency.py).
#   5. RSS per idle connection, and after connections open and close (conn_memory.py).
#   6. A salted GET against a plain one (salted_get.sh).
#   7. Detection on against off (detection_overhead.sh).
#   8. System calls per request, saltshaker against nutcracker (syscalls_per_request.sh).
#   9. The kernel's share of each proxy's CPU at P1 and P16 (cpu_split.py).
#
# A driver that fails is reported and the next one runs.
#
# usage: bench/one_pass_goals.sh [--bin PATH] [-n REQUESTS] [--rounds R] [--only a,b]
#   --only  the drivers to run, by the names above: cpu, throughput, cluster, latency,
#           memory, salted_get, detection, syscalls, split (default: all)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin=""
n=200000
rounds=3
only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        -n) n=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --only) only=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ -z "$bin" ]; then
    (cd "$root" && cargo build --release --quiet --bin saltshaker)
    bin=$root/target/release/saltshaker
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
logs=$(mktemp -d "${TMPDIR:-/tmp}/one-pass-goals.XXXXXX")
echo "one_pass_goals: logs in $logs"

run() {
    local name=$1
    shift
    case ",${only:-$name}," in *",$name,"*) ;; *) return 0 ;; esac
    echo
    echo "=== $name: $*"
    local t0 rc=0
    t0=$(date +%s)
    (cd "$here" && "$@") 2>&1 | tee "$logs/$name.log" || rc=$?
    echo "=== $name took $(($(date +%s) - t0)) s (exit $rc)"
}

run cpu python3 cpu_per_request.py --saltshaker "$bin" --bin-b "$bin" --threads-b 2 \
    -n "$n" --rounds "$rounds"
run throughput ./proxy_bench.sh --bin "$bin" --no-readme --rounds "$rounds" --threads 2 -n "$n"
run cluster ./cluster_bench.sh --bin "$bin" -n "$n" --rounds "$rounds" --threads 2
run latency python3 latency.py --saltshaker "$bin" --rounds "$rounds" --duration-ms 4000
run memory python3 conn_memory.py --saltshaker "$bin" --conns 8000 --churn 4000 --rounds 7
run salted_get ./salted_get.sh --bin "$bin" --duration-ms 4000
run detection ./detection_overhead.sh --bin "$bin" --no-build --no-readme -n "$n" \
    --rounds "$rounds"
run syscalls ./syscalls_per_request.sh --bin "$bin" -n "$n"
run split python3 cpu_split.py --saltshaker "$bin"
echo
echo "one_pass_goals: done; logs in $logs"
