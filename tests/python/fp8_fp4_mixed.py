"""A fine-grained FP8 checkpoint mixing FP8 blocks with FP4-packed weights, as
DeepSeek-V4 ships (`quant_method: fp8`, `scale_fmt: ue8m0`, `expert_dtype: fp4`),
dequantized by `devmap save --dtype D` bit for bit what transformers' own
`Fp8Dequantize` computes when it loads the checkpoint with `dequantize=True`.

A tiny Llama whose attention weights are F8_E4M3 with E8M0 (`float8_e8m0fnu`) scales
per 128×128 block (one with float32 scales, as V3 stores them), and whose MLP weights
are packed FP4 (I8 `[rows, cols/2]`, two E2M1 codes a byte, the low nibble first) with
E8M0 scales per 32 values of a row. For bfloat16, float16 and float32:

- every weight devmap writes equals the parameter of the model transformers loads
  (`from_pretrained(DIR, quantization_config=FineGrainedFP8Config(dequantize=True),
  dtype=D)`), bit for bit; the scales, `quantization_config` and `expert_dtype` are not
  in the output;
- `from_pretrained(OUT)` gives that model's logits exactly;
- `verify OUT --against DIR --dtype D` is clean.

A LoRA adapter peft trained on the dequantized bfloat16 model (on FP8 attention and
FP4 MLP weights) merged by `--merge-lora` while devmap dequantizes: bit-identical with
peft's `merge_and_unload()` on the model transformers loads dequantized, verify clean.

Refused by name, nothing written: an FP4 weight whose scales do not divide it into
blocks, and a NaN (0xFF) E8M0 scale.

Usage: python fp8_fp4_mixed.py PATH/TO/devmap
"""

import json
import os
import subprocess
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, FineGrainedFP8Config, LlamaConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import saved  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
E8M0 = torch.float8_e8m0fnu


def config():
    return LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=False)


def build(work, name, edit=None):
    g = torch.Generator().manual_seed(0)
    model = AutoModelForCausalLM.from_config(config()).to(torch.bfloat16)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    for k in list(state):
        if not k.endswith("proj.weight"):
            continue
        rows, cols = state.pop(k).shape
        if ".mlp." in k:
            # Packed FP4: every code, and exponents around 2^0.
            state[k] = torch.randint(0, 256, (rows, cols // 2), generator=g, dtype=torch.uint8).view(torch.int8)
            scale = torch.randint(118, 128, (rows, cols // 32), generator=g, dtype=torch.uint8).view(E8M0)
        else:
            values = (torch.randn(rows, cols, generator=g) * 60).clamp(-448, 448)
            state[k] = values.to(torch.float8_e4m3fn)
            scale = torch.randint(112, 124, (rows // 128, cols // 128), generator=g, dtype=torch.uint8).view(E8M0)
            if k.endswith("layers.1.self_attn.o_proj.weight"):
                scale = torch.rand(rows // 128, cols // 128, generator=g) * 0.01  # V3's float32 scales
        state[k + "_scale_inv"] = scale
    if edit:
        edit(state)
    cfg = config().to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = "bfloat16"
    cfg["expert_dtype"] = "fp4"
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}
    src = os.path.join(work, name)
    os.makedirs(src)
    save_file(state, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
    json.dump(cfg, open(os.path.join(src, "config.json"), "w"))
    return src


def devmap(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True)


def main():
    exe = os.path.abspath(sys.argv[1])
    work = saved.workdir("devmap-fp8-fp4-")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    src = build(work, "mixed")
    ids = torch.tensor([[1, 5, 9, 33, 2, 17, 60, 3]])
    for name, dtype in DTYPES.items():
        ref = AutoModelForCausalLM.from_pretrained(
            src, quantization_config=FineGrainedFP8Config(dequantize=True, scale_fmt="ue8m0"), dtype=dtype).eval()
        want = {k: v.detach() for k, v in ref.state_dict().items()}
        out = os.path.join(work, f"out-{name}")
        r = devmap(exe, "save", src, "--out", out, "--dtype", name)
        assert r.returncode == 0, f"{name}: {r.stderr}"
        got = saved.tensors(out)
        assert sorted(got) == sorted(want), f"{name}: names differ: {sorted(set(got) ^ set(want))[:4]}"
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        fp4 = fp8 = 0
        for key, w in want.items():
            assert got[key].dtype == dtype and got[key].shape == w.shape, f"{name}: {key} {got[key].dtype} {tuple(got[key].shape)}"
            differ = (got[key].view(bits) != w.view(bits)).sum().item()
            assert differ == 0, f"{name}: {key} differs from transformers' Fp8Dequantize in {differ} of {w.numel()} values"
            fp4 += ".mlp." in key
            fp8 += "self_attn" in key and "proj" in key
        written = json.load(open(os.path.join(out, "config.json")))
        assert "quantization_config" not in written and "expert_dtype" not in written, written.keys()
        loaded = AutoModelForCausalLM.from_pretrained(out, dtype=dtype).eval()
        with torch.no_grad():
            assert torch.equal(loaded(ids).logits, ref(ids).logits), f"{name}: logits differ"
        v = devmap(exe, "verify", out, "--against", src, "--dtype", name, "--quiet")
        assert v.returncode == 0, f"{name}: verify --against is not clean:\n{v.stdout[-800:]}{v.stderr}"
        print(f"FP8 + FP4 → {name}: {fp8} FP8 and {fp4} FP4 weights bit for bit transformers' "
              "Fp8Dequantize, logits equal, verify clean")
    check_lora(exe, work, src)
    m = "model.layers.0.mlp.down_proj.weight"

    def uneven(state):
        state[m + "_scale_inv"] = state[m + "_scale_inv"][:, :-1].contiguous()

    def nan_scale(state):
        s = state[m + "_scale_inv"].view(torch.uint8).clone()
        s[3, 1] = 255
        state[m + "_scale_inv"] = s.view(E8M0)

    for label, edit, needle in [("scales that do not divide it", uneven, "does not divide it into blocks"),
                                ("a NaN E8M0 scale", nan_scale, "NaN")]:
        bad = build(work, label.replace(" ", "-"), edit)
        out = os.path.join(work, "refused-" + label.replace(" ", "-"))
        r = devmap(exe, "save", bad, "--out", out, "--dtype", "bfloat16")
        assert r.returncode != 0 and needle in r.stderr and m in r.stderr, f"{label}: {r.stderr}"
        assert not os.path.exists(out), f"{label}: something was written"
        print(f"{label}: refused ({needle})")
    print("fp8 + fp4: all checks passed")


def check_lora(exe, work, src):
    from peft import LoraConfig

    def load():
        return AutoModelForCausalLM.from_pretrained(
            src, quantization_config=FineGrainedFP8Config(dequantize=True, scale_fmt="ue8m0"),
            dtype=torch.bfloat16).eval()

    lora = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                      target_modules=["q_proj", "down_proj", "gate_proj"])
    adapter, ref, _ = saved.peft_merged(load, lora, work, "fp4-lora")
    out = os.path.join(work, "fp4-lora-devmap")
    r = devmap(exe, "save", src, "--out", out, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet")
    assert r.returncode == 0, f"--merge-lora into FP8 + FP4: {r.stderr}"
    ours, theirs = saved.tensors(out), saved.tensors(ref)
    assert sorted(ours) == sorted(theirs), f"names differ: {sorted(set(ours) ^ set(theirs))[:4]}"
    bad = [k for k in theirs if not torch.equal(ours[k].view(torch.int16), theirs[k].view(torch.int16))]
    assert not bad, f"--merge-lora into FP8 + FP4: {len(bad)} tensors differ from peft's merge, e.g. {bad[0]}"
    v = devmap(exe, "verify", out, "--against", src, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet")
    assert v.returncode == 0, f"--merge-lora into FP8 + FP4: verify --against:\n{v.stdout[-800:]}{v.stderr}"
    fp4 = sum(k.endswith(("down_proj.weight", "gate_proj.weight")) for k in theirs)
    print(f"LoRA merged into {fp4} dequantized FP4 and 2 FP8 weights: bit-identical with peft's "
          "merge_and_unload on transformers' dequantized model, verify clean")


if __name__ == "__main__":
    main()
