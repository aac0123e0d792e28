"""NVIDIA ModelOpt NVFP4 checkpoints (`quant_method: modelopt`, `quant_algo: NVFP4`)
dequantized by `devmap save --dtype D`, bit for bit what ModelOpt computes.

A tiny Llama's linear layers are quantized by ModelOpt's own `NVFP4QTensor.quantize`
(nvidia-modelopt 0.47.0, on CPU) and stored as ModelOpt's Hugging Face export stores
them: `M.weight` (U8, two FP4 E2M1 values a byte), `M.weight_scale` (F8_E4M3, one per
16 values), `M.weight_scale_2` (F32, the global scale) and `M.input_scale` (F32);
`lm_head` excluded, as ModelOpt excludes it. For bfloat16, float16 and float32:

- every `M.weight` devmap writes equals `NVFP4QTensor.dequantize(dtype=D, ...)`, bit
  for bit; the scales and `quantization_config` are not in the output;
- `from_pretrained(OUT)` gives the logits of the same Llama with ModelOpt's weights;
- `verify OUT --against DIR --dtype D` is clean;
- a NaN block scale and a zero `weight_scale_2` are refused by name, nothing written;
- a LoRA adapter peft makes on the model ModelOpt dequantizes (bfloat16) merges
  (`--merge-lora`) bit-identically with peft's `merge_and_unload()` + `save_pretrained`,
  and `verify --against` with the adapter is clean.

Usage: python modelopt_nvfp4.py PATH/TO/devmap
"""

import json
import os
import subprocess
import sys

import torch
from modelopt.torch.quantization.qtensor import NVFP4QTensor
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import saved  # noqa: E402

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def config():
    return LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=False)


def build(work, name, edit=None):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config()).to(torch.bfloat16)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    reference = {dtype: {} for dtype in DTYPES}
    for layer in range(2):
        for lin in LINEARS:
            m = f"model.layers.{layer}.{lin}"
            w = state.pop(f"{m}.weight")
            q, scale, scale_2 = NVFP4QTensor.quantize(w, 16)
            state[f"{m}.weight"] = q._quantized_data.contiguous()
            state[f"{m}.weight_scale"] = scale.contiguous()
            state[f"{m}.weight_scale_2"] = scale_2.float().reshape(())
            state[f"{m}.input_scale"] = torch.tensor(1.0)
            for dtype in DTYPES:
                reference[dtype][f"{m}.weight"] = q.dequantize(
                    dtype=dtype, scale=scale, double_scale=scale_2, block_sizes={-1: 16})
    cfg = config().to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = "bfloat16"
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                  "exclude_modules": ["lm_head"]}
    if edit:
        edit(state)
    src = os.path.join(work, name)
    os.makedirs(src)
    save_file(state, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
    json.dump(cfg, open(os.path.join(src, "config.json"), "w"))
    return src, reference, state


def devmap(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True)


def main():
    import modelopt
    exe = os.path.abspath(sys.argv[1])
    work = saved.workdir("devmap-modelopt-")
    print(f"nvidia-modelopt {modelopt.__version__}, torch {torch.__version__}")
    src, reference, state = build(work, "nvfp4")
    for dtype in DTYPES:
        name = str(dtype)[6:]
        out = os.path.join(work, f"out-{name}")
        r = devmap(exe, "save", src, "--out", out, "--dtype", name)
        assert r.returncode == 0, f"{name}: {r.stderr}"
        got = saved.tensors(out)
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        for key, want in reference[dtype].items():
            assert got[key].dtype == dtype and torch.equal(got[key].view(bits), want.view(bits)), (
                f"{name}: {key} differs from ModelOpt's dequantize in "
                f"{(got[key].view(bits) != want.view(bits)).sum().item()} of {want.numel()} values")
        left = [k for k in got if k.endswith((".weight_scale", ".weight_scale_2", ".input_scale"))]
        assert not left, f"{name}: scales in the output: {left[:3]}"
        assert "quantization_config" not in json.load(open(os.path.join(out, "config.json")))
        v = devmap(exe, "verify", out, "--against", src, "--dtype", name, "--quiet")
        assert v.returncode == 0, f"{name}: verify --against is not clean:\n{v.stdout[-800:]}{v.stderr}"
        if dtype == torch.float32:
            model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
            ref = AutoModelForCausalLM.from_config(config()).to(torch.float32).eval()
            weights = {k: v.float() for k, v in state.items() if not k.endswith(("_scale", "_scale_2"))
                       and k not in reference[dtype]}
            weights.update(reference[dtype])
            ref.load_state_dict(weights)
            ids = torch.tensor([[1, 5, 9, 33, 2, 17, 60, 3]])
            with torch.no_grad():
                assert torch.equal(model(ids).logits, ref(ids).logits), "logits differ"
        print(f"ModelOpt NVFP4 → {name}: {len(reference[dtype])} weights bit for bit ModelOpt's dequantize, verify clean")
    check_lora(exe, work, state, reference[torch.bfloat16])
    m = "model.layers.0.mlp.down_proj"

    def nan_scale(state):
        state[f"{m}.weight_scale"][1, 1] = float("nan")

    def zero_global(state):
        state[f"{m}.weight_scale_2"] = torch.tensor(0.0)

    for label, edit, needle in [("a NaN block scale", nan_scale, "NaN"),
                                ("a zero weight_scale_2", zero_global, "global scale")]:
        bad, _, _ = build(work, label.replace(" ", "-"), edit)
        out = os.path.join(work, "refused-" + label.replace(" ", "-"))
        r = devmap(exe, "save", bad, "--out", out, "--dtype", "bfloat16")
        assert r.returncode != 0 and needle in r.stderr, f"{label}: {r.stderr}"
        assert not os.path.exists(out), f"{label}: something was written"
        print(f"{label}: refused ({needle})")
    print("modelopt nvfp4: all checks passed")


def check_lora(exe, work, state, dequantized):
    """peft's LoRA on the Llama whose linear weights are ModelOpt's bfloat16 dequantize
    (transformers' ModelOpt integration needs a GPU to load the checkpoint itself),
    merged by devmap while it dequantizes the NVFP4 checkpoint."""
    from peft import LoraConfig

    src = os.path.join(work, "nvfp4")

    def load():
        model = AutoModelForCausalLM.from_config(config()).to(torch.bfloat16).eval()
        weights = {k: v for k, v in state.items()
                   if not k.endswith((".weight_scale", ".weight_scale_2", ".input_scale"))
                   and k not in dequantized}
        weights.update(dequantized)
        model.load_state_dict(weights)
        return model

    lora = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                      target_modules=["q_proj", "v_proj", "down_proj"])
    adapter, ref, _ = saved.peft_merged(load, lora, work, "modelopt-lora")
    out = os.path.join(work, "modelopt-lora-devmap")
    r = devmap(exe, "save", src, "--out", out, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet")
    assert r.returncode == 0, f"--merge-lora into ModelOpt NVFP4: {r.stderr}"
    ours, theirs = saved.tensors(out), saved.tensors(ref)
    assert sorted(ours) == sorted(theirs), f"names differ: {sorted(set(ours) ^ set(theirs))[:4]}"
    bad = [k for k in theirs if not torch.equal(ours[k].view(torch.int16), theirs[k].view(torch.int16))]
    assert not bad, f"--merge-lora into ModelOpt NVFP4: {len(bad)} tensors differ from peft's merge, e.g. {bad[0]}"
    v = devmap(exe, "verify", out, "--against", src, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet")
    assert v.returncode == 0, f"--merge-lora into ModelOpt NVFP4: verify --against:\n{v.stdout[-800:]}"
    changed = sum(any(t in k for t in ("q_proj", "v_proj", "down_proj")) for k in theirs)
    print(f"LoRA merged into {changed} dequantized ModelOpt NVFP4 weights: bit-identical with peft's "
          "merge_and_unload + save_pretrained, verify clean")


if __name__ == "__main__":
    main()
