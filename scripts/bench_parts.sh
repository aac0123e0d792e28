#!/usr/bin/env bash
# A save split over N processes (`--part K/N` run at once, then `--commit N`) against
# one save and `cp` of the same bytes, side by side in one run, on one generated model
# (F16, a quarter of its layers in an accelerate .dat offload folder, warm cache).
# Usage: scripts/bench_parts.sh [SIZE_MB=2200] [WORKDIR=target/bench]
# Prints a Markdown table; peak RSS is the largest of the N processes (GNU time).
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-2200}
WORK=${2:-target/bench}
RUNS=${RUNS:-3}
need_gnu_time

build_release gen_model
MODEL="$WORK/model-parts-f16"
mkdir -p "$WORK"
if [ ! -d "$MODEL" ]; then
    target/release/examples/gen_model "$MODEL" "$SIZE_MB" 4 f16
fi
OUT="$WORK/out-parts"
SHARD=250MB

prep() { rm -rf "$OUT"; sync; cat "$MODEL"/*.safetensors "$MODEL"/offload/* > /dev/null; }

# parts N: N part processes at once, then the commit; prints "seconds peak_rss_kib".
parts() {
    local n=$1 k start end peak=0 report
    start=$(date +%s.%N)
    for k in $(seq "$n"); do
        /usr/bin/time -f "%M" -o "$WORK/part-$k.rss" \
            "$DEVMAP" save "$MODEL" --out "$OUT" --max-shard-size "$SHARD" --part "$k/$n" -q &
    done
    wait
    report=$(timed "$DEVMAP" save "$MODEL" --out "$OUT" --max-shard-size "$SHARD" --commit "$n" -q)
    end=$(date +%s.%N)
    for k in $(seq "$n"); do
        peak=$(awk -v a="$peak" -v b="$(tail -1 "$WORK/part-$k.rss")" 'BEGIN {print (b > a ? b : a)}')
    done
    awk -v s="$start" -v e="$end" -v p="$peak" -v c="${report#* }" \
        'BEGIN {printf "%.2f %d\n", e - s, (c > p ? c : p)}'
}

median_parts() {
    local n=$1 _
    for _ in $(seq "$RUNS"); do prep; parts "$n"; done | median
}

BYTES=$(du -sb "$MODEL" | cut -f1)
read -r cp_s cp_rss < <(median_run "$RUNS" prep cp -r "$MODEL" "$OUT")
read -r one_s one_rss < <(median_run "$RUNS" prep "$DEVMAP" save "$MODEL" --out "$OUT" --max-shard-size "$SHARD" -q)
echo "| run | seconds | MB/s | peak RSS (MiB) | vs one save |"
echo "|---|---|---|---|---|"
row() { printf "| %s | %s | %.0f | %.0f | %s |\n" "$1" "$2" "$(awk -v b="$BYTES" -v s="$2" 'BEGIN {print b / s / 1e6}')" "$(awk -v k="$3" 'BEGIN {print k / 1024}')" "$4"; }
row "cp -r (same bytes)" "$cp_s" "$cp_rss" "$(ratio "$cp_s" "$one_s")"
row "devmap save" "$one_s" "$one_rss" "1.00"
for n in 1 2 4; do
    read -r s rss < <(median_parts "$n")
    row "$n part(s) + commit" "$s" "$rss" "$(ratio "$s" "$one_s")"
done
echo
echo "model: $(awk -v b="$BYTES" 'BEGIN {printf "%.2f GB", b / 1e9}'), shards $SHARD, $(nproc) cores, $(date -u +%F)"
