#!/usr/bin/env bash
# The exactness tiers' costs, in one run over 4 redis-server nodes and one saltshaker (read
# cache off, so a plain GET reaches its node):
#   - GET of one key, every client on it: a plain key, a salted counter (4 shards on 4
#     nodes) with the exact tier, and the same with the display tier (refresh 2000 ms);
#   - INCRBY against SALTSHAKER.INCRBY (a fresh increment ID each time), on a plain key and
#     on a salted one.
# Each measure runs `rounds` times, the order rotating each round; the table has medians of
# client ops/s, proxy CPU per op (from /proc) and backend commands per op (INFO
# commandstats). Results go between the exactness markers in bench/README.md.
#
#   bench/exactness.sh [--quick]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
duration=5000
rounds=3
[ "${1:-}" = "--quick" ] && { duration=1500; rounds=1; }

tag=exactness
# shellcheck source=bench/pool.sh
source "$root/bench/pool.sh"

rules="$work/rules.yaml"
cat >"$rules" <<'EOF'
version: 1
epoch_ms: 1000
defaults:
  read: { cache: { enabled: false } }
  write: { hot_at_per_sec: 100000000, cool_below_per_sec: 1 }
rules:
  - match: "view:*"
    read: { salted: { tier: display, refresh_ms: 2000 } }
    write: { strategy: salt, salt: { shards: 4 } }
  - match: "pay:*"
    write: { strategy: salt, salt: { shards: 4 } }
EOF
start_proxy --rules "$rules"
port=$proxy_port; admin=$proxy_admin
pid=$(pgrep -f -- "--listen 127.0.0.1:$port" | head -1)

promote() { promote_key "$admin" "$1"; }
cli() { redis-cli -p "$port" "$@" >/dev/null; }
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'; }
backend_cmds() {
    local total=0 n c
    for n in "${nodes[@]}"; do
        c=$(redis-cli -h "${n%:*}" -p "${n#*:}" info stats | sed -nE 's/^total_commands_processed:([0-9]+).*/\1/p')
        total=$((total + c))
    done
    echo "$total"
}

flush
promote view:home
promote pay:home
promote pay:idem
for k in plain:home view:home pay:home; do
    for _ in $(seq 1 40); do cli INCR "$k"; done
done

# name kind: a GET run (bench) or an increment run (redis-benchmark, custom command)
measure() { # name round
    local name=$1 before_cpu before_cmds ops
    before_cpu=$(cpu_ns "$pid"); before_cmds=$(backend_cmds)
    case $name in
    get-*)
        local key=${name#get-}; key=${key/-/:}
        "$bin" bench --target "127.0.0.1:$port" -c 50 -P 16 --duration-ms "$duration" \
            --workload "viral:$key:1" --mix get=100 --json >"$work/$name.json"
        ops=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ops'])" "$work/$name.json")
        ops_s=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ops_per_sec'])" "$work/$name.json")
        ;;
    *)
        local n=$((duration * 40)) cmd
        case $name in
        incrby-plain) cmd=(INCRBY plain:ctr 1) ;;
        once-plain) cmd=(SALTSHAKER.INCRBY plain:once 1 "id:$2:__rand_int__") ;;
        incrby-salted) cmd=(INCRBY pay:home 1) ;;
        once-salted) cmd=(SALTSHAKER.INCRBY pay:idem 1 "id:$2:__rand_int__") ;;
        esac
        local t0 t1
        t0=$(date +%s%N)
        redis-benchmark -p "$port" -c 50 -P 16 -n "$n" -r 1000000000 -q "${cmd[@]}" >"$work/$name.out"
        t1=$(date +%s%N)
        ops=$n
        ops_s=$(python3 -c "print($n / (($t1 - $t0) / 1e9))")
        ;;
    esac
    local cpu=$(( $(cpu_ns "$pid") - before_cpu )) cmds=$(( $(backend_cmds) - before_cmds ))
    echo -e "$name\t$2\t$ops_s\t$((cpu / ops))\t$(python3 -c "print($cmds / $ops)")" >>"$work/results.tsv"
}

names=(get-plain-home get-pay-home get-view-home incrby-plain once-plain incrby-salted once-salted)
for r in $(seq 1 "$rounds"); do
    k=${#names[@]}
    for i in $(seq 0 $((k - 1))); do
        measure "${names[$(((i + r) % k))]}" "$r"
    done
done

table=$(python3 - "$work/results.tsv" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, rnd, ops, cpu, cmds = line.split("\t")
    rows.setdefault(name, []).append((float(ops), float(cpu), float(cmds)))
med = {n: tuple(statistics.median(x[i] for x in v) for i in range(3)) for n, v in rows.items()}
label = {
    "get-plain-home": ("GET, plain key", "get-plain-home"),
    "get-pay-home": ("GET, salted counter, exact tier", "get-plain-home"),
    "get-view-home": ("GET, salted counter, display tier (refresh 2000 ms)", "get-plain-home"),
    "incrby-plain": ("INCRBY, plain key", "incrby-plain"),
    "once-plain": ("SALTSHAKER.INCRBY, plain key (a new ID each)", "incrby-plain"),
    "incrby-salted": ("INCRBY, salted counter (4 shards)", "incrby-plain"),
    "once-salted": ("SALTSHAKER.INCRBY, salted counter (a new ID each)", "incrby-plain"),
}
print("| run | client ops/s | vs its baseline | proxy CPU per op (ns) | backend cmds per op |")
print("|---|---|---|---|---|")
for n, (l, base) in label.items():
    if n not in med:
        continue
    o, c, b = med[n]
    print(f"| {l} | {o:.0f} | {o / med[base][0]:.2f}x | {c:.0f} | {b:.2f} |")
EOF
)
echo "$table"
block=$(printf '%s\n\n%s\n\n%s\n' \
    "Measured $(date -u +%Y-%m-%d) on $(nproc) cores with \`bench/exactness.sh\` (${duration} ms per GET run, $((duration * 40)) increments per increment run, 50 clients, pipeline 16, 4 redis-server nodes, read cache off, medians of ${rounds} rounds in rotating order). GETs by \`saltshaker bench\`, every client on one key; increments by \`redis-benchmark\` with \`-r\`, so each SALTSHAKER.INCRBY carries a new ID." \
    "$table" \
    "A GET of a salted counter with the exact tier reads the base key and every shard (5 backend commands); the display tier serves it from a rollup that one merge per 2000 ms refreshes. An idempotent increment is one script on one node (check the ID, increment, record the ID and its expiry) and, for a window after the key's promotion, one HGET of the base key's IDs first (the salted rows here are within that window).")
write_readme_block exactness "Exactness tiers" "$block"
