#!/usr/bin/env bash
# Write-hot benchmark: one key takes 30% of all operations as INCR on top of uniform INCR
# traffic, over 4 redis-server nodes, through twemproxy (nutcracker) and through saltshaker
# (default rules: the hot key is detected and its increments combined), through two more
# saltshakers that salt the key over 4 shards (salt, and salt+combine), plus a uniform
# workload through saltshaker as the balance baseline; then the cost of a salted GET. For each run it records the share
# of backend commands the busiest node served, max/mean over nodes, backend commands per
# client operation, and, through saltshaker, backend writes on the hot key per offered
# increment. Results go between the write-hot markers in bench/README.md.
#
#   bench/write_hot.sh [--quick]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
duration=15000
[ "${1:-}" = "--quick" ] && duration=3000

tag=writehot
# shellcheck source=bench/pool.sh
source "$root/bench/pool.sh"
hot_writes() { # INCRBY calls on every node: only combined batches use INCRBY here
    local total=0
    for n in "${nodes[@]}"; do
        c=$(redis-cli -h "${n%:*}" -p "${n#*:}" info commandstats | sed -n 's/^cmdstat_incrby:calls=\([0-9]*\),.*/\1/p')
        total=$((total + ${c:-0}))
    done
    echo "$total"
}

run() { # name target workload
    flush
    "$bin" bench --target "$2" -c 50 -P 16 --duration-ms "$duration" --keyspace 100000 \
        --workload "$3" --mix incr=100 --nodes "$node_list" --json >"$work/$1.json"
    echo "$(hot_writes)" >"$work/$1.incrby"
}

# Two more saltshakers over the same nodes for the salted runs: one salts the hot key
# (strategy salt), one salts and combines per shard (salt+combine). The promotion is an
# admin request after each flush (FLUSHALL also empties the registry), and the run starts
# once it is in force. The read cache is off so a plain GET of a hot key reaches its node.
start_salted() { # strategy -> proxy_port, proxy_admin
    local rules="$work/rules-$1.yaml"
    printf 'version: 1\nepoch_ms: 1000\ndefaults:\n  read: { cache: { enabled: false } }\nrules:\n  - match: "counter:hot"\n    write: { strategy: %s, salt: { shards: 4 } }\n' "$1" >"$rules"
    start_proxy --rules "$rules"
}
start_salted salt; salt_p=$proxy_port; salt_a=$proxy_admin
start_salted salt+combine; sc_p=$proxy_port; sc_a=$proxy_admin
promote() { # admin port: salt counter:hot over 4 shards, wait until in force
    python3 - "$1" <<'PY'
import json, sys, time, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
urllib.request.urlopen(urllib.request.Request(f"{base}/hotkeys/promote?key=counter%3Ahot&shards=4", method="POST")).read()
for _ in range(200):
    s = json.load(urllib.request.urlopen(f"{base}/hotkeys"))["salted"]
    if s and s[0]["from_ms"] + 100 < time.time() * 1000:
        sys.exit(0)
    time.sleep(0.05)
sys.exit("promotion never took effect")
PY
}
run_salted() { # name port admin
    flush
    promote "$3"
    for n in "${nodes[@]}"; do redis-cli -h "${n%:*}" -p "${n#*:}" config resetstat >/dev/null; done
    "$bin" bench --target "127.0.0.1:$2" -c 50 -P 16 --duration-ms "$duration" --keyspace 100000 \
        --workload viral:counter:hot:0.3 --mix incr=100 --nodes "$node_list" --json >"$work/$1.json"
    echo "$(hot_writes)" >"$work/$1.incrby"
}

run nutcracker "127.0.0.1:$np" viral:counter:hot:0.3
run saltshaker "127.0.0.1:$sp" viral:counter:hot:0.3
run uniform "127.0.0.1:$sp" uniform
run_salted salted "$salt_p" "$salt_a"
run_salted saltcombine "$sc_p" "$sc_a"

# The read cost of a salted GET next to a plain GET, through the same proxy: the salted
# key (4 shards on 4 nodes, plus its base key) and a plain key, each taking every GET.
"$bin" bench --target "127.0.0.1:$salt_p" -c 1 -n 1 --workload viral:plain:hot:1 --mix incr=100 >/dev/null
"$bin" bench --target "127.0.0.1:$salt_p" -c 50 -P 16 --duration-ms $((duration / 3)) \
    --workload viral:plain:hot:1 --mix get=100 --nodes "$node_list" --json >"$work/get-plain.json"
"$bin" bench --target "127.0.0.1:$salt_p" -c 50 -P 16 --duration-ms $((duration / 3)) \
    --workload viral:counter:hot:1 --mix get=100 --nodes "$node_list" --json >"$work/get-salted.json"

table=$(python3 - "$work" <<'EOF'
import json, sys
w = sys.argv[1]
rows = []
for name, label in [("uniform", "saltshaker, uniform INCR (baseline)"),
                    ("nutcracker", "twemproxy, 30% on one key"),
                    ("saltshaker", "saltshaker, 30% on one key (combine)"),
                    ("salted", "saltshaker, 30% on one key (salt, 4 shards)"),
                    ("saltcombine", "saltshaker, 30% on one key (salt+combine, 4 shards)")]:
    r = json.load(open(f"{w}/{name}.json"))
    per = [n["commands"] for n in r["per_node"]]
    total = sum(per) or 1
    busiest = max(per) / total
    imb = max(per) / (total / len(per))
    ops = r["ops"] or 1
    incrby = int(open(f"{w}/{name}.incrby").read())
    viral = r.get("viral_ops") or 0
    combined = name in ("saltshaker", "saltcombine")
    hot = f"{incrby / viral:.4f} ({viral / max(incrby,1):.0f}x fewer)" if combined and viral else "1 (every INCR)" if name in ("nutcracker", "salted") else "-"
    rows.append(f"| {label} | {r['ops_per_sec']:.0f} | {busiest:.3f} | {imb:.2f} | {total/ops:.3f} | {hot} |")
print("| run | client ops/s | busiest node share | max/mean over nodes | backend cmds per client op | hot-key backend writes per offered INCR |")
print("|---|---|---|---|---|---|")
print("\n".join(rows))
print()
print("| GET through saltshaker (salt proxy, cache off) | client ops/s | p50 us | p99 us | backend cmds per GET |")
print("|---|---|---|---|---|")
for name, label in [("get-plain", "plain key"), ("get-salted", "salted key (base + 4 shards, 4 nodes)")]:
    r = json.load(open(f"{w}/{name}.json"))
    per = sum(n["commands"] for n in r["per_node"])
    print(f"| {label} | {r['ops_per_sec']:.0f} | {r['p50_us']} | {r['p99_us']} | {per / max(r['ops'], 1):.2f} |")
EOF
)
echo "$table"

block=$(printf '%s\n\n%s\n\n%s\n' \
    "Measured $(date -u +%Y-%m-%d) on $(nproc) cores with \`bench/write_hot.sh\` (${duration} ms per run, 50 clients, pipeline 16, 4 redis-server nodes, INCR only, 100k uniform keys plus one key taking 30%)." \
    "$table" \
    "Backend load per node comes from each node's INFO commandstats (reset before every run). Combining makes the hot key cost its node about one INCRBY per batch window per proxy instead of one write per increment; it does not spread the key over nodes. Salting spreads the key's writes over 4 shard keys, one per node (promoted by an admin request before the run; the salted proxies run with epoch_ms 1000). Salted INCR replies are estimates; combine keeps them exact. A salted GET reads the base key and every shard, one pipelined round per node.")
write_readme_block write-hot "Write-hot keys" "$block"
