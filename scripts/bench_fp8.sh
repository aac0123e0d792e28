#!/usr/bin/env bash
# devmap save --dtype bfloat16 of a fine-grained FP8 checkpoint (dequantized while
# streaming) against cp of the same number of output bytes, side by side in one run,
# warm cache; peak RSS from GNU time. The checkpoint: SIZE_MB of F8_E4M3 weights
# (4096-wide, 128x128 blocks, float32 scales) made with torch, and its output is twice
# that in bfloat16.
# Usage: [RUNS=3] scripts/bench_fp8.sh [SIZE_MB=512] [WORKDIR=target/bench]
# Needs a Python with torch and safetensors (DEVMAP_HF_PYTHON, else python3).
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-512}
WORK=${2:-target/bench}
RUNS=${RUNS:-3}
PY=${DEVMAP_HF_PYTHON:-python3}
need_gnu_time
build_release
MODEL="$WORK/model-fp8-$SIZE_MB"
OUT="$WORK/fp8-bf16"
mkdir -p "$WORK"
if [ ! -d "$MODEL" ]; then
    "$PY" - "$MODEL" "$SIZE_MB" <<'PY'
import json, os, sys
import numpy as np
import torch
from safetensors.torch import save_file
folder, size_mb = sys.argv[1], int(sys.argv[2])
os.makedirs(folder)
rng = np.random.default_rng(0)
rows, cols, block = 4096, 4096, 128
count = max(1, size_mb * 2**20 // (rows * cols))
shard = {}
for i in range(count):
    w = rng.integers(0, 256, size=(rows, cols), dtype=np.uint8)
    w[(w & 0x7F) == 0x7F] = 0x38  # no NaN patterns
    name = f"model.layers.{i}.mlp.down_proj.weight"
    shard[name] = torch.from_numpy(w).view(torch.float8_e4m3fn)
    shard[name + "_scale_inv"] = torch.from_numpy(rng.random((rows // block, cols // block), dtype=np.float32))
save_file(shard, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump({"architectures": ["ToyForCausalLM"], "dtype": "bfloat16",
               "quantization_config": {"quant_method": "fp8", "weight_block_size": [block, block]}}, f)
PY
fi
rm -rf "$OUT"
"$DEVMAP" save "$MODEL" --out "$OUT" --dtype bfloat16 --no-fsync -q
OUT_BYTES=$(du -cb "$OUT"/*.safetensors | tail -1 | cut -f1)
dq=(); cpt=(); rss=0
for _ in $(seq "$RUNS"); do
    rm -rf "$OUT" "$WORK/fp8-cp"; mkdir -p "$WORK/fp8-cp"
    read -r t m < <(timed "$DEVMAP" save "$MODEL" --out "$OUT" --dtype bfloat16 --no-fsync -q)
    dq+=("$t"); rss=$m
    read -r t _ < <(timed cp "$OUT"/model.safetensors "$WORK/fp8-cp/")
    cpt+=("$t")
done
d=$(printf '%s\n' "${dq[@]}" | median); c=$(printf '%s\n' "${cpt[@]}" | median)
echo "| run | seconds (median of $RUNS) | vs cp | peak RSS (MiB) |"
echo "| --- | ---: | ---: | ---: |"
echo "| cp of the $((OUT_BYTES / 1048576)) MiB output | $c | 1.00 | — |"
echo "| devmap save --dtype bfloat16 ($((SIZE_MB)) MiB FP8 in) | $d | $(ratio "$d" "$c") | $((rss / 1024)) |"
rm -rf "$WORK/fp8-cp"
