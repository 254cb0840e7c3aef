#!/usr/bin/env bash
# The cost of a change in a Redis Cluster behind saltshaker: CLUSTER FAILOVER, a slot
# migrated under load, and a master killed, on 3 masters with one replica each
# (cluster-node-timeout 1500 ms). A probe INCRs one key of the changed slot through the
# proxy, one command at a time; bench/cluster_change.py prints, per change, when errors
# started and ended, when the cluster announced the new owner, when the proxy answered
# again, and acknowledged increments against what the key holds. Results go between the
# cluster-change markers in bench/README.md.
#
#   bench/cluster_change.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/cluster.sh
source "$root/bench/cluster.sh"
bin="$root/target/release/saltshaker"
[ -x "$bin" ] || cargo build --release --quiet

start_cluster 1
proxy=$(free_port)
"$bin" --listen "127.0.0.1:$proxy" --admin "127.0.0.1:$(free_port)" \
    --cluster "127.0.0.1:${ports[0]}" --request-timeout-ms 1000 >"$work/proxy.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$proxy" ping >/dev/null 2>&1 && break; sleep 0.1; done

table=$(python3 "$root/bench/cluster_change.py" "$proxy" "${ports[@]}")
echo "$table"

readme="$root/bench/README.md"
start="<!-- cluster-change:start -->"; end="<!-- cluster-change:end -->"
if grep -q "$start" "$readme"; then
    python3 - "$readme" "$start" "$end" "$table" <<'PY'
import sys
path, start, end, table = sys.argv[1:]
s = open(path).read()
i, j = s.index(start) + len(start), s.index(end)
open(path, "w").write(s[:i] + "\n" + table + "\n" + s[j:])
PY
fi
