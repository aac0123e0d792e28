#!/usr/bin/env bash
# What an accelerate offload folder adds to `devmap inspect`, side by side in one run
# (warm cache), on the 92,583-tensor sparse MoE of bench_tui:
#   no map           the checkpoint alone
#   map              a device map over gpu 0, gpu 1, cpu and disk, an empty offload/
#   map + offload    the same map and a .dat offload folder for the disk quarter
#                    (23,145 index entries, sparse files of the right length)
# The three are run in turn RUNS times, so a busy machine slows them alike.
# Usage: [RUNS=15] scripts/bench_offload.sh [WORKDIR=target/bench]
# Prints a Markdown table: min and median wall seconds, peak RSS (GNU time).
source "$(dirname "$0")/bench_lib.sh"
WORK=${1:-target/bench}
RUNS=${RUNS:-15}
need_gnu_time

build_release bench_tui gen_offload_map
MOE="$WORK/moe"
if [ ! -f "$MOE/model.safetensors.index.json" ]; then
    # bench_tui generates the model on its first run (and then measures; ^C is fine
    # once it says it generated).
    target/release/examples/bench_tui "$MOE" > /dev/null
fi
if [ ! -f "$WORK/moe-map/offloaded/offload/index.json" ]; then
    target/release/examples/gen_offload_map "$MOE" "$WORK/moe-map"
fi

declare -A TIMES RSS
NAMES=("no map" "map" "map + offload")
DIRS=("$MOE" "$WORK/moe-map/mapped" "$WORK/moe-map/offloaded")
for _ in $(seq "$RUNS"); do
    for i in 0 1 2; do
        out=$(timed "$DEVMAP" inspect "${DIRS[$i]}")
        TIMES[$i]="${TIMES[$i]:-} ${out% *}"
        RSS[$i]="${out#* }"
    done
done

stat() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{v[NR]=$1} END {printf "%.2f s | %.2f s", v[1], v[int((NR+1)/2)]}'; }
echo "| inspect | min | median | peak RSS |"
echo "| --- | ---: | ---: | ---: |"
for i in 0 1 2; do
    echo "| ${NAMES[$i]} | $(echo "${TIMES[$i]}" | stat) | $((RSS[$i] / 1024)) MiB |"
done
