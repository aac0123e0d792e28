#!/usr/bin/env bash
# compressed-tensors pack-quantized INT4 (groups of 128, asymmetric: W4A16 as
# llm-compressor writes it) dequantized to bfloat16, side by side with `cp` of the same
# number of output bytes, warm cache; peak RSS from GNU time. The checkpoint: SIZE_MB of
# packed weights of Llama-70B's MLP geometry (8,192 × 28,672 and back), with their
# scales and packed zero points; the output is four times that in bfloat16.
# Usage: [RUNS=3] scripts/bench_packed_int.sh [SIZE_MB=256] [WORKDIR=target/bench]
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-256}
WORK=${2:-target/bench}
RUNS=${RUNS:-3}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
need_gnu_time
build_release
MODEL="$WORK/model-int4-$SIZE_MB"
OUT="$WORK/int4-bf16"
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
shapes = [(28672, 8192), (8192, 28672)]
tensors, total, i = {}, 0, 0
while total < size_mb * 2**20:
    rows, cols = shapes[i % 2]
    name = f"model.layers.{i // 2}.mlp.{'up' if i % 2 == 0 else 'down'}_proj"
    packed = rng.integers(-2**31, 2**31, size=(rows, cols // 8), dtype=np.int64).astype(np.int32)
    groups = cols // 128
    tensors[name + ".weight_packed"] = torch.from_numpy(packed)
    tensors[name + ".weight_scale"] = (torch.rand(rows, groups) * 0.01 + 0.001).to(torch.bfloat16)
    tensors[name + ".weight_zero_point"] = torch.from_numpy(
        rng.integers(-2**31, 2**31, size=(rows // 8, groups), dtype=np.int64).astype(np.int32))
    tensors[name + ".weight_shape"] = torch.tensor([rows, cols])
    total += packed.nbytes
    i += 1
save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": False}
with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16",
               "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                       "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}}, f)
PY
fi
rm -rf "$OUT"
"$DEVMAP" save "$MODEL" --out "$OUT" --dtype bfloat16 --no-fsync -q
OUT_BYTES=$(du -cb "$OUT"/*.safetensors | tail -1 | cut -f1)
prepare_save() { rm -rf "$OUT"; cat "$MODEL"/*.safetensors > /dev/null; }
prepare_cp() { rm -rf "$WORK/int4-cp"; mkdir -p "$WORK/int4-cp"; }
# The reference copies the output itself, so both write the same number of bytes.
rm -rf "$WORK/int4-src"; cp -r "$OUT" "$WORK/int4-src"
read -r d rss < <(median_run "$RUNS" prepare_save "$DEVMAP" save "$MODEL" --out "$OUT" --dtype bfloat16 --no-fsync -q)
read -r c _ < <(median_run "$RUNS" prepare_cp cp "$WORK/int4-src/"*.safetensors "$WORK/int4-cp/")
echo "| run | seconds (median of $RUNS) | vs cp | peak RSS (MiB) |"
echo "| --- | ---: | ---: | ---: |"
echo "| cp of the $((OUT_BYTES / 1048576)) MiB output | $c | 1.00 | — |"
echo "| devmap save --dtype bfloat16 ($SIZE_MB MiB INT4 in) | $d | $(ratio "$d" "$c") | $((rss / 1024)) |"
rm -rf "$WORK/int4-cp" "$WORK/int4-src"
