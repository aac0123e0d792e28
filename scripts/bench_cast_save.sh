#!/usr/bin/env bash
# Casting saves against plain saves, side by side in one run: for a generated model
# stored in each of float32, bfloat16 and float16 (gen_model, 4 shards, a quarter of
# its layers' values in a .dat offload folder), `devmap save --dtype keep`
# (the kernel copy) and `--dtype X` for the two other dtypes, paired runs in turn, warm
# cache, no fsync. Each cast is compared with the plain save's time per byte written
# (`--dtype keep`, the kernel copy):
#     per byte = t(cast) / (t(keep) x output bytes / input bytes)
# 1.0 means the cast writes its bytes as fast as a plain save writes its own. A `dd`
# of as many bytes as the cast writes (from /dev/zero, 8 MiB blocks, run in turn with
# it) is shown too; on this VM it swings several-fold with the page cache's writeback.
# Usage: [RUNS=5] scripts/bench_cast_save.sh [SIZE_MB=600] [WORKDIR=target/bench]
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-600}
WORK=${2:-target/bench}
RUNS=${RUNS:-5}
need_gnu_time

build_release gen_model
mkdir -p "$WORK"

# Per model, in turn RUNS times: `--dtype keep`, and per cast the cast and a `dd` of
# its output bytes; medians.
seconds() { timed "$@" | cut -d' ' -f1; }
echo "| stored | written | output | keep (s) | cast (s) | per byte, vs keep | dd of the output bytes (s) |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
for stored in f32 bf16 f16; do
    model="$WORK/cast-$stored"
    if [ ! -d "$model" ]; then
        target/release/examples/gen_model "$model" "$SIZE_MB" 4 "$stored" > /dev/null
    fi
    case $stored in f32) size=4 ;; *) size=2 ;; esac
    in_bytes=$(cat "$model"/*.safetensors "$model"/offload/* | wc -c)
    declare -A T=()
    for _ in $(seq "$RUNS"); do
        for mode in keep float32 bfloat16 float16; do
            case $mode in float32) tsize=4; [ "$stored" = f32 ] && continue ;; bfloat16) tsize=2; [ "$stored" = bf16 ] && continue ;; float16) tsize=2; [ "$stored" = f16 ] && continue ;; keep) tsize=$size ;; esac
            rm -rf "$WORK/cast-out" "$WORK/cast-dd"; cat "$model"/*.safetensors "$model"/offload/* > /dev/null
            t=$(seconds "$DEVMAP" save "$model" -o "$WORK/cast-out" --dtype "$mode" --no-fsync -q)
            T[$mode]="${T[$mode]:-} $t"
            [ "$mode" = keep ] && continue
            rm -rf "$WORK/cast-out"
            blocks=$(( in_bytes * tsize / size / 8388608 ))
            t=$(seconds dd if=/dev/zero of="$WORK/cast-dd" bs=8M count="$blocks" status=none)
            T[dd-$mode]="${T[dd-$mode]:-} $t"
        done
    done
    rm -rf "$WORK/cast-out" "$WORK/cast-dd"
    keep_t=$(echo "${T[keep]}" | tr ' ' '\n' | grep -v '^$' | median)
    for target in float32 bfloat16 float16; do
        [ -z "${T[$target]:-}" ] && continue
        case $target in float32) tsize=4; short=f32 ;; bfloat16) tsize=2; short=bf16 ;; float16) tsize=2; short=f16 ;; esac
        c=$(echo "${T[$target]}" | tr ' ' '\n' | grep -v '^$' | median)
        d=$(echo "${T[dd-$target]}" | tr ' ' '\n' | grep -v '^$' | median)
        ratio=$(awk -v k="$keep_t" -v c="$c" -v s="$size" -v t="$tsize" 'BEGIN {printf "%.2f", c / (k * t / s)}')
        out_mb=$(( in_bytes * tsize / size / 1000000 ))
        echo "| $stored | $short | ${out_mb} MB | $keep_t | $c | $ratio | $d |"
    done
    unset T
done
