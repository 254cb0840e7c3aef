#!/usr/bin/env bash
# Throughput in front of a Redis Cluster: one 3-master cluster (no replicas) on loopback,
# and in alternating rounds redis-benchmark GET and SET at pipeline 1 and 16:
#   direct:  redis-benchmark --cluster straight at the cluster (the cluster-aware client);
#   proxy:   redis-benchmark through saltshaker --cluster (a plain client).
# Prints the median requests/s of each, proxy/direct, and the proxy's CPU per request
# (from /proc). See bench/README.md for the recorded results.
#
# usage: bench/cluster_bench.sh [--bin PATH] [-n REQUESTS] [--rounds R] [--threads T]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin="${CARGO_TARGET_DIR:-$root/target}/release/saltshaker"
requests=200000
rounds=3
threads=1
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        -n) requests=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        *) echo "cluster_bench: unknown argument $1" >&2; exit 2 ;;
    esac
done
for tool in redis-server redis-cli redis-benchmark python3; do
    command -v "$tool" >/dev/null || { echo "cluster_bench: $tool is not installed" >&2; exit 1; }
done
[ -x "$bin" ] || { echo "cluster_bench: build first (cargo build --release) or pass --bin" >&2; exit 1; }

# shellcheck source=bench/cluster.sh
source "$here/cluster.sh"
start_cluster
pport=$(free_port)
"$bin" --listen "127.0.0.1:$pport" --admin "127.0.0.1:$(free_port)" \
    --cluster "127.0.0.1:${ports[0]}" --threads "$threads" --log-level warn 2>"$work/proxy.log" &
ppid=$!
pids+=($ppid)
for _ in $(seq 50); do redis-cli -p "$pport" ping >/dev/null 2>&1 && break; sleep 0.1; done

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A rps cpu
for ((r = 0; r < rounds; r++)); do
    for side in $( [ $((r % 2)) -eq 0 ] && echo "direct proxy" || echo "proxy direct" ); do
        for p in 1 16; do
            for t in get set; do
                if [ "$side" = direct ]; then
                    args=(--cluster -p "${ports[0]}")
                else
                    args=(-p "$pport")
                fi
                before=$(ticks "$ppid")
                out=$(redis-benchmark "${args[@]}" -n "$requests" -c 50 -P "$p" -t "$t" \
                    -r 100000 -q 2>/dev/null | tr '\r' '\n' | grep -E 'requests per second' | tail -n 1)
                after=$(ticks "$ppid")
                v=$(grep -oE '[0-9]+(\.[0-9]+)?' <<<"${out#*: }" | head -n 1)
                rps[$side,$t,$p]+="$v "
                cpu[$side,$t,$p]+="$((after - before)) "
            done
        done
    done
done
hz=$(getconf CLK_TCK)
printf '%-6s %-4s %14s %14s %12s %14s\n' test P "direct req/s" "proxy req/s" "proxy/direct" "proxy us CPU/req"
for t in get set; do
    for p in 1 16; do
        python3 - "$t" "$p" "$requests" "$hz" "${rps[direct,$t,$p]}" "${rps[proxy,$t,$p]}" \
            "${cpu[proxy,$t,$p]}" <<'EOF'
import statistics, sys
t, p, n, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rd, rp, cp = (list(map(float, x.split())) for x in sys.argv[5:8])
md, mp = statistics.median(rd), statistics.median(rp)
up = statistics.median(cp) / hz / n * 1e6
print(f"{t:<6} {p:<4} {md:14.0f} {mp:14.0f} {mp / md:12.3f} {up:14.2f}")
EOF
    done
done
