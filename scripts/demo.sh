#!/usr/bin/env bash
# One command that shows saltshaker working: a pool of 4 local redis-server nodes, the proxy
# in front of them, and one viral counter hammered twice, first with mitigation off, then
# with the shipped rules (the proxy reloads the file live). Prints each node's load both
# times and what changed, with this run's numbers. Then leaves the proxy up to play with
# until Ctrl-C; with CI set (or stdin not a terminal) it exits after the second run.
#
#   scripts/demo.sh                      build if needed, run, wait for Ctrl-C
#   CI=true scripts/demo.sh              the same, without the wait (for tests)
#   SALTSHAKER_BIN=path scripts/demo.sh  use that binary instead of building
#   DEMO_DURATION_MS=6000                length of each of the two load runs
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

duration_ms=${DEMO_DURATION_MS:-6000}
viral_key=likes:viral
workload="viral:$viral_key:0.3"
mix="incr=100"

if [ -t 1 ]; then
    bold=$'\e[1m' dim=$'\e[2m' reset=$'\e[0m'
else
    bold='' dim='' reset=''
fi
say() { printf '%s\n' "$*"; }
step() { printf '\n%s== %s%s\n' "$bold" "$*" "$reset"; }
die() {
    printf 'demo: %s\n' "$*" >&2
    exit 1
}

is_ci() { case "${CI:-}" in '' | 0 | false | no) return 1 ;; *) return 0 ;; esac; }
interactive() { [ -t 0 ] && ! is_ci; }

# ---- 1. Tools: redis-server, redis-cli, python3, and the saltshaker binary. ----

missing_packages() {
    local pkgs=()
    command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
    command -v redis-cli >/dev/null 2>&1 || pkgs+=(redis-tools)
    command -v python3 >/dev/null 2>&1 || pkgs+=(python3)
    printf '%s\n' "${pkgs[@]}"
}

mapfile -t missing < <(missing_packages | sed '/^$/d')
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        step "installing ${missing[*]} (Debian packages)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        # The package starts a redis service on the default port; the demo runs its own
        # nodes, so leave the machine as it was apart from the installed files.
        if [[ " ${missing[*]} " == *" redis-server "* ]]; then
            if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
                systemctl stop redis-server >/dev/null 2>&1 || true
            elif [ -x /etc/init.d/redis-server ]; then
                /etc/init.d/redis-server stop >/dev/null 2>&1 || true
            fi
        fi
        mapfile -t missing < <(missing_packages | sed '/^$/d')
        [ "${#missing[@]}" -eq 0 ] || die "still missing after apt-get: ${missing[*]}"
    else
        say "demo: needs ${missing[*]}, not found. Install, then run this again:" >&2
        say "  sudo apt-get install -y ${missing[*]}    # Debian/Ubuntu (macOS: brew install redis python)" >&2
        exit 1
    fi
fi

if [ -n "${SALTSHAKER_BIN:-}" ]; then
    bin=$SALTSHAKER_BIN
    [ -x "$bin" ] || die "SALTSHAKER_BIN=$bin is not an executable"
else
    bin=${CARGO_TARGET_DIR:-$root/target}/release/saltshaker
    if [ ! -x "$bin" ] || [ -n "$(find src Cargo.toml Cargo.lock -newer "$bin" -print -quit 2>/dev/null)" ]; then
        command -v cargo >/dev/null 2>&1 \
            || die "cargo not found: install a Rust toolchain (rustup), then run this again"
        step "building saltshaker (cargo build --release)"
        nice -n 10 cargo build --release
        [ -x "$bin" ] || die "the build did not produce $bin"
    fi
fi

# ---- 2. A pool of 4 redis-server nodes and the proxy, on free loopback ports. ----

tmp=$(mktemp -d "${TMPDIR:-/tmp}/saltshaker-demo.XXXXXX")
pids=()

cleanup() {
    local rc=$? pid i
    trap - EXIT INT TERM
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    # Redis and the proxy stop on SIGTERM within a moment; anything still there after
    # 5 s is killed, so the demo never leaves a process behind.
    for i in $(seq 50); do
        local alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$tmp"
    if [ "$waiting" = 1 ] || [ "$rc" = 130 ] || [ "$rc" = 143 ]; then
        printf '\ndemo: stopped the proxy and the 4 nodes, removed %s\n' "$tmp"
    fi
    exit "$rc"
}
# Ctrl-C is the expected way to end the last step (exit 0); earlier it is an interruption.
waiting=0
on_int() { if [ "$waiting" = 1 ]; then exit 0; else exit 130; fi; }
trap cleanup EXIT
trap on_int INT
trap 'exit 143' TERM

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# HTTP GET on the admin port; prints the body, fails on anything but 200.
http_get() {
    python3 - "$1" <<'EOF'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
    sys.stdout.write(r.read().decode())
EOF
}

# Starts one node on a free port and prints the port. A port someone takes between our
# choice and redis's bind makes redis exit: then try another one.
start_redis() {
    local attempt port pid i
    for attempt in 1 2 3 4 5; do
        port=$(free_port)
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
            --dir "$tmp" --logfile "$tmp/redis-$port.log" </dev/null >/dev/null 2>&1 &
        pid=$!
        for i in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            # The node answering must be the one we started, not someone else's.
            if [ "$(redis-cli -p "$port" info server 2>/dev/null | tr -d '\r' |
                sed -n 's/^process_id://p')" = "$pid" ]; then
                pids+=("$pid")
                node_ports+=("$port")
                return 0
            fi
            sleep 0.1
        done
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    die "could not start redis-server (log: $tmp/redis-$port.log)"
}

write_rules_off() {
    cat >"$tmp/rules.next" <<'EOF'
# Demo phase 1: hot keys are detected and shown, but writes pass through unchanged.
version: 1
defaults:
  write: { strategy: off }
EOF
}

# Replaces the rules file in one rename, so the proxy never reads half a file.
install_rules() {
    "$bin" check "$tmp/rules.next" >/dev/null || die "rules file refused: $("$bin" check "$tmp/rules.next" 2>&1)"
    mv -f "$tmp/rules.next" "$tmp/rules.yaml"
}

metric() { # name -> value (0 when absent)
    http_get "http://$admin/metrics" | awk -v n="$1" '$1 == n { v = $2 } END { print v + 0 }'
}

step "starting 4 redis-server nodes and saltshaker"
node_ports=()
for _ in 1 2 3 4; do start_redis; done
nodes=$(printf '127.0.0.1:%s,' "${node_ports[@]}")
nodes=${nodes%,}
say "  nodes      $nodes  (redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), no persistence)"

write_rules_off
install_rules
started=0
for attempt in 1 2 3 4 5; do
    proxy_port=$(free_port)
    admin_port=$(free_port)
    [ "$proxy_port" != "$admin_port" ] || continue
    listen=127.0.0.1:$proxy_port
    admin=127.0.0.1:$admin_port
    "$bin" --listen "$listen" --admin "$admin" --nodes "$nodes" --rules "$tmp/rules.yaml" \
        </dev/null >"$tmp/saltshaker.log" 2>&1 &
    proxy_pid=$!
    for i in $(seq 100); do
        kill -0 "$proxy_pid" 2>/dev/null || break
        if http_get "http://$admin/readyz" >/dev/null 2>&1 &&
            [ "$(redis-cli -p "$proxy_port" ping 2>/dev/null)" = PONG ]; then
            started=1
            break
        fi
        sleep 0.1
    done
    # Still running after answering: it holds both ports (a failed bind exits at once).
    if [ "$started" = 1 ] && kill -0 "$proxy_pid" 2>/dev/null; then
        pids+=("$proxy_pid")
        break
    fi
    started=0
    kill "$proxy_pid" 2>/dev/null || true
    wait "$proxy_pid" 2>/dev/null || true
done
[ "$started" = 1 ] || die "saltshaker did not start: $(tail -5 "$tmp/saltshaker.log")"
say "  saltshaker $listen (clients)  $admin (admin: /metrics /hotkeys /rules)"
say "  rules      $tmp/rules.yaml"

# ---- 3. The same viral-counter workload, without and then with mitigation. ----

bench() { # output file
    "$bin" bench --target "$listen" --workload "$workload" --mix "$mix" --nodes "$nodes" \
        --duration-ms "$duration_ms" --json >"$1"
}

# Which node owns the viral key: the one where it exists.
owner_of() {
    local p
    for p in "${node_ports[@]}"; do
        if [ "$(redis-cli -p "$p" exists "$1" 2>/dev/null)" = 1 ]; then
            echo "127.0.0.1:$p"
            return
        fi
    done
    echo none
}

node_table() { # report.json owner
    python3 - "$1" "$2" "$viral_key" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
owner, key = sys.argv[2], sys.argv[3]
nodes = r["per_node"]
total = sum(n["commands"] for n in nodes) or 1
width = max(round(n["commands"] / total * 40) for n in nodes)
print(f"  {'node':<18} {'commands':>10} {'share':>7}")
for n in nodes:
    share = n["commands"] / total
    bar = "#" * round(share * 40)
    mark = f"  <- {key} lives here" if n["node"] == owner else ""
    print(f"  {n['node']:<18} {n['commands']:>10,} {share:>7.1%}  {bar:<{width}}{mark}".rstrip())
imb = r.get("imbalance")
print(f"  max/mean {imb:.2f} (1.00 = even)   client ops {r['ops']:,} = {r['ops_per_sec']:,.0f}/s, "
      f"p99 {r['p99_us'] / 1000:.1f} ms, {r['errors']} errors")
EOF
}

step "phase 1 (before): mitigation off, one viral counter takes 30% of all INCRs"
say "  saltshaker bench --workload $workload --mix $mix -c 50 for $((duration_ms / 1000)) s"
say "  through saltshaker with defaults.write.strategy = off: hot keys are detected but every"
say "  write passes through, so each key's node takes all of its traffic, as with a client-side"
say "  hash or twemproxy"
bench "$tmp/before.json"
owner=$(owner_of "$viral_key")
node_table "$tmp/before.json" "$owner"

step "phase 2 (after): the shipped rules (strategy auto -> combine), reloaded live"
gen=$(metric saltshaker_rules_generation)
cp "$root/rules/default.yaml" "$tmp/rules.next"
install_rules
for i in $(seq 50); do
    [ "$(metric saltshaker_rules_generation)" != "$gen" ] && break
    sleep 0.1
done
[ "$(metric saltshaker_rules_generation)" != "$gen" ] || die "the proxy did not reload the rules file"
say "  rules file replaced by rules/default.yaml; the proxy reloaded it (generation $gen -> $(metric saltshaker_rules_generation)),"
say "  no restart, no connection dropped"
combined0=$(metric saltshaker_combined_writes_total)
backend0=$(metric saltshaker_combine_backend_writes_total)

# The binary itself in the background (not a function's subshell), so its pid is the one
# to wait for and to kill on Ctrl-C.
"$bin" bench --target "$listen" --workload "$workload" --mix "$mix" --nodes "$nodes" \
    --duration-ms "$duration_ms" --json >"$tmp/after.json" &
bench_pid=$!
pids+=("$bench_pid")
top_cols=$([ -t 1 ] && tput cols 2>/dev/null || echo 100)
t0=$(date +%s)
for frame in 1 2 3; do
    sleep 0.5
    kill -0 "$bench_pid" 2>/dev/null || break
    say ""
    say "  ${dim}\$ saltshaker top --admin $admin --once   (t+$(($(date +%s) - t0)) s)${reset}"
    COLUMNS=$((top_cols - 4)) "$bin" top --admin "$admin" --once 2>&1 | sed 's/^/    /' || true
done
wait "$bench_pid" || die "the load generator failed"
say ""
node_table "$tmp/after.json" "$owner"
combined=$(($(metric saltshaker_combined_writes_total) - combined0))
backend=$(($(metric saltshaker_combine_backend_writes_total) - backend0))
say ""
say "  /metrics during phase 2:"
say "    saltshaker_combined_writes_total          +$combined   (increments that were combined)"
say "    saltshaker_combine_backend_writes_total   +$backend   (INCRBYs the node got for them)"

# ---- What changed, from this run's numbers. ----

value=$(redis-cli -p "$proxy_port" get "$viral_key" | tr -d '\r')
step "what changed"
python3 - "$tmp/before.json" "$tmp/after.json" "$owner" "$viral_key" "$combined" "$backend" "$value" <<'EOF'
import json, os, sys
b, a = (json.load(open(p)) for p in sys.argv[1:3])
owner, key = sys.argv[3], sys.argv[4]
combined, backend, value = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]

def owner_load(r):
    total = sum(n["commands"] for n in r["per_node"]) or 1
    mine = sum(n["commands"] for n in r["per_node"] if n["node"] == owner)
    return mine, mine / total, total

bm, bs, bt = owner_load(b)
am, as_, at = owner_load(a)
print(f"  Before, {owner} (which owns {key}) ran {bs:.0%} of all backend commands:")
print(f"  {b['imbalance']:.2f}x the mean node. On a busy pool that node saturates first and")
print("  caps the whole pool, however many nodes are added.")
print(f"  After, it ran {as_:.0%} ({a['imbalance']:.2f}x the mean): saltshaker saw {key} go write-hot")
if combined and backend:
    print(f"  and sent {combined:,} of its {a['viral_ops']:,} INCRs to the node as {backend:,} "
          f"INCRBYs ({combined / backend:.0f} increments per command),")
else:
    print("  but combined nothing (the key never got hot enough: is the machine very slow?),")
print(f"  so the nodes ran {at / max(a['ops'], 1):.2f} commands per client command "
      f"instead of {bt / max(b['ops'], 1):.2f}.")
print(f"  Client throughput: {b['ops_per_sec']:,.0f} -> {a['ops_per_sec']:,.0f} ops/s; "
      f"p99 {b['p99_us'] / 1000:.1f} -> {a['p99_us'] / 1000:.1f} ms")
print(f"  (here the nodes, the proxy and the load generator share {os.cpu_count()} CPU cores, so")
print("  throughput is bound by this machine, not by the hot node).")
want = b["viral_ops"] + a["viral_ops"]
if value == str(want):
    print(f"  Every caller still got its own exact reply, and GET {key} = {value} =")
    print(f"  {b['viral_ops']:,} + {a['viral_ops']:,} successful INCRs: none lost or doubled.")
else:
    print(f"  WARNING: GET {key} = {value}, but the two runs counted {want} successful INCRs.")
    sys.exit(1)
EOF

# ---- 4. Leave it running to play with. ----

if ! interactive; then
    say ""
    say "demo: done (non-interactive run: stopping everything)"
    exit 0
fi
rel_bin=$bin
[[ "$bin" == "$root/"* ]] && rel_bin=./${bin#"$root/"}
step "saltshaker is still running; try, in another terminal:"
say "  redis-cli -p $proxy_port incr $viral_key"
say "  $rel_bin top --admin $admin"
say "  $rel_bin bench --target $listen --workload $workload --mix $mix --nodes $nodes --duration-ms 20000"
say "  curl -s $admin/hotkeys; curl -s $admin/metrics | grep combine"
say "  edit $tmp/rules.yaml (reloaded on save)"
say ""
say "Ctrl-C stops the proxy and the 4 nodes and removes $tmp."
waiting=1
while kill -0 "$proxy_pid" 2>/dev/null; do sleep 1; done
die "saltshaker exited on its own: $(tail -5 "$tmp/saltshaker.log" 2>/dev/null)"
