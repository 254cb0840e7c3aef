#!/usr/bin/env bash
# Proxy overhead benchmark: one redis-server, nutcracker and saltshaker in front of it,
# redis-benchmark (GET, SET, INCR; pipeline 1 and 16) straight at Redis and through each
# proxy, in rounds that alternate the targets; writes the median table into
# bench/README.md. See bench/README.md for what it measures and how to read it.
#
# usage: bench/proxy_bench.sh [--quick] [-n REQUESTS] [--rounds R] [--threads T]
#                             [--targets direct,nutcracker,saltshaker] [--bin PATH]
#                             [--no-build] [--no-readme]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
requests=200000
rounds=3
threads=1
targets="direct,nutcracker,saltshaker"
bin="${CARGO_TARGET_DIR:-$root/target}/release/saltshaker"
build=1
write_readme=1
quick=0
argv_text="bench/proxy_bench.sh${*:+ $*}"

while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1; requests=20000; rounds=1; write_readme=0; shift ;;
        -n) requests=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --targets) targets=$2; shift 2 ;;
        --bin) bin=$2; build=0; shift 2 ;;
        --no-build) build=0; shift ;;
        --no-readme) write_readme=0; shift ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "proxy_bench: unknown argument $1" >&2; exit 2 ;;
    esac
done
IFS=, read -ra target_list <<<"$targets"

for tool in redis-server redis-cli redis-benchmark python3; do
    command -v "$tool" >/dev/null || { echo "proxy_bench: $tool not found" >&2; exit 1; }
done
case ",$targets," in *,nutcracker,*)
    command -v nutcracker >/dev/null || { echo "proxy_bench: nutcracker not found" >&2; exit 1; }
esac

workdir=$(mktemp -d "${TMPDIR:-/tmp}/proxy-bench.XXXXXX")
pids=()
cleanup() {
    local pid i alive
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    # A process that ignores SIGTERM (a stuck proxy) must not hang the script.
    for i in $(seq 1 40); do
        alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" -eq 0 ] && break
        sleep 0.05
    done
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until PORT answers PING (through a proxy too), failing if PID died.
wait_for_port() {
    local port=$1 pid=$2 what=$3 i
    for i in $(seq 1 200); do
        kill -0 "$pid" 2>/dev/null || { echo "proxy_bench: $what exited; log:" >&2;
            cat "$workdir/$what.log" >&2 || true; exit 1; }
        if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = "PONG" ]; then
            return 0
        fi
        sleep 0.05
    done
    echo "proxy_bench: $what did not answer PING on 127.0.0.1:$port" >&2
    exit 1
}

has_target() { case ",$targets," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

if has_target saltshaker && [ "$build" -eq 1 ]; then
    echo "proxy_bench: cargo build --release --bin saltshaker"
    (cd "$root" && cargo build --release --bin saltshaker)
fi
if has_target saltshaker && [ ! -x "$bin" ]; then
    echo "proxy_bench: $bin not found" >&2
    exit 1
fi

# The servers.
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$workdir" >"$workdir/redis.log" 2>&1 &
pids+=($!)
wait_for_port "$redis_port" $! redis
declare -A port_of=([direct]=$redis_port)

if has_target nutcracker; then
    port_of[nutcracker]=$(free_port)
    cat >"$workdir/nutcracker.yml" <<EOF
bench:
  listen: 127.0.0.1:${port_of[nutcracker]}
  hash: fnv1a_64
  distribution: ketama
  redis: true
  servers:
    - 127.0.0.1:$redis_port:1
EOF
    nutcracker -c "$workdir/nutcracker.yml" -s "$(free_port)" -a 127.0.0.1 \
        -o "$workdir/nutcracker.log" &
    pids+=($!)
    wait_for_port "${port_of[nutcracker]}" $! nutcracker
fi

if has_target saltshaker; then
    port_of[saltshaker]=$(free_port)
    "$bin" --listen "127.0.0.1:${port_of[saltshaker]}" --nodes "127.0.0.1:$redis_port:1" \
        --admin "127.0.0.1:$(free_port)" --threads "$threads" --log-level warn \
        >"$workdir/saltshaker.log" 2>&1 &
    pids+=($!)
    wait_for_port "${port_of[saltshaker]}" $! saltshaker
fi

commands_processed() {
    redis-cli -h 127.0.0.1 -p "$redis_port" info stats |
        sed -nE 's/^total_commands_processed:([0-9]+).*/\1/p'
}

rows="$workdir/rows.tsv"
printf 'round\ttarget\tpipeline\ttest\trps\tp50_ms\tp99_ms\n' >"$rows"
bench_cmd="redis-benchmark -h 127.0.0.1 -p PORT -t get,set,incr -r 100000 -c 50 -n $requests -P {1,16} --csv"
echo "proxy_bench: $rounds round(s) of: $bench_cmd"
echo "proxy_bench: targets ${target_list[*]} (redis on $redis_port)"
started=$(date +%s)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

for round in $(seq 1 "$rounds"); do
    # Rotate the target order each round so slow drift on a shared machine does not
    # always fall on the same target.
    n=${#target_list[@]}
    order=()
    for i in $(seq 0 $((n - 1))); do order+=("${target_list[$(((i + round - 1) % n))]}"); done
    for pipeline in 1 16; do
        for target in "${order[@]}"; do
            before=$(commands_processed)
            redis-benchmark -h 127.0.0.1 -p "${port_of[$target]}" -t get,set,incr \
                -r 100000 -c 50 -n "$requests" -P "$pipeline" --csv \
                >"$workdir/out.csv" 2>"$workdir/err.log" || {
                echo "proxy_bench: redis-benchmark against $target failed:" >&2
                cat "$workdir/err.log" >&2; exit 1; }
            after=$(commands_processed)
            # A proxy that answered errors instead of forwarding would look fast: make
            # sure the backend really served every request.
            if [ $((after - before)) -lt $((3 * requests)) ]; then
                echo "proxy_bench: $target: backend saw $((after - before)) commands," \
                    "expected >= $((3 * requests))" >&2
                exit 1
            fi
            # "SET","rps","avg","min","p50","p95","p99","max"
            tr -d '"' <"$workdir/out.csv" | awk -F, -v r="$round" -v t="$target" \
                -v p="$pipeline" 'NR > 1 && NF >= 7 { printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
                r, t, p, $1, $2, $5, $7 }' >>"$rows"
            printf 'round %s  P%-2s %-10s %s\n' "$round" "$pipeline" "$target" \
                "$(tr -d '"' <"$workdir/out.csv" | awk -F, 'NR > 1 { printf "%s %.0f/s  ", $1, $2 }')"
        done
    done
done
elapsed=$(($(date +%s) - started))

meta=(
    "Recorded $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')),"
    "load average $load_before at the start, $rounds round(s), ${elapsed}s of load."
    ""
    "Command: \`$argv_text\`, which runs for each target and pipeline:"
    "\`$bench_cmd\`"
    "(saltshaker with \`--threads $threads\`; nutcracker is single-threaded; $(redis-server --version | awk '{print $3}' | sed 's/v=/redis /'), $(nutcracker --version 2>&1 | sed -n 's/^This is //p'))."
    "Each cell is the median over rounds."
)
# Other work on the machine skews one target more than another: say so next to the table.
if awk -v l="${load_before%% *}" -v n="$(nproc)" 'BEGIN { exit !(l > n) }'; then
    meta+=("**The machine was busy (load above its core count): the ratios are rough.**")
fi
if [ "$write_readme" -eq 1 ]; then
    python3 "$here/bench_report.py" "$rows" --readme "$here/README.md" "${meta[@]/#/--meta=}"
    echo "proxy_bench: table written to bench/README.md"
else
    python3 "$here/bench_report.py" "$rows" "${meta[@]/#/--meta=}"
    if [ "$quick" -eq 1 ]; then
        echo "proxy_bench: --quick run, bench/README.md left unchanged"
    fi
fi
