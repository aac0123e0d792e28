"""MXFP4 (gpt-oss) checkpoints dequantized by `devmap save --dtype`, against transformers.

A tiny gpt-oss is saved by transformers, then its experts weights are replaced by
MXFP4 `*_blocks` (U8 [E, out, in/32, 16], random nibbles) and `*_scales` (U8
[E, out, in/32]: the usual exponents around 2^0, and every byte 0..254 in one expert so
the subnormal and the largest powers of two are covered), with a `quantization_config`
of `quant_method: mxfp4`. For bfloat16, float16 and float32, devmap's output must be
what transformers writes when it loads the checkpoint dequantized
(`Mxfp4Config(dequantize=True)`, the model's dtype) and saves it: the same names,
dtypes and shapes, every element bit-identical (NaN by NaN), no scales and no
`quantization_config` in config.json; `from_pretrained(OUT)` loads with no missing or
unexpected key and the same logits; and each dequantized weight equals transformers'
own `convert_moe_packed_tensors` in that dtype. `devmap verify OUT --against DIR
--dtype D` must be clean.

Then a LoRA adapter made by peft on the dequantized model, on the fused experts
(`target_parameters`) and on an attention projection: `devmap save --dtype bfloat16
--merge-lora` must equal peft's `merge_and_unload()` + `save_pretrained` bit for bit,
and without a float --dtype the merge is refused.

Usage: python mxfp4_dequant.py PATH/TO/devmap
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from saved import peft_merged, tensors as read_tensors
from transformers import AutoModelForCausalLM, GptOssConfig, GptOssForCausalLM, Mxfp4Config
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
INPUT = torch.tensor([[1, 5, 9, 2, 7, 3]])


def make(work, extreme=True):
    """The MXFP4 checkpoint (from a plain gpt-oss transformers saved); with `extreme`,
    one expert holds every scale byte but NaN's."""
    torch.manual_seed(0)
    config = GptOssConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                          num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"])
    plain = os.path.join(work, "plain")
    GptOssForCausalLM(config).to(torch.bfloat16).save_pretrained(plain)
    state = load_file(os.path.join(plain, "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    packed = {}
    for name, value in state.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            experts, inp, out = value.shape
            packed[name + "_blocks"] = torch.randint(0, 256, (experts, out, inp // 32, 16), generator=g, dtype=torch.uint8)
            scales = torch.randint(120, 134, (experts, out, inp // 32), generator=g, dtype=torch.uint8)
            # Expert 0 of the first weight holds every exponent but NaN's (255).
            if extreme and name.startswith("model.layers.0.mlp.experts.gate_up_proj"):
                scales[0].view(-1)[:255] = torch.arange(255, dtype=torch.uint8)
            packed[name + "_scales"] = scales
        else:
            packed[name] = value
    folder = os.path.join(work, "mxfp4")
    os.makedirs(folder)
    save_file(packed, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(plain, "config.json")))
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"), indent=2)
    for f in os.listdir(plain):
        if f not in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(plain, f), folder)
    return folder, packed


def run(args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)}: {r.stderr}")
    return r


def same_bits(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    nan = torch.isnan(a) & torch.isnan(b)
    return bool(((a.view(view) == b.view(view)) | nan).all())


def check_lora(devmap, work):
    """peft's LoRA on the model transformers loads dequantized, merged by devmap into the
    MXFP4 experts while it dequantizes them (see the module's doc)."""
    folder, _ = make(os.path.join(work, "lora"), extreme=False)
    load = lambda: AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.bfloat16)
    merge_and_compare(devmap, work, "mxfp4", folder, load)
    # The plain gpt-oss the MXFP4 checkpoint was made from: its fused experts are
    # stored [E, in, out] too.
    plain = os.path.join(work, "lora", "plain")
    merge_and_compare(devmap, work, "plain", plain,
                      lambda: AutoModelForCausalLM.from_pretrained(plain, dtype=torch.bfloat16))


def merge_and_compare(devmap, work, label, folder, load):
    """An adapter made by peft on `load()`, merged by peft and by devmap from `folder`."""
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj"],
                        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    adapter, ref, _ = peft_merged(load, config, work, f"lora-{label}")
    out = os.path.join(work, f"lora-{label}-devmap")
    run([devmap, "save", folder, "--out", out, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet"])
    ours, theirs = read_tensors(out), read_tensors(ref)
    if sorted(ours) != sorted(theirs):
        sys.exit(f"FAIL lora: names differ: {sorted(set(ours) ^ set(theirs))}")
    changed = 0
    for k in theirs:
        want = theirs[k]
        if want.dtype == torch.float32 and ours[k].dtype == torch.bfloat16:
            want = want.to(torch.bfloat16)  # kept in float32 by transformers; --dtype casts it
        if not same_bits(ours[k], want):
            sys.exit(f"FAIL lora: {k} differs from peft's merge")
        changed += int(any(t in k for t in ("q_proj", "gate_up_proj", "down_proj")))
    loaded, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16, output_loading_info=True)
    if info["missing_keys"] or info["unexpected_keys"]:
        sys.exit(f"FAIL lora: from_pretrained(OUT): {info}")
    r = subprocess.run([devmap, "verify", out, "--against", folder, "--dtype", "bfloat16", "--merge-lora", adapter],
                       capture_output=True, text=True)
    text = r.stdout + r.stderr
    problems = [l for l in text.splitlines() if l.startswith("difference:") and "keep-in-float32" not in l]
    if problems or f"as saved from {folder}: 0 differences" not in text:
        sys.exit(f"FAIL lora {label}: verify --against: {text}")
    refused = ""
    if label == "mxfp4":
        kept = os.path.join(work, "lora-keep")
        r = subprocess.run([devmap, "save", folder, "--out", kept, "--dtype", "keep", "--merge-lora", adapter],
                           capture_output=True, text=True)
        if r.returncode == 0 or os.path.exists(kept):
            sys.exit(f"FAIL lora: --merge-lora into MXFP4 with --dtype keep must be refused: {r.stderr}")
        refused = "; refused without a float --dtype"
    print(f"ok: LoRA (target_parameters on the fused experts, and q_proj) merged into {changed} weights of a "
          f"{label} gpt-oss: bit-identical with peft's merge_and_unload + save_pretrained, verify clean{refused}")


def main(devmap):
    work = tempfile.mkdtemp(prefix="devmap-mxfp4-")
    check_lora(devmap, work)
    folder, packed = make(work)
    for name, dtype in DTYPES.items():
        ref = os.path.join(work, f"ref-{name}")
        model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=Mxfp4Config(dequantize=True), dtype=dtype)
        model.save_pretrained(ref)
        with torch.no_grad():
            ref_logits = model(INPUT).logits.float()
        out = os.path.join(work, f"out-{name}")
        run([devmap, "save", folder, "--out", out, "--dtype", name, "--quiet"])
        ours, theirs = read_tensors(out), read_tensors(ref)
        if sorted(ours) != sorted(theirs):
            sys.exit(f"FAIL {name}: names differ: only devmap {sorted(set(ours) - set(theirs))}, only transformers {sorted(set(theirs) - set(ours))}")
        kept = 0
        for k in theirs:
            if theirs[k].dtype == torch.float32 and dtype != torch.float32 and ours[k].dtype == dtype:
                # A module transformers keeps in float32 (`_keep_in_fp32_modules`); an
                # explicit --dtype casts it, and devmap says so.
                if not same_bits(ours[k], theirs[k].to(dtype)):
                    sys.exit(f"FAIL {name}: {k}: not transformers' float32 value cast to {name}")
                kept += 1
                continue
            if not same_bits(ours[k], theirs[k]):
                sys.exit(f"FAIL {name}: {k}: devmap {ours[k].dtype} {tuple(ours[k].shape)} differs from transformers' {theirs[k].dtype} {tuple(theirs[k].shape)}")
        for k in packed:
            if k.endswith("_blocks"):
                base = k[: -len("_blocks")]
                want = convert_moe_packed_tensors(packed[k], packed[base + "_scales"], dtype=dtype)
                if not same_bits(ours[base], want):
                    sys.exit(f"FAIL {name}: {base} differs from convert_moe_packed_tensors")
        config = json.load(open(os.path.join(out, "config.json")))
        if "quantization_config" in config or config.get("dtype") != name:
            sys.exit(f"FAIL {name}: config.json keeps quantization_config or says dtype {config.get('dtype')}")
        loaded, info = AutoModelForCausalLM.from_pretrained(out, dtype=dtype, output_loading_info=True)
        if info["missing_keys"] or info["unexpected_keys"]:
            sys.exit(f"FAIL {name}: from_pretrained(OUT): {info}")
        with torch.no_grad():
            logits = loaded(INPUT).logits.float()
        if not torch.equal(torch.nan_to_num(logits), torch.nan_to_num(ref_logits)):
            sys.exit(f"FAIL {name}: logits differ by {float((logits - ref_logits).abs().max())}")
        # The extreme exponents make some values infinite on purpose. In float16 the
        # modules transformers keeps in float32 are cast (the explicit --dtype), which
        # verify reports, and nothing else may be reported.
        r = subprocess.run([devmap, "verify", out, "--against", folder, "--dtype", name, "--allow-nonfinite"],
                           capture_output=True, text=True)
        text = r.stdout + r.stderr
        problems = [l for l in text.splitlines() if l.startswith("difference:") and "keep-in-float32" not in l]
        if problems or f"as saved from {folder}: 0 differences" not in text or (dtype != torch.float16 and r.returncode != 0):
            sys.exit(f"FAIL {name}: verify --against: {text}")
        print(f"ok: mxfp4 to {name}: {len(theirs)} tensors bit-identical with transformers' dequantized save"
              f"{f' ({kept} it keeps in float32 compared cast to {name})' if kept else ''}, logits equal, verify clean")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])
