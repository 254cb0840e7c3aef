#!/usr/bin/env bash
# Read-hot benchmark: GET-only workloads over 4 redis-server nodes (Zipf 1.1, Zipf 1.3, one
# key taking 30% of GETs, and uniform as the balance baseline), through twemproxy
# (nutcracker), through saltshaker with the read-hot cache off, with it on under the default
# rules (a key is read-hot from 2000 reads/s, lower on a node busier than the others: balance),
# and with it on under the deep read cache of
# rules/examples/zipf-read-cache.yaml (read-hot from 2 reads/s, 8192 keys tracked per
# thread), all in one run. For each: client throughput and p99, the busiest node's share of
# backend commands and max/mean over nodes, and, with the cache on, the hit rate of cached
# reads. Results go between the read-hot markers in bench/README.md.
#
#   bench/read_hot.sh [--quick]
#
# TUNED_RULES=FILE runs the second cached proxy with another rules file.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
duration=8000 warmup=4000
[ "${1:-}" = "--quick" ] && duration=3000 warmup=3000
tuned_rules=${TUNED_RULES:-rules/examples/zipf-read-cache.yaml}

tag=readhot
# shellcheck source=bench/pool.sh
source "$root/bench/pool.sh"
printf 'backend:\n  nodes: ["127.0.0.1:1"]\ncache:\n  enabled: false\n' >"$work/nocache.yaml"
start_proxy --config "$work/nocache.yaml"
op=$proxy_port; oa=$proxy_admin

# The deep read cache: the head of the Zipf distribution is cached, not only the keys too
# hot for one node (see the rules file for why that takes thousands of keys).
"$bin" check "$tuned_rules" >/dev/null
start_proxy --rules "$tuned_rules"
tp=$proxy_port; ta=$proxy_admin

metric() { # admin-port name
    curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m { s += $2 } END { printf "%d\n", s }'
}

run() { # name target workload admin-port: prefill every key, then GETs only
    flush
    "$bin" bench --target "$2" -c 20 -P 16 -n 100000 --duration-ms 0 --keyspace 100000 --workload uniform --mix set=100 >/dev/null
    "$bin" bench --target "$2" -c 2 -P 1 -n 10 --duration-ms 0 --workload "$3" --mix set=100 >/dev/null
    # Warm up with the measured workload: the detector, the balance controller and the
    # cache reach their steady state (a few detection windows) before counting starts.
    "$bin" bench --target "$2" -c 50 -P 16 --duration-ms "$warmup" --keyspace 100000 \
        --workload "$3" --mix get=100 >/dev/null
    h0=$(metric "$4" saltshaker_cache_hits_total); m0=$(metric "$4" saltshaker_cache_misses_total)
    for n in "${nodes[@]}"; do redis-cli -h "${n%:*}" -p "${n#*:}" config resetstat >/dev/null; done
    "$bin" bench --target "$2" -c 50 -P 16 --duration-ms "$duration" --keyspace 100000 \
        --workload "$3" --mix get=100 --nodes "$node_list" --json >"$work/$1.json"
    h1=$(metric "$4" saltshaker_cache_hits_total); m1=$(metric "$4" saltshaker_cache_misses_total)
    k=$(metric "$4" 'saltshaker_mitigated_keys{kind="read"}')
    echo "$((h1 - h0)) $((m1 - m0)) $k" >"$work/$1.cache"
}

for wl in uniform zipf:1.1 zipf:1.3 viral:profile:celebrity:0.3; do
    tag=${wl//[:.]/_}
    run "nut_$tag" "127.0.0.1:$np" "$wl" "$sa"
    run "off_$tag" "127.0.0.1:$op" "$wl" "$oa"
    run "on_$tag" "127.0.0.1:$sp" "$wl" "$sa"
    run "tuned_$tag" "127.0.0.1:$tp" "$wl" "$ta"
done

table=$(python3 - "$work" "$(basename "$tuned_rules")" <<'EOF2'
import json, sys
w, tuned = sys.argv[1], sys.argv[2]
targets = [("nut", "twemproxy"), ("off", "saltshaker, cache off"),
           ("on", "saltshaker, cache on, default rules"), ("tuned", f"saltshaker, cache on, {tuned}")]
print("| workload | target | client ops/s | p99 ms | busiest node share | max/mean over nodes | vs uniform | cache hit rate | read-hot keys |")
print("|---|---|---|---|---|---|---|---|---|")
uniform = 1.0
for wl in ["uniform", "zipf:1.1", "zipf:1.3", "viral:profile:celebrity:0.3"]:
    tag = wl.replace(":", "_").replace(".", "_")
    for t, label in targets:
        r = json.load(open(f"{w}/{t}_{tag}.json"))
        per = [n["commands"] for n in r["per_node"]]
        total = sum(per) or 1
        hits, misses, keys = map(int, open(f"{w}/{t}_{tag}.cache").read().split())
        cached = t in ("on", "tuned")
        rate = f"{hits / (hits + misses):.4f} ({hits} hits)" if cached and hits + misses else "-"
        balance = max(per) / (total / len(per))
        if wl == "uniform" and t == "off":
            uniform = balance
        vs = f"{balance / uniform:.3f}"
        print(f"| {wl} | {label} | {r['ops_per_sec']:.0f} | {r['p99_us']/1000:.2f} | {max(per)/total:.3f} | {balance:.2f} | {vs} | {rate} | {keys if cached else '-'} |")
EOF2
)
echo "$table"

block=$(printf '%s\n\n%s\n\n%s\n' \
    "Measured $(date -u +%Y-%m-%d) on $(nproc) cores with \`bench/read_hot.sh\` (${duration} ms per run after ${warmup} ms of warm-up, 50 clients, pipeline 16, 4 redis-server nodes, GET only over 100k prefilled keys)." \
    "$table" \
    "Backend load per node from each node's INFO commandstats (reset before every run). The hit rate counts reads of keys the detector found read-hot (only those are cached); cold keys always go to their node. \"vs uniform\" is max/mean divided by max/mean under uniform load through saltshaker with the cache off in this run (the goal for a read cache is about 1: the nodes as balanced as under uniform load; node ports are new every run, and ketama places keys by them, so uniform's own figure moves between runs). \"read-hot keys\" is saltshaker_mitigated_keys{kind=\"read\"} at the end of the run. The default rules make a key read-hot from 2000 reads/s (cooling below 500/s), and, with \`balance\`, from a lower rate on a node sent more than 5% over the mean; \`$(basename "$tuned_rules")\` is a second proxy running \`$tuned_rules\`: read-hot from 2 reads/s, cooling below 0.5/s, 8192 keys tracked per thread, 10 s TTL.")
write_readme_block read-hot "Read-hot keys" "$block"
