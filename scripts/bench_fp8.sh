#!/usr/bin/env bash
# devmap save --dtype bfloat16 of a fine-grained FP8 checkpoint (dequantized while
# streaming) against cp of the same number of output bytes, side by side in one run,
# warm cache; peak RSS from GNU time. The checkpoint: SIZE_MB of F8_E4M3 weights
# (4096-wide, 128x128 blocks, float32 scales) made with torch, and its output is twice
# that in bfloat16. FORMAT=fp4: DeepSeek-V4's packed FP4 instead (I8 [rows, cols/2], two
# E2M1 codes a byte, an E8M0 scale per 32 values of a row); its output is four times
# the input. FORMAT=mxfp8: compressed-tensors' MXFP8 (F8_E4M3 values, a U8 E8M0
# exponent per 32 values of a row); FORMAT=fp8-group: compressed-tensors'
# `float-quantized` FP8 with the `group` strategy (a bfloat16 scale per 128 values of a
# row). Their output is twice the input.
# Usage: [RUNS=3] [FORMAT=fp8|fp4|mxfp8|fp8-group] scripts/bench_fp8.sh [SIZE_MB=512] [WORKDIR=target/bench]
# Needs a Python with torch and safetensors (DEVMAP_HF_PYTHON, else python3).
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-512}
WORK=${2:-target/bench}
RUNS=${RUNS:-3}
PY=${DEVMAP_HF_PYTHON:-python3}
need_gnu_time
build_release
FORMAT=${FORMAT:-fp8}
MODEL="$WORK/model-$FORMAT-$SIZE_MB"
OUT="$WORK/$FORMAT-bf16"
mkdir -p "$WORK"
if [ ! -d "$MODEL" ]; then
    "$PY" - "$MODEL" "$SIZE_MB" "$FORMAT" <<'PY'
import json, os, sys
import numpy as np
import torch
from safetensors.torch import save_file
folder, size_mb, fmt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(folder)
rng = np.random.default_rng(0)
rows, cols, block = 4096, 4096, 128
stored = cols // 2 if fmt == "fp4" else cols
count = max(1, size_mb * 2**20 // (rows * stored))
shard = {}
for i in range(count):
    w = rng.integers(0, 256, size=(rows, stored), dtype=np.uint8)
    name = f"model.layers.{i}.mlp.down_proj.weight"
    if fmt == "fp4":
        shard[name] = torch.from_numpy(w).view(torch.int8)
        e8m0 = rng.integers(118, 128, size=(rows, cols // 32), dtype=np.uint8)
        shard[name + "_scale_inv"] = torch.from_numpy(e8m0).view(torch.float8_e8m0fnu)
        continue
    w[(w & 0x7F) == 0x7F] = 0x38  # no NaN patterns
    shard[name] = torch.from_numpy(w).view(torch.float8_e4m3fn)
    if fmt == "mxfp8":
        shard[name[: -len("weight")] + "weight_scale"] = torch.from_numpy(
            rng.integers(118, 128, size=(rows, cols // 32), dtype=np.uint8))
        continue
    if fmt == "fp8-group":
        shard[name[: -len("weight")] + "weight_scale"] = (
            torch.from_numpy(rng.random((rows, cols // 128), dtype=np.float32)) * 0.01).to(torch.bfloat16)
        continue
    shard[name + "_scale_inv"] = torch.from_numpy(rng.random((rows // block, cols // block), dtype=np.float32))
save_file(shard, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
quant = {"quant_method": "fp8", "weight_block_size": [block, block]}
config = {"architectures": ["ToyForCausalLM"], "dtype": "bfloat16", "quantization_config": quant}
if fmt == "fp4":
    quant["scale_fmt"] = "ue8m0"
    config["expert_dtype"] = "fp4"
if fmt in ("mxfp8", "fp8-group"):
    config["quantization_config"] = {"quant_method": "compressed-tensors",
                                     "format": "mxfp8-quantized" if fmt == "mxfp8" else "float-quantized"}
with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(config, f)
PY
fi
rm -rf "$OUT"
"$DEVMAP" save "$MODEL" --out "$OUT" --dtype bfloat16 --no-fsync -q
OUT_BYTES=$(du -cb "$OUT"/*.safetensors | tail -1 | cut -f1)
prepare_save() { rm -rf "$OUT"; cat "$MODEL"/*.safetensors > /dev/null; }
prepare_cp() { rm -rf "$WORK/fp8-cp"; mkdir -p "$WORK/fp8-cp"; }
rm -rf "$WORK/fp8-src"; cp -r "$OUT" "$WORK/fp8-src"
export DEVMAP MODEL OUT WORK
run_save() { "$DEVMAP" save "$MODEL" --out "$OUT" --dtype bfloat16 --no-fsync -q; }
run_cp() { cp "$WORK/fp8-src/"*.safetensors "$WORK/fp8-cp/"; }
read -r d rss c r lo hi < <(side_by_side "$RUNS" prepare_save run_save prepare_cp run_cp)
echo "| run | seconds (median of $RUNS, alternating) | vs cp (median of the runs' ratios; least–most) | peak RSS (MiB) |"
echo "| --- | ---: | ---: | ---: |"
echo "| cp of the $((OUT_BYTES / 1048576)) MiB output | $c | 1.00 | — |"
echo "| devmap save --dtype bfloat16 ($((SIZE_MB)) MiB $FORMAT in) | $d | $r ($lo–$hi) | $((rss / 1024)) |"
rm -rf "$WORK/fp8-cp" "$WORK/fp8-src"
