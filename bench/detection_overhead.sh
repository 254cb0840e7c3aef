#!/usr/bin/env bash
# What hot-key detection costs the proxy: one redis-server, two saltshaker processes in
# front of it that differ only in `detection.enabled` (true, false), and redis-benchmark
# GET/SET with pipeline 16 against them in alternation (on, off, off, on, on, off, ...), so
# drift on a shared machine falls on both sides. Prints mean, min and max requests/s per
# side and test and the on/off ratio, and writes them into bench/README.md between the
# detection markers. Goal: detection on loses at most 3% of throughput.
#
# usage: bench/detection_overhead.sh [-n REQUESTS] [--rounds R] [--threads T] [--bin PATH]
#                                    [--no-build] [--no-readme]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
requests=1000000
rounds=6
threads=1
bin="${CARGO_TARGET_DIR:-$root/target}/release/saltshaker"
build=1
write_readme=1
argv=("$@")

while [ $# -gt 0 ]; do
    case "$1" in
        -n) requests=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --bin) bin=$2; build=0; shift 2 ;;
        --no-build) build=0; shift ;;
        --no-readme) write_readme=0; shift ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "detection_overhead: unknown argument $1" >&2; exit 2 ;;
    esac
done

# The command as recorded in the README: a --bin path names this machine, not the method.
argv_text="bench/detection_overhead.sh"
for ((i = 0; i < ${#argv[@]}; i++)); do
    if [ "${argv[$i]}" = --bin ]; then
        argv_text+=" --bin <release build>"
        i=$((i + 1))
    else
        argv_text+=" ${argv[$i]}"
    fi
done

for tool in redis-server redis-cli redis-benchmark python3 curl; do
    command -v "$tool" >/dev/null || { echo "detection_overhead: $tool not found" >&2; exit 1; }
done

workdir=$(mktemp -d "${TMPDIR:-/tmp}/detection-overhead.XXXXXX")
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    sleep 0.2
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until PORT answers PING, failing if PID died.
wait_for_port() {
    local port=$1 pid=$2 what=$3 i
    for i in $(seq 1 200); do
        kill -0 "$pid" 2>/dev/null || { echo "detection_overhead: $what exited; log:" >&2;
            cat "$workdir/$what.log" >&2 || true; exit 1; }
        if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = "PONG" ]; then
            return 0
        fi
        sleep 0.05
    done
    echo "detection_overhead: $what did not answer PING on 127.0.0.1:$port" >&2
    exit 1
}

if [ "$build" -eq 1 ]; then
    echo "detection_overhead: cargo build --release --bin saltshaker"
    (cd "$root" && cargo build --release --bin saltshaker)
fi
[ -x "$bin" ] || { echo "detection_overhead: $bin not found" >&2; exit 1; }

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$workdir" >"$workdir/redis.log" 2>&1 &
pids+=($!)
wait_for_port "$redis_port" $! redis

# Identical proxies but for the switch; both stay up, only one is driven at a time.
declare -A port_of admin_of pid_of
for side in on off; do
    enabled=true
    [ "$side" = off ] && enabled=false
    printf 'version: 1\ndetection:\n  enabled: %s\n' "$enabled" >"$workdir/rules-$side.yaml"
    port_of[$side]=$(free_port)
    admin_of[$side]=$(free_port)
    "$bin" --listen "127.0.0.1:${port_of[$side]}" --nodes "127.0.0.1:$redis_port:1" \
        --admin "127.0.0.1:${admin_of[$side]}" --threads "$threads" \
        --rules "$workdir/rules-$side.yaml" --log-level warn >"$workdir/$side.log" 2>&1 &
    pids+=($!)
    pid_of[$side]=$!
    wait_for_port "${port_of[$side]}" $! "$side"
done

# The switch must really differ: a burst on one key is hot on one proxy only. Without
# -r, redis-benchmark's INCR always hits the same key.
listed() { curl -s "127.0.0.1:${admin_of[$1]}/hotkeys" | grep -c '"state"' || true; }
declare -A seen
for side in on off; do
    redis-benchmark -h 127.0.0.1 -p "${port_of[$side]}" -t incr -n 100000 -c 10 -P 16 -q \
        >/dev/null 2>&1
    seen[$side]=$(listed "$side")
done
if [ "${seen[on]}" -lt 1 ] || [ "${seen[off]}" -ne 0 ]; then
    echo "detection_overhead: the detection switch did not take:" \
        "on lists ${seen[on]}, off lists ${seen[off]}" >&2
    exit 1
fi
# Let the burst cool off before measuring.
sleep 4

# CPU time a process has run, in ns, over all its threads (the detector's aggregator too).
# Throughput swings with whatever else the machine runs; CPU per request much less.
cpu_ns() {
    cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'
}

commands_processed() {
    redis-cli -h 127.0.0.1 -p "$redis_port" info stats |
        sed -nE 's/^total_commands_processed:([0-9]+).*/\1/p'
}

rows="$workdir/rows.tsv"
bench_cmd="redis-benchmark -h 127.0.0.1 -p PORT -t get,set -r 100000 -c 50 -P 16 -n $requests --csv"
echo "detection_overhead: $rounds round(s) of on/off, alternating: $bench_cmd"
started=$(date +%s)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

for round in $(seq 1 "$rounds"); do
    # on,off then off,on: each side goes first and second equally often.
    if [ $((round % 2)) -eq 1 ]; then order="on off"; else order="off on"; fi
    for side in $order; do
        before=$(commands_processed)
        cpu_before=$(cpu_ns "${pid_of[$side]}")
        redis-benchmark -h 127.0.0.1 -p "${port_of[$side]}" -t get,set -r 100000 -c 50 \
            -P 16 -n "$requests" --csv >"$workdir/out.csv" 2>"$workdir/err.log" || {
            echo "detection_overhead: redis-benchmark against $side failed:" >&2
            cat "$workdir/err.log" >&2; exit 1; }
        cpu_after=$(cpu_ns "${pid_of[$side]}")
        after=$(commands_processed)
        printf '%s\t%s\t%s\n' "$round" "$side" \
            "$(((cpu_after - cpu_before) / (2 * requests)))" >>"$workdir/cpu.tsv"
        # A proxy answering errors would look fast: the backend must have served them all.
        if [ $((after - before)) -lt $((2 * requests)) ]; then
            echo "detection_overhead: $side: backend saw $((after - before)) commands," \
                "expected >= $((2 * requests))" >&2
            exit 1
        fi
        tr -d '"' <"$workdir/out.csv" | awk -F, -v r="$round" -v s="$side" \
            'NR > 1 && NF >= 2 { printf "%s\t%s\t%s\t%s\n", r, s, $1, $2 }' >>"$rows"
        printf 'round %s  %-3s  %s\n' "$round" "$side" \
            "$(tr -d '"' <"$workdir/out.csv" | awk -F, 'NR > 1 { printf "%s %.0f/s  ", $1, $2 }')"
    done
done
elapsed=$(($(date +%s) - started))
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$rows" "$here/README.md" "$write_readme" "$workdir/cpu.tsv" <<EOF
import statistics, sys

rows_path, readme, write, cpu_path = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
runs = {}
by_round = {}
for line in open(rows_path):
    rnd, side, test, rps = line.split("\t")
    runs.setdefault((test, side), []).append(float(rps))
    by_round.setdefault((test, rnd), {})[side] = float(rps)

def fmt(x):
    return f"{x:,.0f}"

lines = [
    "| test | on: mean rps | on: min..max | off: mean rps | off: min..max | on/off of means"
    " | on/off per round: median (min..max) | lost (median) |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
]
lost_all = []
spread = []
for test in ["SET", "GET"]:
    on, off = runs.get((test, "on"), []), runs.get((test, "off"), [])
    if not on or not off:
        continue
    m_on, m_off = statistics.mean(on), statistics.mean(off)
    # The two runs of a round are back to back: their ratio cancels most of the drift.
    pairs = [r["on"] / r["off"] for (t, _), r in by_round.items() if t == test and len(r) == 2]
    paired = statistics.median(pairs)
    lost_all.append(1 - paired)
    spread += [(max(v) - min(v)) / statistics.mean(v) for v in (on, off)]
    lines.append(
        f"| {test} | {fmt(m_on)} | {fmt(min(on))}..{fmt(max(on))} | {fmt(m_off)} "
        f"| {fmt(min(off))}..{fmt(max(off))} | {m_on / m_off:.3f} "
        f"| {paired:.3f} ({min(pairs):.3f}..{max(pairs):.3f}) | {100 * (1 - paired):.1f}% |"
    )
cpu = {}
for line in open(cpu_path):
    rnd, side, ns = line.split("\t")
    cpu.setdefault(rnd, {})[side] = float(ns)
cpu_on = [r["on"] for r in cpu.values() if len(r) == 2]
cpu_off = [r["off"] for r in cpu.values() if len(r) == 2]
cpu_pairs = [r["on"] / r["off"] for r in cpu.values() if len(r) == 2 and r["off"] > 0]
cpu_extra = statistics.median(cpu_pairs) - 1
lines += [
    "",
    "| proxy CPU per request (both tests) | on | off | on/off per round: median (min..max) |",
    "| --- | ---: | ---: | ---: |",
    f"| ns, mean (min..max) | {statistics.mean(cpu_on):,.0f} ({min(cpu_on):,.0f}..{max(cpu_on):,.0f})"
    f" | {statistics.mean(cpu_off):,.0f} ({min(cpu_off):,.0f}..{max(cpu_off):,.0f})"
    f" | {1 + cpu_extra:.3f} ({min(cpu_pairs):.3f}..{max(cpu_pairs):.3f}) |",
]
worst = max(lost_all) if lost_all else float("nan")
noise = max(spread) if spread else float("nan")
verdict = "met" if worst <= 0.03 else "not met"
if noise > 2 * max(worst, 0.03):
    verdict += ", but the spread between runs of one side is larger than the difference"
body = [
    "## Detection overhead",
    "",
    "Measured $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores"
    " ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')),"
    " load average $load_before before and $load_after after ${elapsed} s of load,"
    " a machine shared with other work.",
    "",
    "Command: \`$argv_text\`. It starts one redis-server and two saltshaker processes"
    " (\`--threads $threads\`) that differ only in the rules' \`detection.enabled\`, checks"
    " that a burst on one key is listed in \`/hotkeys\` by the first and not the second, then"
    " runs, alternately against each (on, off, off, on, ...; $rounds runs per side):",
    "\`$bench_cmd\`",
    "",
    *lines,
    "",
    f"Goal: detection on loses at most 3% of throughput (median of the per-round ratios):"
    f" {verdict} (worst test {100 * worst:.1f}%)."
    f" Noise: a side's runs spread by up to {100 * noise:.0f}% of their mean (max-min), so"
    " differences smaller than that are within noise.",
    "",
    f"Proxy CPU per request (all its threads, from /proc schedstat) moves much less with the"
    f" neighbours' load: detection on costs {100 * cpu_extra:+.1f}% CPU per request"
    " (median of the per-round ratios); while the proxy is the bottleneck that is the"
    " throughput it loses.",
]
text = "\n".join(body)
print()
print(text)
if write:
    begin, end = "<!-- detection:begin -->", "<!-- detection:end -->"
    doc = open(readme).read()
    block = f"{begin}\n{text}\n{end}"
    if begin in doc and end in doc:
        doc = doc[: doc.index(begin)] + block + doc[doc.index(end) + len(end) :]
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    if not doc.endswith("\n"):
        doc += "\n"
    open(readme, "w").write(doc)
    print("\ndetection_overhead: written to bench/README.md")
EOF
