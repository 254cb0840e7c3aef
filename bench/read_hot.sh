#!/usr/bin/env bash
# Read-hot benchmark: GET-only workloads over 4 redis-server nodes (Zipf 1.1, Zipf 1.3, one
# key taking 30% of GETs, and uniform as the balance baseline), through twemproxy
# (nutcracker), through saltshaker with the read-hot cache off, with it on under the default
# rules (a key is read-hot from 2000 reads/s), and with it on under tuned rules (read-hot
# from READ_HOT_AT reads/s), all in one run. For each: client throughput and p99, the
# busiest node's share of backend commands and max/mean over nodes, and, with the cache on,
# the hit rate of cached reads. Results go between the read-hot markers in bench/README.md.
#
#   bench/read_hot.sh [--quick]
#
# The tuned proxy's rules (defaults shown): READ_HOT_AT=200 READ_COOL_BELOW=50 READ_TOP_K=512
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
duration=8000
[ "${1:-}" = "--quick" ] && duration=3000
tuned_hot=${READ_HOT_AT:-200}
tuned_cool=${READ_COOL_BELOW:-50}
tuned_top_k=${READ_TOP_K:-512}

tag=readhot
# shellcheck source=bench/pool.sh
source "$root/bench/pool.sh"
printf 'backend:\n  nodes: ["127.0.0.1:1"]\ncache:\n  enabled: false\n' >"$work/nocache.yaml"
start_proxy --config "$work/nocache.yaml"
op=$proxy_port; oa=$proxy_admin

# Tuned rules: a lower read threshold, so the Zipf tail's warm keys are cached too, and
# room in the detector for the keys above it.
printf 'version: 1\ndetection:\n  top_k: %s\ndefaults:\n  read:\n    hot_at_per_sec: %s\n    cool_below_per_sec: %s\n' \
    "$tuned_top_k" "$tuned_hot" "$tuned_cool" >"$work/tuned.yaml"
"$bin" check "$work/tuned.yaml" >/dev/null
start_proxy --rules "$work/tuned.yaml"
tp=$proxy_port; ta=$proxy_admin

metric() { # admin-port name
    curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m { s += $2 } END { printf "%d\n", s }'
}

run() { # name target workload admin-port: prefill every key, then GETs only
    flush
    "$bin" bench --target "$2" -c 20 -P 16 -n 100000 --duration-ms 0 --keyspace 100000 --workload uniform --mix set=100 >/dev/null
    "$bin" bench --target "$2" -c 2 -P 1 -n 10 --duration-ms 0 --workload "$3" --mix set=100 >/dev/null
    h0=$(metric "$4" saltshaker_cache_hits_total); m0=$(metric "$4" saltshaker_cache_misses_total)
    for n in "${nodes[@]}"; do redis-cli -h "${n%:*}" -p "${n#*:}" config resetstat >/dev/null; done
    "$bin" bench --target "$2" -c 50 -P 16 --duration-ms "$duration" --keyspace 100000 \
        --workload "$3" --mix get=100 --nodes "$node_list" --json >"$work/$1.json"
    h1=$(metric "$4" saltshaker_cache_hits_total); m1=$(metric "$4" saltshaker_cache_misses_total)
    echo "$((h1 - h0)) $((m1 - m0))" >"$work/$1.cache"
}

for wl in uniform zipf:1.1 zipf:1.3 viral:profile:celebrity:0.3; do
    tag=${wl//[:.]/_}
    run "nut_$tag" "127.0.0.1:$np" "$wl" "$sa"
    run "off_$tag" "127.0.0.1:$op" "$wl" "$oa"
    run "on_$tag" "127.0.0.1:$sp" "$wl" "$sa"
    run "tuned_$tag" "127.0.0.1:$tp" "$wl" "$ta"
done

table=$(python3 - "$work" "$tuned_hot" <<'EOF2'
import json, sys
w, tuned = sys.argv[1], sys.argv[2]
targets = [("nut", "twemproxy"), ("off", "saltshaker, cache off"),
           ("on", "saltshaker, cache on"), ("tuned", f"saltshaker, cache on, read-hot from {tuned}/s")]
print("| workload | target | client ops/s | p99 ms | busiest node share | max/mean over nodes | cache hit rate |")
print("|---|---|---|---|---|---|---|")
for wl in ["uniform", "zipf:1.1", "zipf:1.3", "viral:profile:celebrity:0.3"]:
    tag = wl.replace(":", "_").replace(".", "_")
    for t, label in targets:
        r = json.load(open(f"{w}/{t}_{tag}.json"))
        per = [n["commands"] for n in r["per_node"]]
        total = sum(per) or 1
        hits, misses = map(int, open(f"{w}/{t}_{tag}.cache").read().split())
        cached = t in ("on", "tuned")
        rate = f"{hits / (hits + misses):.4f} ({hits} hits)" if cached and hits + misses else "-"
        print(f"| {wl} | {label} | {r['ops_per_sec']:.0f} | {r['p99_us']/1000:.2f} | {max(per)/total:.3f} | {max(per)/(total/len(per)):.2f} | {rate} |")
EOF2
)
echo "$table"

block=$(printf '%s\n\n%s\n\n%s\n' \
    "Measured $(date -u +%Y-%m-%d) on $(nproc) cores with \`bench/read_hot.sh\` (${duration} ms per run, 50 clients, pipeline 16, 4 redis-server nodes, GET only over 100k prefilled keys)." \
    "$table" \
    "Backend load per node from each node's INFO commandstats (reset before every run). The hit rate counts reads of keys the detector found read-hot (only those are cached); cold keys always go to their node. \"cache on\" runs the default rules (read-hot from 2000 reads/s, cooling below 500/s); \"read-hot from ${tuned_hot}/s\" is a second proxy whose rules set \`defaults.read.hot_at_per_sec: ${tuned_hot}\`, \`cool_below_per_sec: ${tuned_cool}\` and \`detection.top_k: ${tuned_top_k}\`.")
write_readme_block read-hot "Read-hot keys" "$block"
