#!/usr/bin/env bash
# Save throughput and peak memory, side by side in one run, on the same generated
# model (F16, a quarter of its layers in an accelerate .dat offload folder):
#   cp -r of the input (with and without a final sync), devmap save in several
#   configurations, and a Python peer that saves the way transformers does for
#   offloaded models (one whole shard in RAM at a time, safetensors library).
# Usage: scripts/bench.sh [SIZE_MB=1200] [WORKDIR=target/bench]
# Prints a Markdown table. Peak RSS comes from GNU time (/usr/bin/time -f %M).
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-1200}
WORK=${2:-target/bench}
RUNS=${RUNS:-3}
need_gnu_time

# The Python peer's dependencies, installed here if missing.
if ! .venv/bin/python -c "import safetensors, numpy" 2>/dev/null; then
    python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "safetensors>=0.4" numpy
fi

build_release gen_model
MODEL="$WORK/model-f16"
mkdir -p "$WORK"
if [ ! -d "$MODEL" ]; then
    target/release/examples/gen_model "$MODEL" "$SIZE_MB" 4 f16
fi
INPUT_BYTES=$(du -sb "$MODEL" | cut -f1)
SHARD=500000000

warm() { cat "$MODEL"/*.safetensors "$MODEL"/offload/* > /dev/null; }

cached_kib() { awk '/^Cached:/ {print $2}' /proc/meminfo; }

# measure CMD...: prints "seconds max_rss_kib page_cache_growth_kib" of the median
# run (warm cache: the input is read once before each run).
measure() {
    local _
    for _ in $(seq "$RUNS"); do
        rm -rf "$WORK/out"; sync; warm
        local before; before=$(cached_kib)
        local run; run=$(timed "$@")
        echo "$run $(( $(cached_kib) - before ))"
        rm -rf "$WORK/out"
    done | median
}

declare -a ROWS
row() {
    local name=$1; shift
    read -r s kib cache < <(measure "$@")
    ROWS+=("$name|$s|$kib|$cache")
}
row "cp -r" cp -r "$MODEL" "$WORK/out"
row "cp -r && sync" sh -c "cp -r '$MODEL' '$WORK/out' && sync"
row "devmap save, 1 shard, --no-fsync, -j1, --cache keep" "$DEVMAP" save "$MODEL" -o "$WORK/out" --max-shard-size 100GB --no-fsync -j 1 --cache keep -q
row "devmap save, 1 shard, --no-fsync, -j1, --cache drop" "$DEVMAP" save "$MODEL" -o "$WORK/out" --max-shard-size 100GB --no-fsync -j 1 --cache drop -q
row "devmap save, 500MB shards, --no-fsync, -j1" "$DEVMAP" save "$MODEL" -o "$WORK/out" --max-shard-size $SHARD --no-fsync -j 1 -q
row "devmap save, 500MB shards, --no-fsync, -j2" "$DEVMAP" save "$MODEL" -o "$WORK/out" --max-shard-size $SHARD --no-fsync -j 2 -q
row "devmap save, 500MB shards, fsync, -j1" "$DEVMAP" save "$MODEL" -o "$WORK/out" --max-shard-size $SHARD -j 1 -q
row "devmap save, 500MB shards, fsync, -j2 (default)" "$DEVMAP" save "$MODEL" -o "$WORK/out" --max-shard-size $SHARD -q
row "devmap save, 1 shard, fsync (default)" "$DEVMAP" save "$MODEL" -o "$WORK/out" --max-shard-size 100GB -q
row "Python peer, 500MB shards" .venv/bin/python scripts/peers/python_peer.py "$MODEL" "$WORK/out" $SHARD
row "Python peer, 1 shard" .venv/bin/python scripts/peers/python_peer.py "$MODEL" "$WORK/out" 100000000000

cp_s=$(echo "${ROWS[0]}" | cut -d'|' -f2)
echo
echo "input: $(( INPUT_BYTES >> 20 )) MiB on $(df -T "$WORK" | awk 'NR==2{print $2}'), $(nproc) cores, median of $RUNS warm-cache runs"
echo
echo "| run | time (s) | vs cp -r | peak RSS (MiB) | page cache growth (MiB) |"
echo "| --- | ---: | ---: | ---: | ---: |"
for r in "${ROWS[@]}"; do
    IFS='|' read -r name s kib cache <<< "$r"
    echo "| $name | $s | $(ratio "$s" "$cp_s") | $(( kib / 1024 )) | $(( cache / 1024 )) |"
done
