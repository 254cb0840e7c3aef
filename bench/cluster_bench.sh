#!/usr/bin/env bash
# Throughput in front of a Redis Cluster: one 3-master cluster (no replicas) on loopback,
# and in alternating rounds redis-benchmark GET and SET at pipeline 1 and 16:
#   direct:  redis-benchmark --cluster straight at the cluster (the cluster-aware client);
#   proxy:   redis-benchmark through saltshaker --cluster (a plain client).
# Prints the median requests/s of each, proxy/direct, and the proxy's CPU per request
# (from /proc). With `--bin-b PATH` a second build runs beside the first on the same
# cluster, in the same rounds, and its columns follow (b/a CPU per request is the figure
# that noise moves least). See bench/README.md for the recorded results.
#
# usage: bench/cluster_bench.sh [--bin PATH] [--bin-b PATH] [-n REQUESTS] [--rounds R]
#                               [--threads T]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin="${CARGO_TARGET_DIR:-$root/target}/release/saltshaker"
bin_b=""
requests=200000
rounds=3
threads=1
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --bin-b) bin_b=$2; shift 2 ;;
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
start_proxy() {
    local port=$1 exe=$2
    "$exe" --listen "127.0.0.1:$port" --admin "127.0.0.1:$(free_port)" \
        --cluster "127.0.0.1:${ports[0]}" --threads "$threads" --log-level warn \
        2>>"$work/proxy.log" &
    pids+=($!)
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
}
declare -A port pid
port[proxy]=$(free_port)
start_proxy "${port[proxy]}" "$bin"
pid[proxy]=${pids[-1]}
sides="direct proxy"
if [ -n "$bin_b" ]; then
    [ -x "$bin_b" ] || { echo "cluster_bench: --bin-b $bin_b is not an executable" >&2; exit 1; }
    port[proxyb]=$(free_port)
    start_proxy "${port[proxyb]}" "$bin_b"
    pid[proxyb]=${pids[-1]}
    sides="direct proxy proxyb"
fi

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A rps cpu
for ((r = 0; r < rounds; r++)); do
    # Each round starts with the next side, so drift on a shared machine falls on all.
    read -ra order <<<"$sides"
    n=${#order[@]}
    for ((i = 0; i < n; i++)); do
        side=${order[$(((i + r) % n))]}
        for p in 1 16; do
            for t in get set; do
                if [ "$side" = direct ]; then
                    args=(--cluster -p "${ports[0]}")
                    watch=${pid[proxy]}
                else
                    args=(-p "${port[$side]}")
                    watch=${pid[$side]}
                fi
                before=$(ticks "$watch")
                out=$(redis-benchmark "${args[@]}" -n "$requests" -c 50 -P "$p" -t "$t" \
                    -r 100000 -q 2>/dev/null | tr '\r' '\n' | grep -E 'requests per second' | tail -n 1)
                after=$(ticks "$watch")
                v=$(grep -oE '[0-9]+(\.[0-9]+)?' <<<"${out#*: }" | head -n 1)
                rps[$side,$t,$p]+="$v "
                cpu[$side,$t,$p]+="$((after - before)) "
            done
        done
    done
done
hz=$(getconf CLK_TCK)
head="$(printf '%-6s %-4s %14s %14s %12s %14s' test P "direct req/s" "proxy req/s" "proxy/direct" "proxy us CPU/req")"
[ -n "$bin_b" ] && head+="$(printf ' %14s %10s %14s %10s' "b req/s" "b/direct" "b us CPU/req" "b/a CPU")"
echo "$head"
for t in get set; do
    for p in 1 16; do
        python3 - "$t" "$p" "$requests" "$hz" "${rps[direct,$t,$p]}" "${rps[proxy,$t,$p]}" \
            "${cpu[proxy,$t,$p]}" "${rps[proxyb,$t,$p]:-}" "${cpu[proxyb,$t,$p]:-}" <<'EOF'
import statistics, sys
t, p, n, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rd, rp, cp, rb, cb = (list(map(float, x.split())) for x in sys.argv[5:10])
md, mp = statistics.median(rd), statistics.median(rp)
up = statistics.median(cp) / hz / n * 1e6
line = f"{t:<6} {p:<4} {md:14.0f} {mp:14.0f} {mp / md:12.3f} {up:14.2f}"
if rb:
    mb = statistics.median(rb)
    ub = statistics.median(cb) / hz / n * 1e6
    line += f" {mb:14.0f} {mb / md:10.3f} {ub:14.2f} {ub / up:10.3f}"
print(line)
EOF
    done
done
