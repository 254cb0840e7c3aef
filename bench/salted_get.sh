#!/usr/bin/env bash
# What a GET on a salted counter costs next to a plain GET, through one saltshaker over 4
# redis-server nodes (the key salted over 4 shards on 4 nodes, plus its base key; the read
# cache off so every GET reaches the nodes). For pipeline 16 and pipeline 1 (50 clients,
# every GET on the one key), it records client GETs/s, backend commands per GET (the nodes'
# INFO commandstats) and the proxy's CPU per GET (utime + stime from /proc), and prints a
# markdown table. The ratios are within one run.
#
#   bench/salted_get.sh [--duration-ms MS] [--bin PATH]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
duration=5000
custom_bin=
while [ $# -gt 0 ]; do
    case "$1" in
        --duration-ms) duration=$2; shift 2 ;;
        --bin) custom_bin=$2; shift 2 ;;
        *) echo "salted_get: unknown argument $1" >&2; exit 2 ;;
    esac
done
tag=saltedget
# shellcheck source=bench/pool.sh
source "$root/bench/pool.sh"
[ -n "$custom_bin" ] && bin=$custom_bin

rules="$work/rules-salt.yaml"
printf 'version: 1\nepoch_ms: 1000\ndefaults:\n  read: { cache: { enabled: false } }\nrules:\n  - match: "counter:hot"\n    write: { strategy: salt, salt: { shards: 4 } }\n' >"$rules"
start_proxy --rules "$rules" --threads 1
port=$proxy_port
proxy_pid=${pids[${#pids[@]}-1]}
flush
promote_key "$proxy_admin" counter:hot
"$bin" bench --target "127.0.0.1:$port" -c 1 -n 100 --workload viral:counter:hot:1 --mix incr=100 >/dev/null
"$bin" bench --target "127.0.0.1:$port" -c 1 -n 1 --workload viral:plain:hot:1 --mix incr=100 >/dev/null

cpu_ticks() { awk '{print $14 + $15}' "/proc/$proxy_pid/stat"; }
run() { # name key pipeline
    local n
    for n in "${nodes[@]}"; do redis-cli -h "${n%:*}" -p "${n#*:}" config resetstat >/dev/null; done
    local c0 c1
    c0=$(cpu_ticks)
    "$bin" bench --target "127.0.0.1:$port" -c 50 -P "$3" --duration-ms "$duration" \
        --workload "viral:$2:1" --mix get=100 --nodes "$node_list" --json >"$work/$1.json"
    c1=$(cpu_ticks)
    echo $((c1 - c0)) >"$work/$1.cpu"
}
for p in 16 1; do
    run "plain-$p" plain:hot "$p"
    run "salted-$p" counter:hot "$p"
done

python3 - "$work" "$(getconf CLK_TCK)" <<'PY'
import json, sys
w, hz = sys.argv[1], int(sys.argv[2])
print("| pipeline | key | client GETs/s | vs plain | backend cmds per GET | proxy CPU per GET (ns) | vs plain |")
print("|---:|---|---:|---:|---:|---:|---:|")
for p in (16, 1):
    base = None
    for name, label in (("plain", "plain"), ("salted", "salted (base + 4 shards, 4 nodes)")):
        r = json.load(open(f"{w}/{name}-{p}.json"))
        cpu = int(open(f"{w}/{name}-{p}.cpu").read()) / hz * 1e9 / max(r["ops"], 1)
        per = sum(n["commands"] for n in r["per_node"]) / max(r["ops"], 1)
        if base is None:
            base = (r["ops_per_sec"], cpu)
        print(f"| {p} | {label} | {r['ops_per_sec']:.0f} | {r['ops_per_sec'] / base[0]:.2f}x | {per:.2f} | {cpu:.0f} | {cpu / base[1]:.2f}x |")
PY
