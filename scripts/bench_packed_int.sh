#!/usr/bin/env bash
# compressed-tensors packed 4-bit weights dequantized to bfloat16, side by side with `cp`
# of the same number of output bytes, warm cache; peak RSS from GNU time. FORMAT=int4
# (the default): pack-quantized INT4 in groups of 128 with packed zero points (W4A16 as
# llm-compressor writes it); FORMAT=nvfp4: NVFP4 (FP4 values, an F8_E4M3 scale per 16,
# a global scale); FORMAT=modelopt: the same values in ModelOpt's layout (`M.weight`,
# `weight_scale`, `weight_scale_2`); FORMAT=gptq / FORMAT=awq: GPTQ (v1, groups of 128, g_idx) and AWQ
# GEMM 4-bit, stored transposed; FORMAT=gptq-act: GPTQ with desc_act (g_idx of a
# random input order); FORMAT=gptq8: GPTQ at 8 bits (four values a word); FORMAT=gptq8-act:
# GPTQ at 8 bits with desc_act; FORMAT=int4-act: the int4 checkpoint in activation order
# (`actorder: group`, a weight_g_idx of a random column order). The checkpoint: SIZE_MB of packed weights of
# Llama-70B's MLP geometry (8,192 × 28,672 and back); the output is four times that in
# bfloat16.
# Usage: [RUNS=3] [FORMAT=int4|int4-act|nvfp4|modelopt|gptq|gptq8|gptq-act|gptq8-act|awq] scripts/bench_packed_int.sh [SIZE_MB=256] [WORKDIR=target/bench]
source "$(dirname "$0")/bench_lib.sh"
SIZE_MB=${1:-256}
WORK=${2:-target/bench}
RUNS=${RUNS:-3}
PY=${DEVMAP_HF_PYTHON:-$HOME/.cache/devmap/venv-hf/bin/python}
need_gnu_time
build_release
FORMAT=${FORMAT:-int4}
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
shapes = [(28672, 8192), (8192, 28672)]
tensors, total, i = {}, 0, 0
while total < size_mb * 2**20:
    rows, cols = shapes[i % 2]
    name = f"model.layers.{i // 2}.mlp.{'up' if i % 2 == 0 else 'down'}_proj"
    if fmt in ("gptq", "gptq8", "gptq-act", "gptq8-act", "awq"):
        # The weight [rows=out, cols=in] stored transposed: GPTQ packs down the input
        # rows ([in/8, out]; [in/4, out] at 8 bits), AWQ along the output columns
        # ([in, out/8]).
        per = 4 if fmt.startswith("gptq8") else 8
        shape = (cols, rows // 8) if fmt == "awq" else (cols // per, rows)
        packed = rng.integers(-2**31, 2**31, size=shape, dtype=np.int64).astype(np.int32)
        groups = cols // 128
        tensors[name + ".qweight"] = torch.from_numpy(packed)
        tensors[name + ".qzeros"] = torch.from_numpy(
            rng.integers(-2**31, 2**31, size=(groups, rows // per), dtype=np.int64).astype(np.int32))
        tensors[name + ".scales"] = (torch.rand(groups, rows) * 0.01 + 0.001).to(torch.float16)
        if fmt in ("gptq", "gptq8"):
            tensors[name + ".g_idx"] = torch.arange(cols, dtype=torch.int32) // 128
        if fmt in ("gptq-act", "gptq8-act"):
            # desc_act: inputs quantized in a permuted order, each input's group its
            # place in that order // 128.
            order = torch.from_numpy(rng.permutation(cols))
            tensors[name + ".g_idx"] = (torch.argsort(order) // 128).to(torch.int32)
    elif fmt in ("nvfp4", "modelopt"):
        packed = rng.integers(0, 256, size=(rows, cols // 2), dtype=np.uint8)
        scales = (torch.rand(rows, cols // 16) * 400 + 1).to(torch.float8_e4m3fn)
        if fmt == "modelopt":
            tensors[name + ".weight"] = torch.from_numpy(packed)
            tensors[name + ".weight_scale"] = scales
            tensors[name + ".weight_scale_2"] = torch.tensor(0.0005)
        else:
            tensors[name + ".weight_packed"] = torch.from_numpy(packed)
            tensors[name + ".weight_scale"] = scales
            tensors[name + ".weight_global_scale"] = torch.tensor([2000.0])
    else:
        packed = rng.integers(-2**31, 2**31, size=(rows, cols // 8), dtype=np.int64).astype(np.int32)
        groups = cols // 128
        tensors[name + ".weight_packed"] = torch.from_numpy(packed)
        tensors[name + ".weight_scale"] = (torch.rand(rows, groups) * 0.01 + 0.001).to(torch.bfloat16)
        tensors[name + ".weight_zero_point"] = torch.from_numpy(
            rng.integers(-2**31, 2**31, size=(rows // 8, groups), dtype=np.int64).astype(np.int32))
        tensors[name + ".weight_shape"] = torch.tensor([rows, cols])
        if fmt == "int4-act":
            order = torch.from_numpy(rng.permutation(cols))
            tensors[name + ".weight_g_idx"] = (torch.argsort(order) // 128).to(torch.int32)
    total += packed.nbytes
    i += 1
save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": False}
if fmt == "int4-act":
    weights["actorder"] = "group"
quantization = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}
if fmt == "nvfp4":
    quantization = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}
if fmt == "modelopt":
    quantization = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
if fmt in ("gptq", "gptq8", "gptq-act", "gptq8-act"):
    quantization = {"quant_method": "gptq", "bits": 8 if fmt.startswith("gptq8") else 4, "group_size": 128, "desc_act": fmt.endswith("-act"),
                    "sym": False, "checkpoint_format": "gptq"}
if fmt == "awq":
    quantization = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                    "version": "gemm"}
with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16",
               "quantization_config": quantization}, f)
PY
fi
rm -rf "$OUT"
"$DEVMAP" save "$MODEL" --out "$OUT" --dtype bfloat16 --no-fsync -q
OUT_BYTES=$(du -cb "$OUT"/*.safetensors | tail -1 | cut -f1)
# Each run starts with the input in the page cache and no dirty pages of the run before
# (`sync`): otherwise the kernel's writeback of the last run's 1.3 GB lands in
# whichever run comes next, devmap's or cp's, and the ratios measure that.
prepare_save() { rm -rf "$OUT"; cat "$MODEL"/*.safetensors > /dev/null; sync; }
prepare_cp() { rm -rf "$WORK/$FORMAT-cp"; mkdir -p "$WORK/$FORMAT-cp"; sync; }
# The reference copies the output itself, so both write the same number of bytes.
rm -rf "$WORK/$FORMAT-src"; cp -r "$OUT" "$WORK/$FORMAT-src"
export DEVMAP MODEL OUT WORK FORMAT
run_save() { "$DEVMAP" save "$MODEL" --out "$OUT" --dtype bfloat16 --no-fsync -q; }
run_cp() { cp "$WORK/$FORMAT-src/"*.safetensors "$WORK/$FORMAT-cp/"; }
read -r d rss c r lo hi < <(side_by_side "$RUNS" prepare_save run_save prepare_cp run_cp)
echo "| run | seconds (median of $RUNS, alternating) | vs cp (median of the runs' ratios; least–most) | peak RSS (MiB) |"
echo "| --- | ---: | ---: | ---: |"
echo "| cp of the $((OUT_BYTES / 1048576)) MiB output | $c | 1.00 | — |"
echo "| devmap save --dtype bfloat16 ($SIZE_MB MiB $FORMAT in) | $d | $r ($lo–$hi) | $((rss / 1024)) |"
rm -rf "$WORK/$FORMAT-cp" "$WORK/$FORMAT-src"
