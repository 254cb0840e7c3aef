#!/usr/bin/env bash
# Installs what the tests and benchmarks need on a Debian machine (run as root).
# Idempotent: when every tool is already present it touches nothing but stopping
# the packaged redis-server service, so it is cheap to run before every CI run.
set -euo pipefail

# Debian package -> a binary (or check) that proves it is installed.
PACKAGES=(redis-server redis-tools nutcracker cmake python3 python3-venv prometheus pkg-config tmux openssl nodejs npm)

# Names every missing tool; fails if any is missing.
have_all() {
    local bin ok=0
    for bin in redis-server redis-cli redis-benchmark nutcracker cmake prometheus promtool \
        pkg-config tmux python3 openssl node npm; do
        command -v "$bin" >/dev/null 2>&1 || { echo "install-deps: missing $bin"; ok=1; }
    done
    # python3-venv: Debian's python3 cannot make a venv (no ensurepip) without it.
    if [ -x /usr/bin/python3 ]; then
        /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 \
            || { echo "install-deps: missing python3-venv"; ok=1; }
    fi
    return "$ok"
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

# INSTALL_DEPS_FORCE=1 runs apt even when everything looks present.
if [ "${INSTALL_DEPS_FORCE:-0}" != 1 ] && have_all; then
    echo "install-deps: all tools present, skipping apt"
else
    if [ "$(id -u)" -ne 0 ]; then
        echo "install-deps: must run as root to install: ${PACKAGES[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    echo "install-deps: apt-get update"
    apt-get update -qq
    echo "install-deps: apt-get install ${PACKAGES[*]}"
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
    have_all
fi
stop_services

if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: cargo not found; install a Rust toolchain (rust-version in Cargo.toml)" >&2
    exit 1
fi
echo "install-deps: ok ($(redis-server --version | awk '{print $3}'), $(nutcracker --version 2>&1 | sed -n 1p))"
