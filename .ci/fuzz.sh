#!/usr/bin/env bash
# Fuzzes the wire module (src/resp) with cargo-fuzz: each target for FUZZ_SECONDS
# (default 30). Exits non-zero on a crash; the crashing input is left in fuzz/artifacts/.
#
# cargo-fuzz needs unstable compiler flags (sancov instrumentation). The default (stable)
# toolchain accepts them with RUSTC_BOOTSTRAP=1; FUZZ_TOOLCHAIN=nightly picks another.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-30}"
targets=(request_parser reply_framer)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz (a few minutes, once)"
    nice -n 10 cargo install cargo-fuzz --locked
fi

export RUSTC_BOOTSTRAP=1
toolchain=()
if [ -n "${FUZZ_TOOLCHAIN:-}" ]; then
    toolchain=("+${FUZZ_TOOLCHAIN}")
fi

# Safe Rust: the address sanitizer adds little but time, so it is off. Overflow and
# debug assertions stay on (cargo-fuzz's default), so arithmetic slips still crash.
# New inputs go to fuzz/corpus (ignored by git); fuzz/seeds holds a few valid frames.
for target in "${targets[@]}"; do
    echo "fuzz.sh: ${target} for ${seconds}s"
    mkdir -p "fuzz/corpus/${target}"
    nice -n 10 cargo "${toolchain[@]}" fuzz run --sanitizer none "${target}" \
        "fuzz/corpus/${target}" "fuzz/seeds/${target}" -- -max_total_time="${seconds}" -max_len=4096
done
echo "fuzz.sh: ${#targets[@]} targets ran ${seconds}s each without a crash"
