"""compressed-tensors FP8 checkpoints (llm-compressor's `float-quantized` format)
dequantized by `devmap save --dtype`, against transformers with the compressed-tensors
library.

A tiny Llama's linear weights are quantized to float8_e4m3fn with a `weight_scale` per
tensor (`strategy: tensor`, shape [1]), per row (`channel`, [out, 1]) or per group of 32
values of a row (`group`, [out, in/32]), the scales stored in bfloat16 or float32, and config.json gets compressed-tensors'
`quantization_config`. For bfloat16, float16 and float32, devmap's output must be what
transformers writes after loading the checkpoint dequantized
(`CompressedTensorsConfig(dequantize=True)`, in that dtype) and saving it: the same
names and dtypes, every element bit-identical, no scales and no `quantization_config`;
`from_pretrained(OUT)` gives the same logits; `devmap verify OUT --against DIR --dtype D`
is clean. A `marlin-24` config (2:4 sparse, not dequantized) under a float --dtype
is refused, naming the format, with nothing written. A LoRA adapter made by peft on the dequantized model
merges into the dequantized weights bit-identically with peft's `merge_and_unload()` +
`save_pretrained`.

Usage: python compressed_fp8.py PATH/TO/devmap
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import save_file
from saved import peft_merged, tensors as read_tensors
from transformers import AutoModelForCausalLM, CompressedTensorsConfig, LlamaConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
IDS = torch.tensor([[1, 5, 9, 17, 33]])


GROUP = 32


def make(folder, strategy, scale_dtype, fmt="float-quantized"):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=64, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    out = {}
    for name, w in model.state_dict().items():
        if name.endswith("proj.weight"):
            wf = w.float()
            if strategy == "group":
                grouped = wf.unflatten(-1, (wf.shape[1] // GROUP, GROUP))
                scale = (grouped.abs().amax(-1) / torch.finfo(torch.float8_e4m3fn).max).to(scale_dtype)
                q = (grouped / scale.float().unsqueeze(-1)).flatten(-2)
            else:
                amax = wf.abs().max().reshape(1) if strategy == "tensor" else wf.abs().amax(dim=1, keepdim=True)
                scale = (amax / torch.finfo(torch.float8_e4m3fn).max).to(scale_dtype)
                q = wf / scale.float()
            out[name] = q.clamp(-448, 448).to(torch.float8_e4m3fn)
            out[name[: -len("weight")] + "weight_scale"] = scale
        else:
            out[name] = w.contiguous()
    os.makedirs(folder)
    save_file(out, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg.update(architectures=["LlamaForCausalLM"], dtype="bfloat16")
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"], "format": fmt, "input_activations": None, "output_activations": None,
            "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}}},
    }
    if strategy == "group":
        cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = GROUP
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def run(args):
    return subprocess.run(args, capture_output=True, text=True)


def bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def main(devmap):
    work = tempfile.mkdtemp(prefix="devmap-ct-")
    failures = []
    for strategy in ("tensor", "channel", "group"):
        for scale_dtype in (torch.bfloat16, torch.float32):
            src = os.path.join(work, f"ct-{strategy}-{str(scale_dtype)[6:]}")
            make(src, strategy, scale_dtype)
            for name, dtype in DTYPES.items():
                ref = src + f"-ref-{name}"
                model = AutoModelForCausalLM.from_pretrained(
                    src, quantization_config=CompressedTensorsConfig(dequantize=True), dtype=dtype)
                model.save_pretrained(ref)
                with torch.no_grad():
                    ref_logits = model(IDS).logits
                out = src + f"-{name}"
                r = run([devmap, "save", src, "--out", out, "--dtype", name, "--quiet"])
                if r.returncode != 0:
                    failures.append(f"{src} --dtype {name}: save failed: {r.stderr}")
                    continue
                ours, theirs = read_tensors(out), read_tensors(ref)
                case = f"{strategy} scales in {scale_dtype} to {name}"
                if sorted(ours) != sorted(theirs):
                    failures.append(f"{case}: names differ: {sorted(set(ours) ^ set(theirs))[:4]}")
                    continue
                bad = [k for k in theirs if ours[k].dtype != theirs[k].dtype or not torch.equal(bits(ours[k]), bits(theirs[k]))]
                if bad:
                    failures.append(f"{case}: {len(bad)} tensors differ from transformers', e.g. {bad[0]}")
                config = json.load(open(os.path.join(out, "config.json")))
                if "quantization_config" in config:
                    failures.append(f"{case}: config.json keeps quantization_config")
                loaded = AutoModelForCausalLM.from_pretrained(out, dtype=dtype)
                with torch.no_grad():
                    if not torch.equal(loaded(IDS).logits, ref_logits):
                        failures.append(f"{case}: logits differ")
                r = run([devmap, "verify", out, "--against", src, "--dtype", name, "--quiet"])
                if r.returncode != 0:
                    failures.append(f"{case}: verify --against: {r.stdout[-600:]}")
                if not failures:
                    print(f"ok: compressed-tensors FP8, {case}: {len(theirs)} tensors bit-identical with transformers' "
                          "dequantized save, logits equal, verify clean")
    failures += check_lora(devmap, work)
    packed = os.path.join(work, "ct-marlin")
    make(packed, "tensor", torch.bfloat16, fmt="marlin-24")
    out = packed + "-out"
    r = run([devmap, "save", packed, "--out", out, "--dtype", "bfloat16"])
    if r.returncode == 0 or "`marlin-24` format" not in r.stderr or os.path.exists(out):
        failures.append(f"marlin-24 must be refused with nothing written: {r.stderr}")
    else:
        print("ok: a marlin-24 config is refused, naming the format, and nothing is written")
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        sys.exit(1)


def check_lora(devmap, work):
    """peft's LoRA on the model transformers loads dequantized (per-row bfloat16 scales),
    merged by devmap while it dequantizes; refused without a float --dtype."""
    from peft import LoraConfig

    src = os.path.join(work, "ct-lora-base")
    make(src, "channel", torch.bfloat16)
    load = lambda: AutoModelForCausalLM.from_pretrained(
        src, quantization_config=CompressedTensorsConfig(dequantize=True), dtype=torch.bfloat16)
    lora = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "v_proj", "down_proj"])
    adapter, ref, _ = peft_merged(load, lora, work, "ct-lora")
    out = os.path.join(work, "ct-lora-devmap")
    r = run([devmap, "save", src, "--out", out, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet"])
    if r.returncode != 0:
        return [f"--merge-lora into compressed-tensors FP8: save failed: {r.stderr}"]
    ours, theirs = read_tensors(out), read_tensors(ref)
    if sorted(ours) != sorted(theirs):
        return [f"--merge-lora into compressed-tensors FP8: names differ: {sorted(set(ours) ^ set(theirs))[:4]}"]
    bad = [k for k in theirs if ours[k].dtype != theirs[k].dtype or not torch.equal(bits(ours[k]), bits(theirs[k]))]
    if bad:
        return [f"--merge-lora into compressed-tensors FP8: {len(bad)} tensors differ from peft's merge, e.g. {bad[0]}"]
    r = run([devmap, "verify", out, "--against", src, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet"])
    if r.returncode != 0:
        return [f"--merge-lora into compressed-tensors FP8: verify --against: {r.stdout[-600:]}"]
    kept = os.path.join(work, "ct-lora-keep")
    r = run([devmap, "save", src, "--out", kept, "--dtype", "keep", "--merge-lora", adapter])
    if r.returncode == 0 or os.path.exists(kept):
        return [f"--merge-lora into compressed-tensors FP8 with --dtype keep must be refused: {r.stderr}"]
    changed = sum(any(t in k for t in ("q_proj", "v_proj", "down_proj")) for k in theirs)
    print(f"ok: LoRA merged into {changed} dequantized compressed-tensors FP8 weights: bit-identical with peft's "
          "merge_and_unload + save_pretrained, verify clean; refused without a float --dtype")
    return []


if __name__ == "__main__":
    main(sys.argv[1])
