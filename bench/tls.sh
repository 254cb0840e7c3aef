#!/usr/bin/env bash
# TLS against plain, at P1 and P16, direct and through saltshaker, in one run.
#
# One redis-server serves a plain port and a TLS port (`--tls-port`, no client
# certificates). Two proxies on 1 thread each: one plain on both sides, one TLS on both
# sides (clients and node). redis-benchmark -t get,set -c 50 drives each of the four
# targets (direct plain, direct TLS, proxy plain, proxy TLS) at -P 1 and -P 16, rounds
# rotating the order; the table has medians of requests/s and, for the proxies, CPU per
# request from /proc. Results go between the TLS markers in bench/README.md.
#
#   bench/tls.sh [--quick]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
n=200000
rounds=3
[ "${1:-}" = "--quick" ] && { n=40000; rounds=1; }

bin="$root/target/release/saltshaker"
[ -x "$bin" ] || cargo build --release --quiet
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "nothing on $1" >&2; exit 1; }

cd "$work"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key \
    -out ca.crt -days 2 -subj "/CN=bench ca" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n' >s.ext
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout s.key -out s.csr \
    -subj /CN=s 2>/dev/null
openssl x509 -req -in s.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out s.crt \
    -extfile s.ext 2>/dev/null

plain=$(free_port); tls=$(free_port)
redis-server --port "$plain" --tls-port "$tls" --bind 127.0.0.1 --save "" --appendonly no \
    --tls-cert-file s.crt --tls-key-file s.key --tls-ca-cert-file ca.crt \
    --tls-auth-clients no --dir "$work" --logfile redis.log &
pids+=($!)
wait_port "$plain"

start_proxy() { # name listen admin yaml-extra
    printf 'listen: 127.0.0.1:%s\nadmin: 127.0.0.1:%s\nthreads: 1\nbackend:\n  nodes: ["127.0.0.1:%s"]\n%s\n' \
        "$2" "$3" "$4" "$5" >"$1.yaml"
    "$bin" --config "$1.yaml" >"$1.log" 2>&1 &
    pids+=($!)
    wait_port "$2"
}
pp=$(free_port); tp=$(free_port)
start_proxy plain "$pp" "$(free_port)" "$plain" ""
plain_pid=${pids[-1]}
start_proxy tlsp "$tp" "$(free_port)" "$tls" "  tls: { ca: $work/ca.crt }
tls: { cert: $work/s.crt, key: $work/s.key }"
tls_pid=${pids[-1]}

cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'; }

# target -> "port tls? pid"
declare -A T=( [direct]="$plain 0 -" [direct_tls]="$tls 1 -" [proxy]="$pp 0 $plain_pid" [proxy_tls]="$tp 1 $tls_pid" )
order=(direct direct_tls proxy proxy_tls)
declare -A R C
for p in 1 16; do
    for r in $(seq 1 "$rounds"); do
        # Rotate the order each round.
        k=$(( (r - 1) % 4 ))
        rot=("${order[@]:$k}" "${order[@]:0:$k}")
        for t in "${rot[@]}"; do
            read -r port istls pid <<<"${T[$t]}"
            args=(-h 127.0.0.1 -p "$port" -t get,set -n "$n" -c 50 -P "$p" -r 100000 --csv)
            [ "$istls" = 1 ] && args+=(--tls --cacert "$work/ca.crt")
            c0=0; [ "$pid" != - ] && c0=$(cpu_ns "$pid")
            out=$(redis-benchmark "${args[@]}")
            c1=0; [ "$pid" != - ] && c1=$(cpu_ns "$pid")
            for cmd in GET SET; do
                rps=$(grep "\"$cmd\"" <<<"$out" | head -1 | cut -d, -f2 | tr -d '"')
                R[$t,$p,$cmd]+="$rps "
            done
            # CPU per request over both tests (2n requests).
            [ "$pid" != - ] && C[$t,$p]+="$(awk -v a="$c0" -v b="$c1" -v n="$n" 'BEGIN { printf "%.2f", (b - a) / 1000 / (2 * n) }') "
        done
    done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

table=$(
    echo "| | P | GET req/s | SET req/s | GET vs direct plain | proxy CPU µs/req |"
    echo "|---|---|---|---|---|---|"
    for p in 1 16; do
        base=$(median <<<"${R[direct,$p,GET]}")
        for t in "${order[@]}"; do
            g=$(median <<<"${R[$t,$p,GET]}"); s=$(median <<<"${R[$t,$p,SET]}")
            cpu=-; [ -n "${C[$t,$p]:-}" ] && cpu=$(median <<<"${C[$t,$p]}")
            ratio=$(awk -v a="$g" -v b="$base" 'BEGIN { printf "%.2f", a / b }')
            echo "| $t | $p | $g | $s | $ratio | $cpu |"
        done
    done
)
echo "$table"

readme="$root/bench/README.md"
start="<!-- tls:start -->"; end="<!-- tls:end -->"
if grep -q "$start" "$readme"; then
    python3 - "$readme" "$start" "$end" "$table" "$n" "$rounds" <<'EOF'
import sys
path, start, end, table, n, rounds = sys.argv[1:]
s = open(path).read()
i, j = s.index(start) + len(start), s.index(end)
body = f"\n`bench/tls.sh`: -n {n} per test, -c 50, -r 100000, {rounds} rounds, medians.\n\n{table}\n"
open(path, "w").write(s[:i] + body + s[j:])
EOF
fi
