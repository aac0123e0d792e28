#!/usr/bin/env bash
# LoRA merge while saving, side by side in one run: a ~1.2 GB bf16 Llama-like model
# with a rank-16 adapter on every linear projection (examples/gen_adapter):
#   devmap save without the adapter, devmap save --merge-lora, and peft's route
#   (load, PeftModel.from_pretrained, merge_and_unload, save_pretrained).
# Usage: [RUNS=3] scripts/bench_lora.sh [SIZE_MB=1200] [WORKDIR=target/bench]
# Needs the venv .ci/run makes (torch, transformers, peft): DEVMAP_HF_PYTHON or
# ~/.cache/devmap/venv-hf. Prints a Markdown table; peak RSS from GNU time.
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-1200}
WORK=${2:-target/bench}
RUNS=${RUNS:-3}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
need_gnu_time

build_release gen_model gen_adapter
MODEL="$WORK/lora-model"
ADAPTER="$WORK/lora-adapter"
OUT="$WORK/lora-out"
mkdir -p "$WORK"
if [ ! -d "$MODEL" ]; then
    target/release/examples/gen_model "$MODEL" "$SIZE_MB" 4 bf16
    # A plain checkpoint: peft's route reads the checkpoint, so devmap does too.
    rm -rf "$MODEL/offload" "$MODEL/device_map.json"
fi
[ -d "$ADAPTER" ] || target/release/examples/gen_adapter "$MODEL" "$ADAPTER" 16

# measure RUNS CMD...: "seconds max_rss_kib" of the median run, warm cache.
prepare() { rm -rf "$OUT"; cat "$MODEL"/*.safetensors > /dev/null; }
measure() {
    local runs=$1
    shift
    median_run "$runs" prepare "$@"
    rm -rf "$OUT"
}

declare -a ROWS
row() {
    local name=$1 runs=$2; shift 2
    read -r s kib < <(measure "$runs" "$@")
    ROWS+=("$name|$s|$kib")
}
row "devmap save (no adapter)" "$RUNS" "$DEVMAP" save "$MODEL" -o "$OUT" -q --no-fsync
row "devmap save --merge-lora" "$RUNS" "$DEVMAP" save "$MODEL" -o "$OUT" -q --no-fsync --merge-lora "$ADAPTER"
row "peft: load, merge_and_unload, save_pretrained" 1 "$PY" scripts/peers/peft_merge.py "$MODEL" "$ADAPTER" "$OUT"

plain=$(echo "${ROWS[0]}" | cut -d'|' -f2)
echo
echo "model: $(( $(du -sb "$MODEL" | cut -f1) >> 20 )) MiB bf16; adapter: $(ls "$ADAPTER"/*.safetensors | xargs du -b | cut -f1 | awk '{print int($1/1048576)}') MiB f32 (rank 16, every *_proj); $(nproc) cores; devmap median of $RUNS, peft 1 run; warm cache, no fsync"
echo
echo "| run | time (s) | vs plain save | peak RSS (MiB) |"
echo "| --- | ---: | ---: | ---: |"
for r in "${ROWS[@]}"; do
    IFS='|' read -r name s kib <<< "$r"
    echo "| $name | $s | $(ratio "$s" "$plain") | $(( kib / 1024 )) |"
done
