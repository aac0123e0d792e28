#!/usr/bin/env bash
# MXFP4 dequantization (gpt-oss experts) to bfloat16, side by side with `cp` of the same
# number of output bytes, warm cache; peak RSS from GNU time. The checkpoint: SIZE_MB
# of packed experts blocks (gpt-oss-120b's gate_up_proj geometry: 5,760 rows of 90
# groups per expert) with their scales; the output is four times that in bfloat16.
# Usage: [RUNS=3] scripts/bench_mxfp4.sh [SIZE_MB=256] [WORKDIR=target/bench]
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-256}
WORK=${2:-target/bench}
RUNS=${RUNS:-3}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
need_gnu_time
build_release
MODEL="$WORK/model-mxfp4-$SIZE_MB"
OUT="$WORK/mxfp4-bf16"
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
rows, groups = 5760, 90
per_expert = rows * groups * 16
experts = max(1, size_mb * 2**20 // per_expert)
blocks = rng.integers(0, 256, size=(experts, rows, groups, 16), dtype=np.uint8)
scales = rng.integers(118, 132, size=(experts, rows, groups), dtype=np.uint8)
save_file({"model.layers.0.mlp.experts.gate_up_proj_blocks": torch.from_numpy(blocks),
           "model.layers.0.mlp.experts.gate_up_proj_scales": torch.from_numpy(scales)},
          os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "dtype": "bfloat16",
               "quantization_config": {"quant_method": "mxfp4"}}, f)
PY
fi
rm -rf "$OUT"
"$DEVMAP" save "$MODEL" --out "$OUT" --dtype bfloat16 --no-fsync -q
OUT_BYTES=$(du -cb "$OUT"/*.safetensors | tail -1 | cut -f1)
prepare_save() { rm -rf "$OUT"; cat "$MODEL"/*.safetensors > /dev/null; }
prepare_cp() { rm -rf "$WORK/mxfp4-cp"; mkdir -p "$WORK/mxfp4-cp"; }
# The reference copies the output itself, so both write the same number of bytes.
rm -rf "$WORK/mxfp4-src"; cp -r "$OUT" "$WORK/mxfp4-src"
read -r d rss < <(median_run "$RUNS" prepare_save "$DEVMAP" save "$MODEL" --out "$OUT" --dtype bfloat16 --no-fsync -q)
read -r c _ < <(median_run "$RUNS" prepare_cp cp "$WORK/mxfp4-src/model.safetensors" "$WORK/mxfp4-cp/")
echo "| run | seconds (median of $RUNS) | vs cp | peak RSS (MiB) |"
echo "| --- | ---: | ---: | ---: |"
echo "| cp of the $((OUT_BYTES / 1048576)) MiB output | $c | 1.00 | — |"
echo "| devmap save --dtype bfloat16 ($SIZE_MB MiB MXFP4 in) | $d | $(ratio "$d" "$c") | $((rss / 1024)) |"
rm -rf "$WORK/mxfp4-cp" "$WORK/mxfp4-src"
