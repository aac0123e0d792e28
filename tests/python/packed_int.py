"""compressed-tensors `pack-quantized` integer checkpoints (llm-compressor's W4A16 and
W8A16) dequantized by `devmap save --dtype`, against transformers with the
compressed-tensors library.

A tiny Llama's linear weights are quantized with compressed-tensors' own
`calculate_qparams` and packed by its own `PackedQuantizationCompressor.compress` (the
code llm-compressor saves with): 4 and 8 bits, groups of 32, 64 and 128, one scale per
row (`channel`) or per tensor, symmetric and asymmetric (packed zero points), scales in
bfloat16, float16 and float32. For bfloat16, float16 and float32, devmap's output must be
what transformers writes after loading the checkpoint dequantized
(`CompressedTensorsConfig(dequantize=True)`, in that dtype — compressed-tensors'
`decompress` inside) and saving it: the same names and dtypes, every element
bit-identical, no companions and no `quantization_config`; `from_pretrained(OUT)` gives
the same logits; `devmap verify OUT --against DIR --dtype D` is clean. A LoRA adapter
made by peft on the dequantized model (the QLoRA flow) merges bit-identically with
peft's `merge_and_unload()` + `save_pretrained`.

Usage: python packed_int.py PATH/TO/devmap
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors.torch import save_file
from saved import bit_unequal, peft_merged, tensors as read_tensors
from transformers import AutoModelForCausalLM, CompressedTensorsConfig, LlamaConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
IDS = torch.tensor([[1, 5, 9, 17, 33]])
# (bits, strategy, group size, symmetric, scale dtype)
CASES = [
    (4, "group", 32, True, torch.bfloat16),
    (4, "group", 32, False, torch.bfloat16),
    (4, "group", 64, False, torch.float32),
    (4, "group", 128, True, torch.float16),
    (8, "group", 128, False, torch.bfloat16),
    (8, "channel", None, True, torch.bfloat16),
    (4, "channel", None, False, torch.float32),
    (4, "tensor", None, True, torch.bfloat16),
]


def make(folder, bits, strategy, group, symmetric, scale_dtype):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         max_position_embeddings=64, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    weights = {"num_bits": bits, "type": "int", "strategy": strategy, "symmetric": symmetric, "dynamic": False}
    if group:
        weights["group_size"] = group
    args = QuantizationArgs(**weights)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    out = {}
    for name, w in model.state_dict().items():
        if not name.endswith("proj.weight"):
            out[name] = w.contiguous()
            continue
        wf = w.float()
        if strategy == "group":
            grouped = wf.unflatten(-1, (wf.shape[1] // group, group))
            lo, hi = grouped.amin(-1), grouped.amax(-1)
        elif strategy == "channel":
            lo, hi = wf.amin(1, keepdim=True), wf.amax(1, keepdim=True)
        else:
            lo, hi = wf.min().reshape(1), wf.max().reshape(1)
        scale, zero = calculate_qparams(lo, hi, args)
        packed = PackedQuantizationCompressor.compress(
            {"weight": w, "weight_scale": scale.to(scale_dtype), "weight_zero_point": zero}, scheme)
        for key, value in packed.items():
            out[name[: -len("weight")] + key] = value.contiguous()
    os.makedirs(folder)
    save_file(out, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg.update(architectures=["LlamaForCausalLM"], dtype="bfloat16")
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "format": "pack-quantized",
                                      "input_activations": None, "output_activations": None, "weights": weights}},
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def load(src, dtype):
    return AutoModelForCausalLM.from_pretrained(
        src, quantization_config=CompressedTensorsConfig(dequantize=True), dtype=dtype)


def run(args):
    return subprocess.run(args, capture_output=True, text=True)


def main(devmap):
    work = tempfile.mkdtemp(prefix="devmap-packed-int-")
    failures = []
    for bits, strategy, group, symmetric, scale_dtype in CASES:
        label = f"int{bits}-{strategy}{group or ''}-{'sym' if symmetric else 'asym'}-{str(scale_dtype)[6:]}"
        src = os.path.join(work, label)
        make(src, bits, strategy, group, symmetric, scale_dtype)
        for name, dtype in DTYPES.items():
            case = f"{label} to {name}"
            model = load(src, dtype)
            ref = src + f"-ref-{name}"
            model.save_pretrained(ref)
            out = src + f"-{name}"
            r = run([devmap, "save", src, "--out", out, "--dtype", name, "--quiet"])
            if r.returncode != 0:
                failures.append(f"{case}: save failed: {r.stderr}")
                continue
            ours, theirs = read_tensors(out), read_tensors(ref)
            if sorted(ours) != sorted(theirs):
                failures.append(f"{case}: names differ: {sorted(set(ours) ^ set(theirs))[:4]}")
                continue
            bad = bit_unequal(ours, theirs)
            if bad:
                failures.append(f"{case}: {len(bad)} tensors differ from transformers', e.g. {bad[0]}")
                continue
            config = json.load(open(os.path.join(out, "config.json")))
            if "quantization_config" in config:
                failures.append(f"{case}: config.json keeps quantization_config")
                continue
            # The logits and verify, once per checkpoint (the bytes above are the proof).
            if name == "bfloat16":
                with torch.no_grad():
                    want = model(IDS).logits
                    got = AutoModelForCausalLM.from_pretrained(out, dtype=dtype)(IDS).logits
                if not torch.equal(got, want):
                    failures.append(f"{case}: logits differ")
                    continue
                r = run([devmap, "verify", out, "--against", src, "--dtype", name, "--quiet"])
                if r.returncode != 0:
                    failures.append(f"{case}: verify --against: {r.stdout[-600:]}")
                    continue
            print(f"ok: pack-quantized {case}: {len(theirs)} tensors bit-identical with transformers' "
                  "dequantized save" + (", logits equal, verify clean" if name == "bfloat16" else ""))
    failures += check_lora(devmap, work)
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        sys.exit(1)


def check_lora(devmap, work):
    """The QLoRA flow: peft's LoRA trained on the model transformers loads dequantized
    from an INT4 checkpoint, merged by devmap while it dequantizes."""
    from peft import LoraConfig

    src = os.path.join(work, "int4-lora-base")
    make(src, 4, "group", 32, False, torch.bfloat16)
    lora = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "v_proj", "down_proj"])
    adapter, ref, _ = peft_merged(lambda: load(src, torch.bfloat16), lora, work, "int4-lora")
    out = os.path.join(work, "int4-lora-devmap")
    r = run([devmap, "save", src, "--out", out, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet"])
    if r.returncode != 0:
        return [f"--merge-lora into pack-quantized INT4: save failed: {r.stderr}"]
    ours, theirs = read_tensors(out), read_tensors(ref)
    if sorted(ours) != sorted(theirs):
        return [f"--merge-lora into pack-quantized INT4: names differ: {sorted(set(ours) ^ set(theirs))[:4]}"]
    bad = bit_unequal(ours, theirs)
    if bad:
        return [f"--merge-lora into pack-quantized INT4: {len(bad)} tensors differ from peft's merge, e.g. {bad[0]}"]
    r = run([devmap, "verify", out, "--against", src, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet"])
    if r.returncode != 0:
        return [f"--merge-lora into pack-quantized INT4: verify --against: {r.stdout[-600:]}"]
    changed = sum(any(t in k for t in ("q_proj", "v_proj", "down_proj")) for k in theirs)
    print(f"ok: LoRA merged into {changed} dequantized INT4 weights: bit-identical with peft's "
          "merge_and_unload + save_pretrained, verify clean")
    return []


if __name__ == "__main__":
    main(sys.argv[1])
