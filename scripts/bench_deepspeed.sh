#!/usr/bin/env bash
# Turning DeepSpeed ZeRO checkpoints (stages 2 and 3, RANKS CPU ranks, about SIZE_MB of
# fp32 master weights) into safetensors, side by side in one run (warm cache):
#   cp of the written file                     (the output's bytes moved, nothing read
#                                               from the ranks' files)
#   devmap save DIR --out OUT                  (the ranks' partitions copied into place)
#   DeepSpeed's own zero_to_fp32.py DIR OUT --safe_serialization
# Needs the reference venv with DeepSpeed (DEVMAP_HF_PYTHON, or
# ~/.cache/devmap/venv-hf/bin/python).
# Usage: [RUNS=3] [RANKS=4] scripts/bench_deepspeed.sh [SIZE_MB=1000] [WORKDIR=target/bench]
# Prints a Markdown table: median seconds and peak RSS (GNU time).
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-1000}
WORK=${2:-target/bench}
RUNS=${RUNS:-3}
RANKS=${RANKS:-4}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
need_gnu_time
"$PY" -c "import torch, deepspeed" 2>/dev/null || { echo "needs torch and deepspeed in $PY"; exit 1; }
build_release
mkdir -p "$WORK"
prepare() { rm -rf "$WORK/zero-out"; find "$INPUT" -type f -exec cat {} + > /dev/null; }
measure() { median_run "$RUNS" prepare "$@"; rm -rf "$WORK/zero-out"; }
echo "| checkpoint | command | median | peak RSS |"
echo "| --- | --- | ---: | ---: |"
for stage in 2 3; do
    INPUT="$WORK/zero$stage-$RANKS"
    [ -f "$INPUT/latest" ] || "$PY" scripts/peers/zero_save.py "$INPUT" "$SIZE_MB" "$RANKS" "$stage" > /dev/null 2>&1
    # The bytes devmap writes, for cp to copy.
    rm -rf "$WORK/zero-written"
    "$DEVMAP" save "$INPUT" --out "$WORK/zero-written" --no-fsync -q
    written=$(ls "$WORK"/zero-written/*.safetensors | head -1)
    label="ZeRO-$stage, $RANKS ranks ($(du -sh "$written" | cut -f1) of weights)"
    for row in "cp of the output's bytes|cp $written $WORK/zero-out" \
               "devmap save --no-fsync|$DEVMAP save $INPUT --out $WORK/zero-out --no-fsync -q" \
               "zero_to_fp32.py --safe_serialization|$PY $INPUT/zero_to_fp32.py $INPUT $WORK/zero-out --safe_serialization"; do
        name=${row%%|*}; cmd=${row#*|}
        read -r s kib < <(measure $cmd)
        echo "| $label | $name | $s s | $((kib / 1024)) MiB |"
    done
    rm -rf "$WORK/zero-written"
done
