#!/usr/bin/env bash
# Two saltshaker binaries side by side (before and after a change) in front of one
# redis-server, with redis-benchmark GET and SET at pipeline 1 and 16 against each in
# alternating rounds (a, b, b, a, ...), so drift on a shared machine falls on both. Prints
# the median requests/s of each and the b/a ratio, and each proxy's CPU per request (from
# /proc/PID/stat), which moves far less with noise than throughput does.
#
# usage: bench/ab.sh --a BIN --b BIN [-n REQUESTS] [--rounds R] [--threads T]
set -euo pipefail

requests=200000
rounds=4
threads=1
a="" b=""
while [ $# -gt 0 ]; do
    case "$1" in
        --a) a=$2; shift 2 ;;
        --b) b=$2; shift 2 ;;
        -n) requests=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        *) echo "ab: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$a" ] && [ -x "$b" ] || { echo "ab: --a and --b must name built binaries" >&2; exit 2; }
for tool in redis-server redis-cli redis-benchmark python3; do
    command -v "$tool" >/dev/null || { echo "ab: $tool is not installed" >&2; exit 1; }
done

work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
    --logfile "$work/redis.log" &
pids+=($!)
declare -A port pid
for side in a b; do
    bin=${!side}
    port[$side]=$(free_port)
    "$bin" --listen "127.0.0.1:${port[$side]}" --admin "127.0.0.1:$(free_port)" \
        --nodes "127.0.0.1:$rport" --threads "$threads" --log-level warn 2>"$work/$side.log" &
    pid[$side]=$!
    pids+=($!)
done
for p in "$rport" "${port[a]}" "${port[b]}"; do
    for _ in $(seq 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
done

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A rps cpu
for ((r = 0; r < rounds; r++)); do
    for side in $( [ $((r % 2)) -eq 0 ] && echo "a b" || echo "b a" ); do
        for p in 1 16; do
            for t in get set; do
                before=$(ticks "${pid[$side]}")
                out=$(redis-benchmark -p "${port[$side]}" -n "$requests" -c 50 -P "$p" -t "$t" \
                    -r 100000 -q | tr '\r' '\n' | grep -E 'requests per second' | tail -n 1)
                after=$(ticks "${pid[$side]}")
                v=$(grep -oE '[0-9]+(\.[0-9]+)?' <<<"${out#*: }" | head -n 1)
                rps[$side,$t,$p]+="$v "
                cpu[$side,$t,$p]+="$(( (after - before) )) "
            done
        done
    done
done
hz=$(getconf CLK_TCK)
printf '%-8s %-4s %12s %12s %8s %14s %14s %8s\n' test P "a req/s" "b req/s" "b/a" "a us CPU/req" "b us CPU/req" "b/a"
for t in get set; do
    for p in 1 16; do
        python3 - "$t" "$p" "$requests" "$hz" "${rps[a,$t,$p]}" "${rps[b,$t,$p]}" \
            "${cpu[a,$t,$p]}" "${cpu[b,$t,$p]}" <<'EOF'
import statistics, sys
t, p, n, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ra, rb, ca, cb = (list(map(float, x.split())) for x in sys.argv[5:9])
ma, mb = statistics.median(ra), statistics.median(rb)
ua = statistics.median(ca) / hz / n * 1e6
ub = statistics.median(cb) / hz / n * 1e6
print(f"{t:<8} {p:<4} {ma:12.0f} {mb:12.0f} {mb / ma:8.3f} {ua:14.2f} {ub:14.2f} {ub / ua:8.3f}")
EOF
    done
done
