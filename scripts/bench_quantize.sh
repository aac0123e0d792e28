#!/usr/bin/env bash
# `devmap save --quantize fp8-block` of a bfloat16 model, side by side with `cp` of the
# same number of output bytes, warm cache; peak RSS from GNU time. The model: SIZE_MB of
# Llama-70B-shaped MLP weights (8,192 × 28,672 and back) in bfloat16; the output is half
# that (F8_E4M3) plus the tile scales.
# Usage: [RUNS=3] scripts/bench_quantize.sh [SIZE_MB=512] [WORKDIR=target/bench]
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-512}
WORK=${2:-target/bench}
RUNS=${RUNS:-3}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
need_gnu_time
build_release
MODEL="$WORK/model-bf16-mlp-$SIZE_MB"
OUT="$WORK/fp8-out"
mkdir -p "$WORK"
if [ ! -d "$MODEL" ]; then
    "$PY" - "$MODEL" "$SIZE_MB" <<'PY'
import json, os, sys
import torch
from safetensors.torch import save_file
folder, size_mb = sys.argv[1], int(sys.argv[2])
os.makedirs(folder)
torch.manual_seed(0)
shapes = [(28672, 8192), (8192, 28672)]
tensors, total, i = {}, 0, 0
while total < size_mb * 2**20:
    rows, cols = shapes[i % 2]
    name = f"model.layers.{i // 2}.mlp.{'up' if i % 2 == 0 else 'down'}_proj.weight"
    tensors[name] = (torch.randn(rows, cols) * 0.02).to(torch.bfloat16)
    total += rows * cols * 2
    i += 1
save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16"}, f)
PY
fi
rm -rf "$OUT"
"$DEVMAP" save "$MODEL" --out "$OUT" --quantize fp8-block --no-fsync -q
OUT_BYTES=$(du -cb "$OUT"/*.safetensors | tail -1 | cut -f1)
IN_BYTES=$(du -cb "$MODEL"/*.safetensors | tail -1 | cut -f1)
prepare_save() { rm -rf "$OUT"; cat "$MODEL"/*.safetensors > /dev/null; }
prepare_cp() { rm -rf "$WORK/fp8-cp"; mkdir -p "$WORK/fp8-cp"; }
rm -rf "$WORK/fp8-src"; cp -r "$OUT" "$WORK/fp8-src"
export DEVMAP MODEL OUT WORK
run_save() { "$DEVMAP" save "$MODEL" --out "$OUT" --quantize fp8-block --no-fsync -q; }
run_cp() { cp "$WORK/fp8-src/"*.safetensors "$WORK/fp8-cp/"; }
read -r d rss c r lo hi < <(side_by_side "$RUNS" prepare_save run_save prepare_cp run_cp)
echo "| run | seconds (median of $RUNS, alternating) | vs cp (median of the runs' ratios; least–most) | peak RSS (MiB) |"
echo "| --- | ---: | ---: | ---: |"
echo "| cp of the $((OUT_BYTES / 1048576)) MiB output | $c | 1.00 | — |"
echo "| devmap save --quantize fp8-block ($((IN_BYTES / 1048576)) MiB bf16 in) | $d | $r ($lo–$hi) | $((rss / 1024)) |"
rm -rf "$WORK/fp8-cp" "$WORK/fp8-src"
