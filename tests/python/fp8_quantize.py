"""`devmap save --quantize fp8-block` against transformers' own FP8 quantizer.

A tiny Llama in bfloat16 (every linear weight whole 128×128 tiles) is saved by devmap
with `--quantize fp8-block`. For every weight transformers' FP8 integration converts
(`replace_with_fp8_linear` on the model, `lm_head` kept as `get_modules_to_not_convert`
keeps it), devmap's F8_E4M3 values and float32 `weight_scale_inv` must be bit-identical
with what transformers' `Fp8Quantize` conversion op computes from the same weight; every
other tensor is written as stored. `from_pretrained(OUT)` loads it with no missing or
unexpected key (on CPU transformers dequantizes FP8 as it loads), and its logits stay
within FP8's error of the original model's; `devmap verify OUT --against SRC --quantize
fp8-block` is clean.

Usage: python fp8_quantize.py PATH/TO/devmap
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

import torch
from saved import tensors as read_tensors
from transformers import AutoModelForCausalLM, FineGrainedFP8Config, LlamaConfig
from transformers.integrations.finegrained_fp8 import FP8Linear, Fp8Quantize, replace_with_fp8_linear

IDS = torch.tensor([[1, 5, 9, 17, 33]])


def bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def main(devmap):
    work = tempfile.mkdtemp(prefix="devmap-fp8-quantize-")
    failures = []
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                         max_position_embeddings=64, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    src, out = os.path.join(work, "src"), os.path.join(work, "out")
    model.save_pretrained(src)
    r = subprocess.run([devmap, "save", src, "--out", out, "--quantize", "fp8-block", "--quiet"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL: save failed: {r.stderr}")
        sys.exit(1)

    # What transformers converts: its own replacement, on a meta copy of the model.
    quantization = FineGrainedFP8Config(weight_block_size=(128, 128))
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    replace_with_fp8_linear(meta, modules_to_not_convert=["lm_head"], quantization_config=quantization)
    converted = {name + ".weight" for name, m in meta.named_modules() if isinstance(m, FP8Linear)}

    op = Fp8Quantize(types.SimpleNamespace(quantization_config=quantization))
    ours, source = read_tensors(out), read_tensors(src)
    quantized = {k for k in source if k + "_scale_inv" in ours}
    if quantized != converted:
        failures.append(f"devmap quantized {sorted(quantized ^ converted)[:4]} unlike transformers")
    for name, value in source.items():
        if name in converted:
            want = op._quantize_one(name, value)
            for key, ref in want.items():
                got = ours.get(key)
                if got is None or got.dtype != ref.dtype or got.shape != ref.shape or not torch.equal(bits(got), bits(ref)):
                    failures.append(f"{key}: devmap {None if got is None else (got.dtype, tuple(got.shape))} "
                                    f"differs from Fp8Quantize's {ref.dtype} {tuple(ref.shape)}")
        elif not torch.equal(bits(ours[name]), bits(value)):
            failures.append(f"{name}: not written as stored")
    cfg = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    if cfg.get("quant_method") != "fp8" or cfg.get("weight_block_size") != [128, 128]:
        failures.append(f"config.json's quantization_config: {cfg}")

    loaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    if info["missing_keys"] or info["unexpected_keys"]:
        failures.append(f"from_pretrained: missing {info['missing_keys']}, unexpected {info['unexpected_keys']}")
    with torch.no_grad():
        want, got = model(IDS).logits.float(), loaded(IDS).logits.float()
    error = ((got - want).norm() / want.norm()).item()
    if not error < 0.1:
        failures.append(f"logits of the FP8 model are {error:.3f} away from the original's")
    r = subprocess.run([devmap, "verify", out, "--against", src, "--quantize", "fp8-block", "--quiet"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"verify --against: {r.stdout[-600:]} {r.stderr[-300:]}")
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        sys.exit(1)
    print(f"ok: {len(converted)} linear weights quantized to FP8 bit-identical with transformers' Fp8Quantize, "
          f"the rest as stored; from_pretrained loads it (logits within {error:.3f}); verify clean")


if __name__ == "__main__":
    main(sys.argv[1])
