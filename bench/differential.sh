#!/usr/bin/env bash
# The long mode of tests/differential.rs: the same randomized differential test (seeded
# command sequences through two proxies over a 4-node pool, compared reply by reply with a
# plain redis-server, while keys are salted, folded, pinned and reloaded under them), run
# for longer and over several seeds. Prints each run's closing line (commands, pipelines,
# promotions, folds, reloads) and stops at the first seed that finds a difference.
#
# usage: bench/differential.sh [--secs S] [--seeds N] [--first SEED] [--only FAMILIES]
#   --secs   seconds per seed (default 600)
#   --seeds  how many seeds (default 3), from --first (default 1) upwards
#   --only   DIFF_ONLY, e.g. counters,strings (default: every family)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
secs=600
seeds=3
first=1
only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --secs) secs=$2; shift 2 ;;
        --seeds) seeds=$2; shift 2 ;;
        --first) first=$2; shift 2 ;;
        --only) only=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done

cd "$root"
cargo build --tests --quiet
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ((seed = first; seed < first + seeds; seed++)); do
    echo "== seed $seed, ${secs}s"
    rc=0
    DIFF_SEED=$seed DIFF_SECS=$secs DIFF_ONLY=$only \
        cargo test --quiet --test differential -- --nocapture >"$log" 2>&1 || rc=$?
    grep -E '^differential:|^step |differ from redis|test result' "$log" || true
    if [ "$rc" -ne 0 ]; then
        echo "seed $seed found a difference, or the test failed (DIFF_SEED=$seed repeats it)"
        exit 1
    fi
done
