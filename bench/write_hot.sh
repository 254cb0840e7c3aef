#!/usr/bin/env bash
# Write-hot benchmark: one key takes 30% of all operations as INCR on top of uniform INCR
# traffic, over 4 redis-server nodes, through twemproxy (nutcracker) and through saltshaker
# (default rules: the hot key is detected and its increments combined), plus a uniform
# workload through saltshaker as the balance baseline. For each run it records the share
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

run nutcracker "127.0.0.1:$np" viral:counter:hot:0.3
run saltshaker "127.0.0.1:$sp" viral:counter:hot:0.3
run uniform "127.0.0.1:$sp" uniform

table=$(python3 - "$work" <<'EOF'
import json, sys
w = sys.argv[1]
rows = []
for name, label in [("uniform", "saltshaker, uniform INCR (baseline)"),
                    ("nutcracker", "twemproxy, 30% on one key"),
                    ("saltshaker", "saltshaker, 30% on one key (combine)")]:
    r = json.load(open(f"{w}/{name}.json"))
    per = [n["commands"] for n in r["per_node"]]
    total = sum(per) or 1
    busiest = max(per) / total
    imb = max(per) / (total / len(per))
    ops = r["ops"] or 1
    incrby = int(open(f"{w}/{name}.incrby").read())
    viral = r.get("viral_ops") or 0
    hot = f"{incrby / viral:.4f} ({viral / max(incrby,1):.0f}x fewer)" if name == "saltshaker" and viral else "1 (every INCR)" if name == "nutcracker" else "-"
    rows.append(f"| {label} | {r['ops_per_sec']:.0f} | {busiest:.3f} | {imb:.2f} | {total/ops:.3f} | {hot} |")
print("| run | client ops/s | busiest node share | max/mean over nodes | backend cmds per client op | hot-key backend writes per offered INCR |")
print("|---|---|---|---|---|---|")
print("\n".join(rows))
EOF
)
echo "$table"

readme=bench/README.md
block=$(printf '%s\n\n%s\n\n%s\n' \
    "Measured $(date -u +%Y-%m-%d) on $(nproc) cores with \`bench/write_hot.sh\` (${duration} ms per run, 50 clients, pipeline 16, 4 redis-server nodes, INCR only, 100k uniform keys plus one key taking 30%)." \
    "$table" \
    "Backend load per node comes from each node's INFO commandstats (reset before every run). Combining makes the hot key cost its node about one INCRBY per batch window per proxy instead of one write per increment; it does not spread the key over nodes (that is salting), so the busiest node still carries the uniform share of the hot key's node.")
python3 - "$readme" "$block" <<'EOF'
import sys
path, block = sys.argv[1], sys.argv[2]
text = open(path).read() if __import__("os").path.exists(path) else ""
b, e = "<!-- write-hot:begin -->", "<!-- write-hot:end -->"
new = f"{b}\n{block}\n{e}"
if b in text and e in text:
    text = text[:text.index(b)] + new + text[text.index(e) + len(e):]
else:
    text = text.rstrip() + "\n\n## Write-hot keys\n\n" + new + "\n"
open(path, "w").write(text)
EOF
echo "results written to $readme"
