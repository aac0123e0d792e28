#!/usr/bin/env bash
# Save throughput and peak memory, side by side in one run:
#   devmap save (one big shard, and 500MB shards)  vs  cp -r of the same input.
# Usage: scripts/bench.sh [SIZE_MB=1200] [WORKDIR=target/bench]
# Prints a Markdown table. Peak RSS comes from /usr/bin/time -v (GNU time).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MB=${1:-1200}
WORK=${2:-target/bench}
RUNS=${RUNS:-3}
command -v /usr/bin/time >/dev/null || { echo "needs GNU time (apt-get install time)"; exit 1; }

cargo build --release --quiet --example gen_model
cargo build --release --quiet
DEVMAP=target/release/devmap
MODEL="$WORK/model"
if [ ! -d "$MODEL" ]; then
    target/release/examples/gen_model "$MODEL" "$SIZE_MB" 4
fi
INPUT_BYTES=$(du -sb "$MODEL" | cut -f1)

warm() { cat "$MODEL"/*.safetensors "$MODEL"/offload/* > /dev/null; }

# run NAME CMD...: prints "seconds max_rss_kib" of the median run.
measure() {
    local out="$WORK/out"
    local results=()
    for _ in $(seq "$RUNS"); do
        rm -rf "$out"; sync; warm
        /usr/bin/time -f "%e %M" -o "$WORK/time.txt" "$@" > /dev/null 2>&1
        results+=("$(cat "$WORK/time.txt")")
        rm -rf "$out"
    done
    printf '%s\n' "${results[@]}" | sort -n | sed -n "$(( (RUNS + 1) / 2 ))p"
}

read -r cp_s cp_kib < <(measure cp -r "$MODEL" "$WORK/out")
read -r cps_s cps_kib < <(measure sh -c "cp -r '$MODEL' '$WORK/out' && sync")
read -r big_s big_kib < <(measure "$DEVMAP" save "$MODEL" --out "$WORK/out" --max-shard-size 100GB --quiet)
read -r small_s small_kib < <(measure "$DEVMAP" save "$MODEL" --out "$WORK/out" --max-shard-size 500MB --quiet)

ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }
echo
echo "input: $(( INPUT_BYTES >> 20 )) MiB on $(df -T "$WORK" | awk 'NR==2{print $2}'), $(nproc) cores, median of $RUNS warm-cache runs"
echo
echo "| run | time (s) | vs cp | peak RSS (MiB) |"
echo "| --- | ---: | ---: | ---: |"
echo "| cp -r | $cp_s | 1.00 | $(( cp_kib / 1024 )) |"
echo "| cp -r && sync | $cps_s | $(ratio "$cps_s" "$cp_s") | $(( cps_kib / 1024 )) |"
echo "| devmap save, one shard | $big_s | $(ratio "$big_s" "$cp_s") | $(( big_kib / 1024 )) |"
echo "| devmap save, 500MB shards | $small_s | $(ratio "$small_s" "$cp_s") | $(( small_kib / 1024 )) |"
