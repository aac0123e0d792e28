#!/usr/bin/env bash
# Runs each cargo-fuzz target for a bounded time (default 60 s) from the seeds in
# fuzz/seeds, and prints the corpus size each reached. Needs a nightly toolchain and
# cargo-fuzz (cargo install cargo-fuzz). A crash stops the run and leaves its input in
# fuzz/artifacts/<target>/: turn it into a regression test.
# Usage: scripts/fuzz.sh [SECONDS=60]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
SECONDS_EACH=${1:-60}
for target in safetensors_header offload_index device_map torch_bin dcp_metadata zip_members rank_files deepspeed_states quantization_config; do
    mkdir -p "corpus/$target"
    cargo +nightly fuzz run -O "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$SECONDS_EACH" -print_final_stats=1 2> "corpus/$target.log" || {
        echo "$target: CRASH — see fuzz/artifacts/$target and fuzz/corpus/$target.log"; exit 1; }
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "corpus/$target.log" | grep -o '[0-9]*$' || echo '?')
    echo "$target: ${SECONDS_EACH}s, $runs executions, corpus $(ls "corpus/$target" | wc -l) inputs"
done
