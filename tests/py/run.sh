#!/usr/bin/env bash
# Runs the redis-py suite: makes tests/py/.venv on first use, installs redis-py into it,
# then suite.py starts 4 redis-servers and the proxy (target/debug/saltshaker, or
# $SALTSHAKER_BIN) over them. `run.sh --direct` runs against one plain redis-server;
# `run.sh --cluster` runs cluster_clients.py (a Redis Cluster behind the proxy);
# `run.sh --client-cache` runs client_cache.py (redis-py's client-side cache, over Redis 8);
# `run.sh --tls` runs tls_clients.py (TLS on both sides, a named user);
# `run.sh --learned` runs learned.py (commands learned from Redis 8, Valkey 9 and a module,
# over a cluster and pools);
# `run.sh --upstream` runs upstream.py (redis-py's own test suite, directly and through
# the proxy over one node and a pool).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv"
req="$here/requirements.txt"

if [ ! -x "$venv/bin/python" ]; then
    echo "redis-py: creating venv"
    python3 -m venv "$venv" || /usr/bin/python3 -m venv "$venv"
fi
# Reinstall only when the requirements changed since the last install.
stamp="$venv/.requirements"
if ! cmp -s "$req" "$stamp"; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
    cp "$req" "$stamp"
fi
cd "$here"
if [ "${1:-}" = "--upstream" ]; then
    ureq="$here/requirements-upstream.txt"
    ustamp="$venv/.requirements-upstream"
    if ! cmp -s "$ureq" "$ustamp"; then
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ureq"
        cp "$ureq" "$ustamp"
    fi
    exec "$venv/bin/python" -u upstream.py
fi
if [ "${1:-}" = "--tls" ]; then
    # redis-py with ssl=True (and a named user) through the proxy, TLS on both sides.
    exec "$venv/bin/python" -u tls_clients.py
fi
if [ "${1:-}" = "--client-cache" ]; then
    # redis-py's client-side cache through the proxy, over redis-server 8 nodes.
    exec "$venv/bin/python" -u client_cache.py
fi
if [ "${1:-}" = "--learned" ]; then
    # Vector sets, Valkey's DELIFEQ and MSETEX, and a test module's commands.
    exec "$venv/bin/python" -u learned.py
fi
if [ "${1:-}" = "--cluster" ]; then
    # redis-py's plain and cluster clients through the proxy in front of a Redis Cluster.
    exec "$venv/bin/python" -u cluster_clients.py
fi
exec "$venv/bin/python" -u suite.py "$@"
