"""compressed-tensors `pack-quantized` checkpoints in activation order (`actorder: group`,
each module's `weight_g_idx` naming its columns' groups: llm-compressor's GPTQ W4A16
releases before compressed-tensors 0.19) dequantized by `devmap save --dtype`, against
compressed-tensors 0.18.0's own `PackedQuantizationCompressor.decompress`.

Why that release: compressed-tensors 0.19 removed activation-order groups (its config
validator refuses `actorder: group`), so the installed 0.20.1 cannot read these
checkpoints at all. 0.18.0 is the last release that does; `.ci/run` installs it apart
(`pip install --no-deps --target`), and this script puts it first on `sys.path`. And why
not transformers: transformers 5.25 with compressed-tensors 0.18.0 loads such a
checkpoint but leaves `weight_g_idx` unread (its load report lists it UNEXPECTED) and
dequantizes the columns in order; the script prints how many weights that changes.

A tiny Llama's linear weights are quantized in a random activation order (GPTQ's: the
columns sorted by a permutation, cut into groups of `group_size`, `g_idx[c]` the group of
column c) with compressed-tensors' own `calculate_qparams`, and packed by 0.18.0's own
`PackedQuantizationCompressor.compress` (which quantizes through `g_idx`). For bfloat16,
float16 and float32, devmap's output must be the reference's `decompress` of every module
converted to that dtype: the same names, every element bit-identical, no companions and
no `quantization_config`; `from_pretrained(OUT)` gives the logits of the same Llama holding
the reference's weights; `devmap verify OUT --against SRC` is clean. A LoRA adapter made by
peft on that model merges bit-identically with peft's `merge_and_unload()`.

Usage: python packed_int_actorder.py PATH/TO/devmap
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

SIDE = os.environ.get(
    "DEVMAP_CT_ACTORDER", os.path.expanduser("~/.cache/devmap/compressed-tensors-0.18.0"))
if not os.path.isdir(os.path.join(SIDE, "compressed_tensors")):
    sys.exit(f"compressed-tensors 0.18.0 is not installed at {SIDE}: run .ci/run")
sys.path.insert(0, SIDE)

import compressed_tensors  # noqa: E402
import torch  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from saved import bit_unequal, peft_merged, tensors as read_tensors  # noqa: E402
from transformers import AutoModelForCausalLM, CompressedTensorsConfig, LlamaConfig  # noqa: E402

assert compressed_tensors.__version__ == "0.18.0", compressed_tensors.__version__

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
IDS = torch.tensor([[1, 5, 9, 17, 33]])
# (bits, group size, symmetric, scale dtype)
CASES = [
    (4, 32, False, torch.bfloat16),
    (4, 128, True, torch.float16),
    (8, 64, False, torch.bfloat16),
    (4, 64, True, torch.float32),
]
COMPANIONS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx", "weight_shape")


def llama():
    return LlamaConfig(vocab_size=96, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                       max_position_embeddings=64, tie_word_embeddings=False)


def make(folder, bits, group, symmetric, scale_dtype):
    """The checkpoint, and each module's scheme for the reference."""
    torch.manual_seed(0)
    config = llama()
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    weights = {"num_bits": bits, "type": "int", "strategy": "group", "group_size": group,
               "symmetric": symmetric, "dynamic": False, "actorder": "group"}
    args = QuantizationArgs(**weights)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    out = {}
    for name, w in model.state_dict().items():
        if not name.endswith("proj.weight"):
            out[name] = w.contiguous()
            continue
        cols = w.shape[1]
        # GPTQ's activation order: the columns taken in the order `perm`, `g_idx` the
        # group each lands in.
        perm = torch.randperm(cols)
        g_idx = torch.empty(cols, dtype=torch.int32)
        g_idx[perm] = (torch.arange(cols) // group).to(torch.int32)
        grouped = w.float()[:, perm].unflatten(-1, (cols // group, group))
        scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
        packed = PackedQuantizationCompressor.compress(
            {"weight": w, "weight_scale": scale.to(scale_dtype), "weight_zero_point": zero,
             "weight_g_idx": g_idx}, scheme)
        assert torch.equal(packed["weight_g_idx"], g_idx), "the compressor keeps g_idx"
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
    return scheme


def reference(src, scheme, dtype):
    """compressed-tensors 0.18.0's `decompress` of each module, in `dtype`."""
    stored = load_file(os.path.join(src, "model.safetensors"))
    modules = {k[: -len(".weight_packed")] for k in stored if k.endswith(".weight_packed")}
    out = {}
    for m in sorted(modules):
        part = {c: stored[f"{m}.{c}"] for c in COMPANIONS if f"{m}.{c}" in stored}
        out[f"{m}.weight"] = PackedQuantizationCompressor.decompress(part, scheme)["weight"].to(dtype)
    for k, v in stored.items():
        if not any(k == f"{m}.{c}" for m in modules for c in COMPANIONS):
            out[k] = v.to(dtype)
    return out


def model_holding(weights, dtype, folder):
    """The Llama holding `weights`, loaded by `from_pretrained` from `folder` (written
    here: the weights and a config without `quantization_config`)."""
    os.makedirs(folder, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})
    llama().save_pretrained(folder)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def run(args):
    return subprocess.run(args, capture_output=True, text=True)


def main(devmap):
    work = tempfile.mkdtemp(prefix="devmap-packed-actorder-")
    failures = []
    for bits, group, symmetric, scale_dtype in CASES:
        label = f"int{bits}-g{group}-{'sym' if symmetric else 'asym'}-{str(scale_dtype)[6:]}-actorder"
        src = os.path.join(work, label)
        scheme = make(src, bits, group, symmetric, scale_dtype)
        for name, dtype in DTYPES.items():
            case = f"{label} to {name}"
            theirs = reference(src, scheme, dtype)
            out = src + f"-{name}"
            r = run([devmap, "save", src, "--out", out, "--dtype", name, "--quiet"])
            if r.returncode != 0:
                failures.append(f"{case}: save failed: {r.stderr}")
                continue
            ours = read_tensors(out)
            if sorted(ours) != sorted(theirs):
                failures.append(f"{case}: names differ: {sorted(set(ours) ^ set(theirs))[:4]}")
                continue
            bad = bit_unequal(ours, theirs)
            if bad:
                failures.append(f"{case}: {len(bad)} tensors differ from compressed-tensors' decompress, e.g. {bad[0]}")
                continue
            if "quantization_config" in json.load(open(os.path.join(out, "config.json"))):
                failures.append(f"{case}: config.json keeps quantization_config")
                continue
            if name == "bfloat16":
                with torch.no_grad():
                    want = model_holding(theirs, dtype, src + "-reference")(IDS).logits
                    got = AutoModelForCausalLM.from_pretrained(out, dtype=dtype)(IDS).logits
                if not torch.equal(got, want):
                    failures.append(f"{case}: logits differ")
                    continue
                r = run([devmap, "verify", out, "--against", src, "--dtype", name, "--quiet"])
                if r.returncode != 0:
                    failures.append(f"{case}: verify --against: {r.stdout[-600:]}")
                    continue
            print(f"ok: pack-quantized {case}: {len(theirs)} tensors bit-identical with compressed-tensors "
                  "0.18.0's decompress" + (", logits equal, verify clean" if name == "bfloat16" else ""))
    transformers_note(work)
    failures += check_lora(devmap, work)
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        sys.exit(1)


def transformers_note(work):
    """What transformers 5.25 makes of such a checkpoint with compressed-tensors 0.18.0:
    printed, not asserted (it is transformers' behaviour, not devmap's)."""
    src = os.path.join(work, "int4-g32-asym-bfloat16-actorder")
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", strategy="group", group_size=32, symmetric=False, actorder="group"))
    theirs = reference(src, scheme, torch.bfloat16)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            src, quantization_config=CompressedTensorsConfig(dequantize=True), dtype=torch.bfloat16).state_dict()
    except Exception as e:  # noqa: BLE001 - a note either way
        print(f"note: transformers with compressed-tensors 0.18.0 does not load it: {type(e).__name__}: {e}"[:300])
        return
    weights = [k for k in theirs if k.endswith("proj.weight")]
    differ = sum(not torch.equal(loaded[k], theirs[k]) for k in weights)
    print(f"note: transformers with compressed-tensors 0.18.0 loads it with {differ} of {len(weights)} "
          "weights unlike compressed-tensors' own decompress (weight_g_idx left unread)")


def check_lora(devmap, work):
    """The QLoRA flow on an activation-order base: peft's LoRA made on the model holding
    the reference's dequantized weights, merged by devmap while it dequantizes."""
    from peft import LoraConfig

    src = os.path.join(work, "int4-g32-asym-bfloat16-actorder")
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", strategy="group", group_size=32, symmetric=False, actorder="group"))
    weights = reference(src, scheme, torch.bfloat16)
    lora = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "v_proj", "down_proj"])
    folder = os.path.join(work, "actorder-lora-base")
    adapter, ref, _ = peft_merged(lambda: model_holding(weights, torch.bfloat16, folder), lora, work, "actorder-lora")
    out = os.path.join(work, "actorder-lora-devmap")
    r = run([devmap, "save", src, "--out", out, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet"])
    if r.returncode != 0:
        return [f"--merge-lora into activation-order INT4: save failed: {r.stderr}"]
    ours, theirs = read_tensors(out), read_tensors(ref)
    if sorted(ours) != sorted(theirs):
        return [f"--merge-lora into activation-order INT4: names differ: {sorted(set(ours) ^ set(theirs))[:4]}"]
    bad = bit_unequal(ours, theirs)
    if bad:
        return [f"--merge-lora into activation-order INT4: {len(bad)} tensors differ from peft's merge, e.g. {bad[0]}"]
    changed = sum(any(t in k for t in ("q_proj", "v_proj", "down_proj")) for k in theirs)
    print(f"ok: LoRA merged into {changed} dequantized activation-order INT4 weights: bit-identical with peft's "
          "merge_and_unload + save_pretrained")
    return []


if __name__ == "__main__":
    main(sys.argv[1])
