"""compressed-tensors NVFP4 (`nvfp4-pack-quantized`) and MXFP8 (`mxfp8-quantized`)
checkpoints dequantized by `devmap save --dtype`, against transformers with the
compressed-tensors library.

A tiny Llama's linear weights are quantized with compressed-tensors' presets
(`NVFP4A16`: FP4 E2M1 values, an F8_E4M3 scale per 16 and a float32 global scale;
`MXFP8A16`: F8_E4M3 values with an E8M0 exponent per 32), their scales computed by its
own `calculate_qparams` / `generate_gparam` and the weights packed by its own
`NVFP4PackedCompressor` / `MXFP8QuantizationCompressor` (what llm-compressor saves with).
For bfloat16, float16 and float32, devmap's output must be what transformers writes
after loading the checkpoint dequantized (`CompressedTensorsConfig(dequantize=True)`, in
that dtype): the same names and dtypes, every element bit-identical, no scales and no
`quantization_config`; `from_pretrained(OUT)` gives the same logits; `devmap verify OUT
--against DIR` is clean. A LoRA adapter made by peft on the dequantized NVFP4 model merges
bit-identically with peft's `merge_and_unload()` + `save_pretrained`.

Usage: python nvfp4_mxfp8.py PATH/TO/devmap
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.quantization import preset_name_to_scheme
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
from safetensors.torch import save_file
from saved import bit_unequal, peft_merged, tensors as read_tensors
from transformers import AutoModelForCausalLM, CompressedTensorsConfig, LlamaConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
IDS = torch.tensor([[1, 5, 9, 17, 33]])
FORMATS = {
    "NVFP4A16": ("nvfp4-pack-quantized", NVFP4PackedCompressor),
    "MXFP8A16": ("mxfp8-quantized", MXFP8QuantizationCompressor),
}


def make(folder, preset):
    fmt, compressor = FORMATS[preset]
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         max_position_embeddings=64, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    args = scheme.weights
    out = {}
    for name, w in model.state_dict().items():
        if not name.endswith("proj.weight"):
            out[name] = w.contiguous()
            continue
        groups = w.float().unflatten(-1, (w.shape[1] // args.group_size, args.group_size))
        state = {"weight": w}
        global_scale = None
        if preset.startswith("NVFP4"):
            global_scale = generate_gparam(w.float().min(), w.float().max())
            state["weight_global_scale"] = global_scale
        state["weight_scale"], _ = calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=global_scale)
        for key, value in compressor.compress(state, scheme).items():
            out[name[: -len("weight")] + key] = value.contiguous()
    os.makedirs(folder)
    save_file(out, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg.update(architectures=["LlamaForCausalLM"], dtype="bfloat16")
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "format": fmt, "input_activations": None,
                                      "output_activations": None, "weights": json.loads(args.model_dump_json())}},
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def load(src, dtype):
    return AutoModelForCausalLM.from_pretrained(
        src, quantization_config=CompressedTensorsConfig(dequantize=True), dtype=dtype)


def run(args):
    return subprocess.run(args, capture_output=True, text=True)


def main(devmap):
    work = tempfile.mkdtemp(prefix="devmap-nvfp4-mxfp8-")
    failures = []
    for preset, (fmt, _) in FORMATS.items():
        src = os.path.join(work, preset)
        make(src, preset)
        for name, dtype in DTYPES.items():
            case = f"{fmt} to {name}"
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
            if "quantization_config" in json.load(open(os.path.join(out, "config.json"))):
                failures.append(f"{case}: config.json keeps quantization_config")
                continue
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
            print(f"ok: {case}: {len(theirs)} tensors bit-identical with transformers' dequantized save"
                  + (", logits equal, verify clean" if name == "bfloat16" else ""))
    failures += check_lora(devmap, work)
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        sys.exit(1)


def check_lora(devmap, work):
    """peft's LoRA on the model transformers loads dequantized from NVFP4, merged by
    devmap while it dequantizes."""
    from peft import LoraConfig

    src = os.path.join(work, "nvfp4-lora-base")
    make(src, "NVFP4A16")
    lora = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "v_proj", "down_proj"])
    adapter, ref, _ = peft_merged(lambda: load(src, torch.bfloat16), lora, work, "nvfp4-lora")
    out = os.path.join(work, "nvfp4-lora-devmap")
    r = run([devmap, "save", src, "--out", out, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet"])
    if r.returncode != 0:
        return [f"--merge-lora into NVFP4: save failed: {r.stderr}"]
    ours, theirs = read_tensors(out), read_tensors(ref)
    if sorted(ours) != sorted(theirs):
        return [f"--merge-lora into NVFP4: names differ: {sorted(set(ours) ^ set(theirs))[:4]}"]
    bad = bit_unequal(ours, theirs)
    if bad:
        return [f"--merge-lora into NVFP4: {len(bad)} tensors differ from peft's merge, e.g. {bad[0]}"]
    r = run([devmap, "verify", out, "--against", src, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet"])
    if r.returncode != 0:
        return [f"--merge-lora into NVFP4: verify --against: {r.stdout[-600:]}"]
    changed = sum(any(t in k for t in ("q_proj", "v_proj", "down_proj")) for k in theirs)
    print(f"ok: LoRA merged into {changed} dequantized NVFP4 weights: bit-identical with peft's "
          "merge_and_unload + save_pretrained, verify clean")
    return []


if __name__ == "__main__":
    main(sys.argv[1])
