# Shared by the skewed-workload benchmarks (write_hot.sh, read_hot.sh): builds the release
# binary, starts 4 redis-server nodes, a nutcracker pool over them (ketama, fnv1a_64) and one
# saltshaker over them, on free loopback ports, and kills everything on exit.
# Sets: bin, work, nodes, node_list, np (nutcracker port), sp/sa (saltshaker port/admin port).
# Gives: start_proxy (one more saltshaker over the nodes), write_readme_block, flush.
# The caller sets `tag` (names the temp dir) before sourcing.

cargo build --release --quiet
bin=$root/target/release/saltshaker
work=$(mktemp -d "${TMPDIR:-/tmp}/saltshaker-${tag}.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }

nodes=()
for i in 1 2 3 4; do
    p=$(free_port)
    redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >"$work/redis$i.log" 2>&1 &
    pids+=($!)
    wait_port "$p"
    nodes+=("127.0.0.1:$p")
done
node_list=$(IFS=,; echo "${nodes[*]}")

np=$(free_port)
{
    echo "pool:"
    echo "  listen: 127.0.0.1:$np"
    echo "  hash: fnv1a_64"
    echo "  distribution: ketama"
    echo "  redis: true"
    echo "  servers:"
    for n in "${nodes[@]}"; do echo "    - $n:1"; done
} >"$work/nutcracker.yml"
# A stats port of its own: the default (22222) is taken by any other nutcracker running.
nutcracker -c "$work/nutcracker.yml" -o "$work/nutcracker.log" -s "$(free_port)" &
pids+=($!)
wait_port "$np"

start_proxy() { # extra saltshaker args... -> proxy_port, proxy_admin
    proxy_port=$(free_port); proxy_admin=$(free_port)
    "$bin" --listen "127.0.0.1:$proxy_port" --admin "127.0.0.1:$proxy_admin" --nodes "$node_list" --log-level warn "$@" &
    pids+=($!)
    wait_port "$proxy_port"
}
start_proxy
sp=$proxy_port; sa=$proxy_admin

write_readme_block() { # marker heading block: replace the block between the marker's comments
    python3 - "$root/bench/README.md" "$1" "$2" "$3" <<'PY'
import os, sys
path, marker, heading, block = sys.argv[1:5]
text = open(path).read() if os.path.exists(path) else ""
b, e = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
new = f"{b}\n{block}\n{e}"
if b in text and e in text:
    text = text[:text.index(b)] + new + text[text.index(e) + len(e):]
else:
    text = text.rstrip() + f"\n\n## {heading}\n\n" + new + "\n"
open(path, "w").write(text)
PY
    echo "results written to bench/README.md"
}

promote_key() { # admin-port key settle-ms: salt key over 4 shards, wait until in force for settle-ms
    python3 - "$1" "$2" "${3:-100}" <<'PY'
import json, sys, time, urllib.parse, urllib.request
base, key, settle = f"http://127.0.0.1:{sys.argv[1]}", sys.argv[2], int(sys.argv[3])
q = urllib.parse.quote(key, safe="")
urllib.request.urlopen(urllib.request.Request(f"{base}/hotkeys/promote?key={q}&shards=4", method="POST")).read()
for _ in range(200):
    s = [e for e in json.load(urllib.request.urlopen(f"{base}/hotkeys"))["salted"] if e["key"] == key]
    if s and s[0]["from_ms"] + settle < time.time() * 1000:
        sys.exit(0)
    time.sleep(0.05)
sys.exit(f"the promotion of {key} never took effect")
PY
}

flush() { local n; for n in "${nodes[@]}"; do redis-cli -h "${n%:*}" -p "${n#*:}" flushall >/dev/null; redis-cli -h "${n%:*}" -p "${n#*:}" config resetstat >/dev/null; done; }
