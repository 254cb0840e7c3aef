#!/usr/bin/env bash
# What admission costs the proxy on commands it admits: one redis-server and three saltshaker
# processes in front of it: `off` has no admit rule; `other` has one for keys the benchmark
# never uses (`api:*`), so every command pays the lookup and nothing more; `all` limits every
# key (`match: "*"`, a limit no key reaches, so every command goes through the bucket table
# and is admitted). redis-benchmark INCR and GET over 100k keys, pipeline 16, the sides in
# rotating order each round. Reports proxy CPU per request (from /proc) and requests/s per
# side, and the ratios to `off`.
#
# usage: bench/admission.sh [-n REQUESTS] [--rounds R] [--no-build]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
requests=500000
rounds=4
build=1
bin="${CARGO_TARGET_DIR:-$root/target}/release/saltshaker"
while [ $# -gt 0 ]; do
    case "$1" in
        -n) requests=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "admission: unknown argument $1" >&2; exit 2 ;;
    esac
done
for tool in redis-server redis-cli redis-benchmark python3; do
    command -v "$tool" >/dev/null || { echo "admission: $tool not found" >&2; exit 1; }
done
[ "$build" = 1 ] && (cd "$root" && cargo build --release -q)

workdir=$(mktemp -d "${TMPDIR:-/tmp}/admission-bench.XXXXXX")
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$workdir"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_ping() {
    for _ in $(seq 1 200); do
        [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ] && return 0
        sleep 0.05
    done
    echo "admission: nothing answers on port $1" >&2; exit 1
}

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
pids+=($!)
wait_ping "$rport"

printf 'version: 1\n' > "$workdir/off.yaml"
printf 'version: 1\nrules:\n  - match: "api:*"\n    admit: { limit_per_sec: 1000 }\n' > "$workdir/other.yaml"
printf 'version: 1\nrules:\n  - match: "*"\n    admit: { limit_per_sec: 1000000000 }\n' > "$workdir/all.yaml"
sides=(off other all)
declare -A port pid
for side in "${sides[@]}"; do
    port[$side]=$(free_port)
    "$bin" --listen "127.0.0.1:${port[$side]}" --admin "127.0.0.1:$(free_port)" \
        --nodes "127.0.0.1:$rport" --rules "$workdir/$side.yaml" >"$workdir/$side.log" 2>&1 &
    pid[$side]=$!
    pids+=(${pid[$side]})
    wait_ping "${port[$side]}"
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
declare -A cpu reqs rps_sum
for side in "${sides[@]}"; do cpu[$side]=0; reqs[$side]=0; for t in incr get; do rps_sum[$t.$side]=0; done; done
for ((r = 0; r < rounds; r++)); do
    order=("${sides[@]:r%3}" "${sides[@]:0:r%3}")
    for side in "${order[@]}"; do
        for t in incr get; do
            before=$(cpu_ticks "${pid[$side]}")
            out=$(redis-benchmark -p "${port[$side]}" -t "$t" -n "$requests" -r 100000 -c 50 -P 16 -q 2>/dev/null | tr '\r' '\n' | grep -i "requests per second" | tail -1)
            after=$(cpu_ticks "${pid[$side]}")
            rps=$(echo "$out" | awk '{print $2}')
            cpu[$side]=$((cpu[$side] + after - before))
            reqs[$side]=$((reqs[$side] + requests))
            rps_sum[$t.$side]=$(python3 -c "print(${rps_sum[$t.$side]} + $rps)")
        done
    done
done
args=("$hz" "$rounds")
for side in "${sides[@]}"; do
    args+=("$side" "${cpu[$side]}" "${reqs[$side]}" "${rps_sum[incr.$side]}" "${rps_sum[get.$side]}")
done
python3 - "${args[@]}" <<'PY'
import sys
hz, rounds = float(sys.argv[1]), float(sys.argv[2])
rest = sys.argv[3:]
rows = {}
for i in range(0, len(rest), 5):
    name, c, r, inc, get = rest[i], *map(float, rest[i + 1:i + 5])
    rows[name] = (c / hz / r * 1e6, inc / rounds, get / rounds)
base = rows["off"]
print("| proxy | CPU per request | vs off | INCR P16 req/s | vs off | GET P16 req/s | vs off |")
print("|---|---|---|---|---|---|---|")
for name, (us, inc, get) in rows.items():
    print(f"| {name} | {us:.3f} us | {(us / base[0] - 1) * 100:+.1f}% | {inc:.0f} | {inc / base[1]:.3f}x | {get:.0f} | {get / base[2]:.3f}x |")
PY
