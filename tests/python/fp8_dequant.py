"""Fine-grained FP8 checkpoints dequantized by `devmap save --dtype`, against torch and
transformers.

A tiny Llama's linear weights are quantized block-wise with torch (float8_e4m3fn, one
layer's in float8_e5m2), with `weight_scale_inv` per block, and config.json gets a
`quantization_config` (`quant_method: fp8`). Twice: blocks that divide every weight,
and blocks that do not (the last block of a row or column is partial). `devmap save
--dtype bfloat16|float16|float32` must write, for every weight, exactly
`(f32(W) * s[i // bm, j // bn]).to(dtype)` (DeepSeek's formula, in torch); where the
blocks divide evenly, exactly what transformers' own `Fp8Dequantize` gives; the scales
and `quantization_config` left out, and `from_pretrained(OUT)` loading with no missing
or unexpected key and the logits of the model whose weights are torch's dequantized
ones. `devmap verify OUT` (transformers' expectations) and `--against` must be clean.

Usage: python fp8_dequant.py PATH/TO/devmap
"""

from saved import workdir
import json
import os
import subprocess
import sys

import torch
from safetensors.torch import save_file
from saved import peft_merged, tensors as read_tensors
from peft import LoraConfig
from transformers import AutoModelForCausalLM, FineGrainedFP8Config, LlamaConfig
from transformers.integrations.finegrained_fp8 import Fp8Dequantize

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def quantize(w, block, fp8):
    """W as fp8 and its float32 scale_inv per block (amax / fp8 max), as DeepSeek's
    and transformers' quantizers make them."""
    m, n = w.shape
    bm, bn = block
    sr, sc = -(-m // bm), -(-n // bn)
    finfo = torch.finfo(fp8)
    q = torch.empty(m, n, dtype=fp8)
    s = torch.empty(sr, sc, dtype=torch.float32)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
            scale = blk.abs().max().clamp(min=1e-12) / finfo.max
            s[i, j] = scale
            q[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn] = (blk / scale).clamp(finfo.min, finfo.max).to(fp8)
    return q, s


def reference(q, s, block, dtype):
    """DeepSeek's formula: each element times its block's scale, in float32."""
    m, n = q.shape
    bm, bn = block
    full = s.repeat_interleave(bm, 0)[:m].repeat_interleave(bn, 1)[:, :n]
    return (q.to(torch.float32) * full).to(dtype)


def make(folder, block, hidden, intermediate):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=hidden // 4, max_position_embeddings=64, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    out, quantized = {}, {}
    for name, w in state.items():
        if name.endswith("proj.weight"):
            fp8 = torch.float8_e5m2 if ".layers.1.mlp." in name else torch.float8_e4m3fn
            q, s = quantize(w.to(torch.float32), block, fp8)
            out[name], out[name + "_scale_inv"] = q, s
            quantized[name] = (q, s)
        else:
            out[name] = w
    os.makedirs(folder)
    save_file(out, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    config_dict = config.to_dict()
    config_dict.update(architectures=["LlamaForCausalLM"], dtype="bfloat16",
                       quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic",
                                            "weight_block_size": list(block), "fmt": "e4m3"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config_dict, f, indent=2)
    return state, quantized


def run(args):
    return subprocess.run(args, capture_output=True, text=True)


def bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def check(devmap, work, block, hidden, intermediate, divides):
    src = os.path.join(work, f"fp8-{block[0]}x{block[1]}-{hidden}")
    state, quantized = make(src, block, hidden, intermediate)
    failures = []
    for dtype_name, dtype in DTYPES.items():
        out = src + f"-{dtype_name}"
        r = run([devmap, "save", src, "--out", out, "--dtype", dtype_name])
        if r.returncode != 0:
            return [f"{src} --dtype {dtype_name}: save failed: {r.stderr}"]
        saved = read_tensors(out)
        for name, (q, s) in quantized.items():
            want = reference(q, s, block, dtype)
            got = saved.get(name)
            if got is None or got.dtype != dtype or not torch.equal(bits(got), bits(want)):
                failures.append(f"{name} --dtype {dtype_name}: differs from the reference formula")
                continue
            if divides:
                theirs = Fp8Dequantize(None)._dequantize_one(q, s, output_dtype=dtype)
                if not torch.equal(bits(got), bits(theirs)):
                    failures.append(f"{name} --dtype {dtype_name}: differs from transformers' Fp8Dequantize")
        stale = [n for n in saved if n.endswith("_scale_inv")]
        if stale:
            failures.append(f"--dtype {dtype_name}: scales written: {stale[:3]}")
        with open(os.path.join(out, "config.json")) as f:
            written = json.load(f)
        if "quantization_config" in written:
            failures.append(f"--dtype {dtype_name}: config.json keeps quantization_config")
        model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
        if info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]:
            failures.append(f"--dtype {dtype_name}: from_pretrained reports {info}")
        # The model torch's dequantized weights make: same logits.
        reference_model = AutoModelForCausalLM.from_config(LlamaConfig.from_pretrained(out)).to(dtype)
        ref_state = dict(state)
        for name, (q, s) in quantized.items():
            ref_state[name] = reference(q, s, block, dtype)
        reference_model.load_state_dict({k: v.to(dtype) for k, v in ref_state.items()})
        ids = torch.tensor([[1, 5, 9, 17, 33]])
        with torch.no_grad():
            if not torch.equal(model.to(dtype)(ids).logits, reference_model(ids).logits):
                failures.append(f"--dtype {dtype_name}: logits differ from the dequantized reference")
        r = run([devmap, "verify", out, "--against", src, "--dtype", dtype_name, "--quiet"])
        if r.returncode != 0:
            failures.append(f"--dtype {dtype_name}: verify --against: {r.stdout[-600:]}")
        if not failures:
            print(f"ok: {len(quantized)} FP8 weights, {block[0]}x{block[1]} blocks, hidden {hidden}, "
                  f"--dtype {dtype_name}: bit-exact" + (" (and with transformers' Fp8Dequantize)" if divides else ""))
    # The quantized source itself: its scales are the FP8 layers' own, not unexpected.
    r = run([devmap, "verify", src, "--quiet"])
    if r.returncode != 0:
        failures.append(f"verify of the FP8 checkpoint itself: {r.stdout[-600:]}")
    # Copied as stored under auto and keep.
    for choice in ("auto", "keep"):
        out = src + f"-{choice}"
        r = run([devmap, "save", src, "--out", out, "--dtype", choice])
        saved = read_tensors(out)
        if r.returncode != 0 or not all(saved[n].dtype == q.dtype for n, (q, _) in quantized.items()) \
                or not any(n.endswith("_scale_inv") for n in saved):
            failures.append(f"--dtype {choice}: the quantized checkpoint is not copied as stored")
    return failures


def check_lora(devmap, work):
    """A LoRA adapter trained on the dequantized model (peft over what transformers loads
    with `FineGrainedFP8Config(dequantize=True)`), merged: devmap's `--dtype bfloat16
    --merge-lora` must equal peft's `merge_and_unload()` + `save_pretrained` bit for
    bit; without a float --dtype the merge is refused."""
    src = os.path.join(work, "fp8-lora-base")
    make(src, (16, 16), 64, 96)
    load = lambda: AutoModelForCausalLM.from_pretrained(
        src, quantization_config=FineGrainedFP8Config(dequantize=True), dtype=torch.bfloat16)
    lora = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "v_proj", "down_proj"])
    adapter, ref, merged = peft_merged(load, lora, work, "fp8-lora")
    ids = torch.tensor([[1, 5, 9, 17, 33]])
    with torch.no_grad():
        ref_logits = merged(ids).logits
    out = os.path.join(work, "fp8-lora-devmap")
    r = run([devmap, "save", src, "--out", out, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet"])
    if r.returncode != 0:
        return [f"--merge-lora into FP8: save failed: {r.stderr}"]
    ours, theirs = read_tensors(out), read_tensors(ref)
    failures = []
    if sorted(ours) != sorted(theirs):
        failures.append(f"--merge-lora into FP8: names differ: {sorted(set(ours) ^ set(theirs))}")
    changed = 0
    for k in theirs:
        if k in ours and not torch.equal(bits(ours[k]), bits(theirs[k])):
            failures.append(f"--merge-lora into FP8: {k} differs from peft's merge")
        changed += int(any(t in k for t in ("q_proj", "v_proj", "down_proj")))
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    with torch.no_grad():
        if not torch.equal(model(ids).logits, ref_logits):
            failures.append("--merge-lora into FP8: logits differ from peft's merged model")
    r = run([devmap, "verify", out, "--against", src, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet"])
    if r.returncode != 0:
        failures.append(f"--merge-lora into FP8: verify --against: {r.stdout[-600:]}")
    kept = os.path.join(work, "fp8-lora-keep")
    r = run([devmap, "save", src, "--out", kept, "--dtype", "keep", "--merge-lora", adapter])
    if r.returncode == 0 or "the merge works on the dequantized weight" not in r.stderr or os.path.exists(kept):
        failures.append(f"--merge-lora into FP8 with --dtype keep must be refused: {r.stderr}")
    if not failures:
        print(f"ok: LoRA merged into {changed} dequantized FP8 weights (one layer E5M2): bit-identical with peft's "
              "merge_and_unload + save_pretrained, logits equal, verify clean; refused without a float --dtype")
    return failures


def main(devmap):
    work = workdir(prefix="devmap-fp8-")
    failures = []
    failures += check(devmap, work, (16, 16), 64, 96, True)
    failures += check(devmap, work, (16, 32), 40, 72, False)
    failures += check_lora(devmap, work)
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
