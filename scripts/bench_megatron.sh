#!/usr/bin/env bash
# Converting a Megatron-Core distributed checkpoint (torch_dist, TP=2, float32, ~0.9 GB:
# a Llama-flavoured GPTModel of LAYERS layers of HIDDEN, saved by megatron-core on 2
# gloo ranks) to a Hugging Face checkpoint, side by side in one run (warm cache):
#   cp -r of the folder                      (the bytes moved, nothing converted)
#   devmap save DIR --out OUT --no-fsync     (config.json from common.pt's arguments)
#   megatron-core peer: dist_checkpointing.load into a TP=1 model, the parameters cut
#               and renamed with torch, safetensors save_file (scripts/peers/megatron_bench.py)
# Needs the reference venv with megatron-core (DEVMAP_HF_PYTHON, or
# ~/.cache/devmap/venv-hf/bin/python).
# With EXPERTS=N: a Mixtral-like MoE of N experts a layer, saved at EP=2 (the peer
# loads it into an EP=1 model and renames to Mixtral's names).
# With FSDP=1: Megatron-LM's fsdp_dtensor format (TP=1 over 2 data-parallel ranks;
# the peer is torch's dcp_to_torch_save, then the same rename).
# Usage: [RUNS=3] [EXPERTS=N] [FSDP=1] scripts/bench_megatron.sh [LAYERS=12] [HIDDEN=1024] [WORKDIR=target/bench]
# Prints a Markdown table: median seconds and peak RSS (GNU time).
source "$(dirname "$0")/bench_lib.sh"
LAYERS=${1:-12}
HIDDEN=${2:-1024}
WORK=${3:-target/bench}
RUNS=${RUNS:-3}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
need_gnu_time
"$PY" -c "import megatron.core" 2>/dev/null || { echo "needs megatron-core in $PY"; exit 1; }

build_release
export EXPERTS=${EXPERTS:-0} FSDP=${FSDP:-0}
LAYOUT=$([ "$EXPERTS" -gt 0 ] && echo "moe$EXPERTS-ep2" || { [ "$FSDP" = 1 ] && echo "fsdp-dp2"; } || echo "tp2")
INPUT="$WORK/megatron-$LAYOUT-$LAYERS-$HIDDEN"
mkdir -p "$WORK"
[ -f "$INPUT/.metadata" ] || "$PY" scripts/peers/megatron_bench.py save "$INPUT" "$LAYERS" "$HIDDEN" > /dev/null 2>&1
[ -f "$INPUT/.metadata" ] || { echo "megatron-core could not save $INPUT"; exit 1; }

prepare() { rm -rf "$WORK/megatron-out"; cat "$INPUT"/* "$INPUT"/.metadata > /dev/null 2>&1 || true; }
measure() { median_run "$RUNS" prepare "$@"; rm -rf "$WORK/megatron-out"; }
PEER=$([ "$FSDP" = 1 ] && echo "torch dcp_to_torch_save + cut + save_file" || echo "megatron-core load + torch cut + save_file")
echo "| input | command | median | peak RSS |"
echo "| --- | --- | ---: | ---: |"
for row in "cp -r|cp -r $INPUT $WORK/megatron-out" \
           "devmap save --no-fsync|$DEVMAP save $INPUT --out $WORK/megatron-out --no-fsync -q" \
           "$PEER|$PY scripts/peers/megatron_bench.py peer $INPUT $WORK/megatron-out $LAYERS $HIDDEN"; do
    name=${row%%|*}; cmd=${row#*|}
    read -r s kib < <(measure $cmd)
    echo "| Megatron $LAYOUT ($(du -sh "$INPUT" | cut -f1)) | $name | $s s | $((kib / 1024)) MiB |"
done
