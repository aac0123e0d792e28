#!/usr/bin/env bash
# devmap verify against cat of the same bytes, side by side in one run, warm cache:
#   verify OUT            reads every tensor of the save once (hash + uniformity)
#   verify OUT --against  also reads every source the save copied from (two threads)
# on a ~1.2 GB generated F16 model (a quarter of its layers in an accelerate .dat
# offload folder) saved once in 500MB shards.
# Usage: [COLD=1] [RUNS=5] scripts/bench_verify.sh [SIZE_MB=1200] [WORKDIR=target/bench]
# Prints a Markdown table. Peak RSS from GNU time (/usr/bin/time -f %M).
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-1200}
WORK=${2:-target/bench}
RUNS=${RUNS:-5}
need_gnu_time

build_release gen_model
MODEL="$WORK/model-f16"
SAVED="$WORK/verify-saved"
mkdir -p "$WORK"
if [ ! -d "$MODEL" ]; then
    target/release/examples/gen_model "$MODEL" "$SIZE_MB" 4 f16
fi
rm -rf "$SAVED"
"$DEVMAP" save "$MODEL" -o "$SAVED" --max-shard-size 500MB --no-fsync -q

# The bytes --against reads besides the save: the sources of the current values
# (checkpoint shards and offload files).
SOURCES=("$MODEL"/*.safetensors "$MODEL"/offload/*)

# COLD=1 (root only) empties the page cache before each run instead: disk speed.
if [ "${COLD:-0}" = 1 ]; then
    warm() { sync; echo 3 > /proc/sys/vm/drop_caches; }
else
    warm() { cat "$SAVED"/*.safetensors "${SOURCES[@]}" > /dev/null; }
fi

# measure CMD...: "seconds max_rss_kib" of the median run.
measure() { median_run "$RUNS" warm "$@"; }

declare -a ROWS
row() {
    local name=$1; shift
    read -r s kib < <(measure "$@")
    ROWS+=("$name|$s|$kib")
}
row "cat OUT's shards" sh -c "cat '$SAVED'/*.safetensors > /dev/null"
row "devmap verify OUT" "$DEVMAP" verify "$SAVED" -q
row "cat OUT's shards + the sources" sh -c "cat '$SAVED'/*.safetensors ${SOURCES[*]} > /dev/null"
row "devmap verify OUT --against DIR" "$DEVMAP" verify "$SAVED" --against "$MODEL" -q

echo
echo "save: $(( $(du -sb "$SAVED" | cut -f1) >> 20 )) MiB in $(ls "$SAVED"/*.safetensors | wc -l) shards; $(nproc) cores; median of $RUNS $([ "${COLD:-0}" = 1 ] && echo cold || echo warm)-cache runs"
echo
echo "| run | time (s) | vs its cat | peak RSS (MiB) |"
echo "| --- | ---: | ---: | ---: |"
base=""
for r in "${ROWS[@]}"; do
    IFS='|' read -r name s kib <<< "$r"
    case "$name" in cat*) base=$s ;; esac
    echo "| $name | $s | $(ratio "$s" "$base") | $(( kib / 1024 )) |"
done
