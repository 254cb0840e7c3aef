#!/usr/bin/env bash
# The project's test command: format check (warning only), cargo test, the redis-py
# suites against the proxy (a 4-node pool, a Redis Cluster, TLS, Redis 8 client-side
# caching, commands learned from Redis 8, Valkey 9 and a module), redis-py's own test
# suite directly and through the proxy, then the fuzz smoke run if there is one.
# Stops at the first failing step; prints "summary: N passed, N failed" last and exits
# non-zero if anything failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target_dir=${CARGO_TARGET_DIR:-$root/target}
logdir=$(mktemp -d "${TMPDIR:-/tmp}/saltshaker-test.XXXXXX")
trap 'rm -rf "$logdir"' EXIT
export RUST_BACKTRACE=1 CARGO_TERM_COLOR=never

passed=0
failed=0
started=$(date +%s)

step() { printf '\n=== %s\n' "$*"; }

finish() {
    local status=$1
    printf '\n=== done in %ss\n' "$(($(date +%s) - started))"
    echo "summary: $passed passed, $failed failed"
    exit "$status"
}

# Adds a runner's "N passed ... N failed" counts (its last such line) to the totals,
# or counts the step as one test when it printed none.
count() {
    local log=$1 rc=$2 line p=0 f=0
    line=$(grep -E '[0-9]+ passed[,;] [0-9]+ failed' "$log" | tail -n 1)
    if [ -n "$line" ]; then
        p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+')
        f=$(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+')
        passed=$((passed + p))
        failed=$((failed + f))
    elif [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
    fi
    # A failing exit that its counts do not show is one more failure.
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        failed=$((failed + 1))
    fi
}

# The integration tests need real servers and clients. A missing tool is a failed run,
# never a skipped test: as root, install-deps.sh installs what is missing; otherwise
# the run stops here and names every missing tool.
step "tools the tests need"
missing=$(bash scripts/install-deps.sh --check 2>&1) || {
    if [ "$(id -u)" -eq 0 ]; then
        bash scripts/install-deps.sh || { failed=$((failed + 1)); finish 1; }
    else
        echo "$missing"
        echo "test.sh: missing tools (install them with: sudo scripts/install-deps.sh)"
        failed=$((failed + 1))
        finish 1
    fi
}
echo "all tools present"

step "cargo fmt --all -- --check (warning only)"
if ! cargo fmt --all -- --check >"$logdir/fmt.log" 2>&1; then
    echo "warning: cargo fmt would change these files:"
    sed -nE "s|^Diff in (${root}/)?([^ ]+):[0-9]+:.*|  \2|p" "$logdir/fmt.log" | sort -u
    grep -q '^Diff in' "$logdir/fmt.log" || tail -n 5 "$logdir/fmt.log"
fi

step "cargo test --all-targets --no-fail-fast"
timeout 2400 cargo test --all-targets --no-fail-fast 2>&1 | tee "$logdir/cargo.log"
rc=${PIPESTATUS[0]}
# cargo prints one "test result:" line per test binary: add them all up.
while read -r p f; do
    passed=$((passed + p))
    failed=$((failed + f))
done < <(sed -nE 's/^test result: [A-Za-z]+\. ([0-9]+) passed; ([0-9]+) failed.*/\1 \2/p' \
    "$logdir/cargo.log")
if [ "$rc" -ne 0 ]; then
    grep -q '^test result: FAILED' "$logdir/cargo.log" || failed=$((failed + 1))
    echo "cargo test failed (exit $rc)"
    finish 1
fi

step "cargo build (the binary the redis-py suite runs)"
if ! cargo build --bin saltshaker 2>&1 | tail -n 30; then
    failed=$((failed + 1))
    finish 1
fi

# One redis-py run: its log name, its time limit, what failing means, then run.sh's flags.
py_suite() {
    local name=$1 limit=$2 what=$3
    shift 3
    SALTSHAKER_BIN="$target_dir/debug/saltshaker" timeout "$limit" tests/py/run.sh "$@" 2>&1 \
        | tee "$logdir/$name.log"
    rc=${PIPESTATUS[0]}
    count "$logdir/$name.log" "$rc"
    [ "$rc" -eq 0 ] || { echo "$what (exit $rc)"; finish 1; }
}

step "redis-py suite (tests/py/run.sh)"
py_suite py 900 "redis-py suite failed"

step "redis-py against a Redis Cluster behind the proxy (tests/py/run.sh --cluster)"
py_suite py-cluster 300 "redis-py cluster clients failed" --cluster

step "redis-py with TLS on both sides and a named user (tests/py/run.sh --tls)"
py_suite py-tls 300 "redis-py TLS clients failed" --tls

step "redis-py's client-side cache through the proxy, over Redis 8 (tests/py/run.sh --client-cache)"
py_suite py-client-cache 300 "redis-py client-side cache failed" --client-cache

step "redis-py with commands learned from Redis 8, Valkey 9 and a module (tests/py/run.sh --learned)"
py_suite py-learned 300 "redis-py with learned commands failed" --learned

step "redis-py's own test suite, directly and through the proxy (tests/py/run.sh --upstream)"
py_suite py-upstream 1200 "redis-py's own suite differs from tests/py/upstream_expected.txt" --upstream

if [ -f .ci/fuzz.sh ]; then
    step "fuzz smoke run (.ci/fuzz.sh)"
    timeout 1500 bash .ci/fuzz.sh 2>&1 | tee "$logdir/fuzz.log"
    rc=${PIPESTATUS[0]}
    count "$logdir/fuzz.log" "$rc"
    [ "$rc" -eq 0 ] || { echo "fuzz smoke run failed (exit $rc)"; finish 1; }
fi

[ "$failed" -eq 0 ] && finish 0
finish 1
