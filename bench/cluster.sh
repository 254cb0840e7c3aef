# Sourced by the cluster benchmarks: a work directory and the processes to kill on exit,
# free ports, and a 3-master Redis Cluster on loopback (`start_cluster [REPLICAS]`, which sets
# `ports` and exits non-zero if the cluster does not form).
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
# A port whose cluster bus port (+10000) is free too, both below the ephemeral range.
cluster_port() {
    python3 - <<'PY'
import random, socket
while True:
    p = random.randint(10000, 22700)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
        print(p); break
    except OSError:
        pass
PY
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# `start_cluster [REPLICAS]`: 3 masters, each with REPLICAS replicas (default 0).
start_cluster() {
    local replicas=${1:-0}
    ports=()
    local p
    for _ in $(seq 1 $((3 * (1 + replicas)))); do
        p=$(cluster_port)
        mkdir -p "$work/$p"
        redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --dir "$work/$p" \
            --cluster-enabled yes --cluster-config-file nodes.conf --logfile redis.log \
            --cluster-node-timeout 1500 &
        pids+=($!)
        ports+=("$p")
    done
    for p in "${ports[@]}"; do
        for _ in $(seq 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
    done
    redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") --cluster-replicas "$replicas" \
        --cluster-yes >/dev/null
    local ok
    for _ in $(seq 100); do
        ok=1
        for p in "${ports[@]}"; do
            redis-cli -p "$p" cluster info | grep -q 'cluster_state:ok' || ok=0
        done
        [ "$ok" -eq 1 ] && return 0
        sleep 0.1
    done
    echo "the Redis Cluster did not form (cluster_state never ok)" >&2
    exit 1
}
