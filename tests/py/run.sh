#!/usr/bin/env bash
# Runs the redis-py suite: makes tests/py/.venv on first use, installs redis-py into it,
# then suite.py starts 4 redis-servers and the proxy (target/debug/saltshaker, or
# $SALTSHAKER_BIN) over them. `run.sh --direct` runs against one plain redis-server.
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
exec "$venv/bin/python" -u suite.py "$@"
