#!/usr/bin/env bash
# Skew in front of a Redis Cluster: one 3-master cluster, two saltshakers over it, one with
# every mitigation off (what the cluster sees from clients that go straight to it) and one
# with the default rules. `saltshaker bench` drives each with a uniform load (the balance
# baseline), a 30% viral INCR key, Zipf 1.1 reads, and a 30% viral GET key, and reads every
# master's INFO commandstats before and after: the busiest master's share and max/mean over
# masters. See bench/README.md for the recorded results.
#
# usage: bench/cluster_skew.sh [--bin PATH] [--duration-ms MS]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin="${CARGO_TARGET_DIR:-$root/target}/release/saltshaker"
duration=10000
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --duration-ms) duration=$2; shift 2 ;;
        *) echo "cluster_skew: unknown argument $1" >&2; exit 2 ;;
    esac
done
for tool in redis-server redis-cli python3; do
    command -v "$tool" >/dev/null || { echo "cluster_skew: $tool is not installed" >&2; exit 1; }
done
[ -x "$bin" ] || { echo "cluster_skew: build first (cargo build --release) or pass --bin" >&2; exit 1; }

# shellcheck source=bench/cluster.sh
source "$here/cluster.sh"
start_cluster
node_list=$(printf '127.0.0.1:%s,' "${ports[@]}")
node_list=${node_list%,}

start_proxy() { # rules-file -> sets $port (not in a subshell: the proxy must stay ours)
    port=$(free_port)
    "$bin" --listen "127.0.0.1:$port" --admin "127.0.0.1:$(free_port)" \
        --cluster "127.0.0.1:${ports[0]}" --rules "$1" --log-level warn \
        >>"$work/proxy.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
}
printf 'version: 1\nbalance: { enabled: false }\ndefaults:\n  write: { strategy: off }\n  read: { cache: { enabled: false } }\n' >"$work/off.yaml"
printf 'version: 1\n' >"$work/default.yaml"
start_proxy "$work/off.yaml"; off=$port
start_proxy "$work/default.yaml"; on=$port

run() { # name port workload mix
    for p in "${ports[@]}"; do redis-cli -p "$p" flushall >/dev/null; done
    "$bin" bench --target "127.0.0.1:$2" -c 50 -P 16 --duration-ms "$duration" --keyspace 100000 \
        --workload "$3" --mix "$4" --nodes "$node_list" --json >"$work/$1.json"
}
run uniform-off "$off" uniform incr=100
run uniform "$on" uniform incr=100
run viral-incr-off "$off" viral:likes:1:0.3 incr=100
run viral-incr "$on" viral:likes:1:0.3 incr=100
run zipf-get-off "$off" zipf:1.1 get=100
run zipf-get "$on" zipf:1.1 get=100
run viral-get-off "$off" viral:celeb:1:0.3 get=100
run viral-get "$on" viral:celeb:1:0.3 get=100

python3 - "$work" <<'EOF'
import json, sys
w = sys.argv[1]
print("| load | mitigation | client ops/s | busiest master share | max/mean over masters | errors |")
print("|---|---|---|---|---|---|")
for name, label in [("uniform", "uniform INCR"), ("viral-incr", "30% viral INCR"),
                    ("zipf-get", "Zipf 1.1 GET"), ("viral-get", "30% viral GET")]:
    for suffix, m in [("-off", "off"), ("", "default rules")]:
        r = json.load(open(f"{w}/{name}{suffix}.json"))
        loads = [n["commands"] for n in r["per_node"]]
        share = max(loads) / max(sum(loads), 1)
        print(f"| {label} | {m} | {r['ops_per_sec']:.0f} | {share:.3f} | {r['imbalance'] or 0:.2f} | {r['errors']} |")
EOF
