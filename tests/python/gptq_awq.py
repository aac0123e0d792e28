"""GPTQ and AWQ checkpoints dequantized by `devmap save --dtype D`, bit for bit what
the reference libraries compute.

A tiny Llama's linear layers are quantized here and stored as the formats store them:

- AWQ (`quant_method: awq`, `version: gemm`, 4 bits, groups of 32, zero points):
  `qweight` [in, out/8] and `qzeros` [groups, out/8] packed in AutoAWQ's column order,
  `scales` [groups, out] in float16. Reference: AutoAWQ's own `dequantize_gemm`
  (`awq/utils/packing_utils.py`, autoawq 0.2.9, loaded from the installed package's
  file: it needs nothing but torch).
- GPTQ (`quant_method: gptq`, 4 and 8 bits, groups of 32): `qweight` [in/p, out]
  packed down the rows, `qzeros` [groups, out/p], `scales` [groups, out] in float16,
  `g_idx` [in]; `desc_act` true (the rows' groups permuted) and false; the `gptq`
  format (v1: zero points stored minus one, read by adding 0x11111111 to each word,
  carries included, as GPTQModel's `convert_gptq_v1_to_v2_format_module` does) and
  `gptq_v2`. Reference: GPTQModel 7.7.0's `PackableQuantLinear.dequantize_weight`
  (`gptqmodel/nn_modules/qlinear/__init__.py`), written out here in torch line for line
  — GPTQModel itself needs datasets, pyarrow, torchao and compiled kernels to import,
  and transformers has no GPTQ path of its own without it.

For each: every `M.weight` devmap writes equals the reference's dequantized weight
converted to the dtype asked (float16, bfloat16, float32), bit for bit; the
quantization tensors, `quantization_config` and GPTQModel's `quantize_config.json` are
not in the output; `devmap verify OUT --against DIR --dtype D` is clean; `from_pretrained(OUT)` gives the logits of the same Llama built with
the reference's weights; a LoRA adapter peft makes on the dequantized model (the QLoRA
flow) merges bit-identically with peft's `merge_and_unload()` (AWQ, and GPTQ v1 with
activation order); and hostile variants (scales of the wrong shape, a group size
that does not divide the rows, a g_idx out of range, a config whose bits disagree with
the packed widths, NaN scales, an unknown format) are refused by name with nothing
written.

Usage: python gptq_awq.py PATH/TO/devmap
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import saved  # noqa: E402

GROUP = 32
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def autoawq():
    """AutoAWQ's packing_utils, from the installed package's file."""
    import importlib.metadata as md
    dist = md.distribution("autoawq")
    path = next(str(dist.locate_file(f)) for f in dist.files if str(f).endswith("awq/utils/packing_utils.py"))
    spec = importlib.util.spec_from_file_location("awq_packing_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, dist.version


def quantize(w, bits, perm=None):
    """Per-group asymmetric quantization of w [out, in] (groups along in, in the
    order `perm` gives): codes [in, out], zeros [groups, out], scales [groups, out]
    (float16), g_idx [in]."""
    out_f, in_f = w.shape
    groups = in_f // GROUP
    order = perm if perm is not None else torch.arange(in_f)
    g_idx = torch.empty(in_f, dtype=torch.int32)
    g_idx[order] = torch.arange(in_f, dtype=torch.int32) // GROUP
    wt = w.t()  # [in, out]
    maxq = 2 ** bits - 1
    scales = torch.empty(groups, out_f, dtype=torch.float16)
    zeros = torch.empty(groups, out_f, dtype=torch.int32)
    codes = torch.empty(in_f, out_f, dtype=torch.int32)
    for g in range(groups):
        rows = (g_idx == g).nonzero().flatten()
        lo, hi = wt[rows].min(0).values.clamp(max=0), wt[rows].max(0).values.clamp(min=0)
        s = ((hi - lo) / maxq).clamp(min=1e-5).to(torch.float16)
        z = torch.round(-lo / s.float()).clamp(0, maxq).to(torch.int32)
        scales[g], zeros[g] = s, z
        codes[rows] = torch.clamp(torch.round(wt[rows] / s.float()) + z, 0, maxq).to(torch.int32)
    # Zero points of 0 and of the maximum, so v1's stored-minus-one words carry.
    zeros[0, 0], zeros[0, 1] = 0, maxq
    return codes, zeros, scales, g_idx


def pack_columns(values, bits, order=None):
    """[rows, cols] → I32 [rows, cols·bits/32], values packed along each row."""
    p = 32 // bits
    rows, cols = values.shape
    v = values.to(torch.int64).reshape(rows, cols // p, p)
    if order is not None:
        v = v[:, :, order]
    words = torch.zeros(rows, cols // p, dtype=torch.int64)
    for k in range(p):
        words |= (v[:, :, k] & (2 ** bits - 1)) << (bits * k)
    return as_i32(words)


def pack_rows(values, bits):
    """[rows, cols] → I32 [rows·bits/32, cols], values packed down each column."""
    return pack_columns(values.t().contiguous(), bits).t().contiguous()


def as_i32(words64):
    return ((words64 + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32)


def gptq_reference(qweight, qzeros, scales, g_idx, bits, v1):
    """GPTQModel 7.7.0's dequantize_weight (and, for v1, the v2 conversion before it)."""
    if v1:
        add = {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}[bits]
        qzeros = as_i32(qzeros.to(torch.int64) + add)  # int32 addition: wraps, carries
    p = 32 // bits
    dt = torch.int16 if bits == 8 else torch.int8  # TorchQuantLinear's dequant_dtype
    wf = torch.tensor(list(range(0, 32, bits)), dtype=torch.int32).unsqueeze(0)
    zeros = torch.bitwise_right_shift(torch.unsqueeze(qzeros, 2).expand(-1, -1, p), wf.unsqueeze(0)).to(dt)
    zeros = torch.bitwise_and(zeros, 2 ** bits - 1).reshape(qzeros.shape[0], -1)[:, : scales.shape[1]]
    weight = torch.bitwise_and(
        torch.bitwise_right_shift(torch.unsqueeze(qweight, 1).expand(-1, p, -1), wf.unsqueeze(-1)).to(dt),
        2 ** bits - 1)
    weight = weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2])
    return scales[g_idx.long()] * (weight - zeros[g_idx.long()])


def model_config():
    return LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=False, torch_dtype="float16")


def build(work, name, method, bits=4, desc_act=False, v1=True, edit=None):
    """A quantized checkpoint and, per linear module, the reference's weight [out, in]."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config()).to(torch.float16)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    reference = {}
    awq, _ = autoawq()
    for layer in range(2):
        for lin in LINEARS:
            m = f"model.layers.{layer}.{lin}"
            w = state.pop(f"{m}.weight").float()
            perm = torch.randperm(w.shape[1], generator=torch.Generator().manual_seed(layer)) if desc_act else None
            codes, zeros, scales, g_idx = quantize(w, bits, perm)
            if method == "awq":
                qweight = pack_columns(codes, bits, AWQ_ORDER)
                qzeros = pack_columns(zeros, bits, AWQ_ORDER)
                ref = awq.dequantize_gemm(qweight, qzeros, scales, bits, GROUP)
                state.update({f"{m}.qweight": qweight, f"{m}.qzeros": qzeros, f"{m}.scales": scales})
            else:
                qweight = pack_rows(codes, bits)
                qzeros = pack_columns(zeros - 1 if v1 else zeros, bits)
                ref = gptq_reference(qweight, qzeros, scales, g_idx, bits, v1)
                state.update({f"{m}.qweight": qweight, f"{m}.qzeros": qzeros, f"{m}.scales": scales,
                              f"{m}.g_idx": g_idx})
            reference[f"{m}.weight"] = ref.t().contiguous()
    if method == "awq":
        qc = {"quant_method": "awq", "bits": bits, "group_size": GROUP, "zero_point": True, "version": "gemm"}
    else:
        qc = {"quant_method": "gptq", "bits": bits, "group_size": GROUP, "desc_act": desc_act, "sym": False,
              "checkpoint_format": "gptq" if v1 else "gptq_v2"}
    config = model_config().to_dict()
    config["architectures"] = ["LlamaForCausalLM"]
    config["quantization_config"] = qc
    if edit:
        edit(state, config)
    src = os.path.join(work, name)
    os.makedirs(src)
    save_file(state, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
    json.dump(config, open(os.path.join(src, "config.json"), "w"))
    if method == "gptq":
        json.dump({"bits": bits, "group_size": GROUP, "desc_act": desc_act, "format": qc["checkpoint_format"]},
                  open(os.path.join(src, "quantize_config.json"), "w"))
    return src, reference, state


def devmap(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True)


def check(exe, work, label, src, reference, state):
    for dtype in ("float16", "bfloat16", "float32"):
        out = os.path.join(work, f"{os.path.basename(src)}-{dtype}")
        r = devmap(exe, "save", src, "--out", out, "--dtype", dtype)
        assert r.returncode == 0, f"{label} {dtype}: {r.stderr}"
        got = saved.tensors(out)
        want_dtype = getattr(torch, dtype)
        for name, ref in reference.items():
            assert name in got, f"{label}: {name} not written"
            want = ref.to(want_dtype)
            assert got[name].dtype == want_dtype and torch.equal(got[name].view(torch.int16 if dtype != "float32" else torch.int32),
                                                                  want.view(torch.int16 if dtype != "float32" else torch.int32)), (
                f"{label} {dtype}: {name} differs from the reference in "
                f"{(got[name] != want).sum().item()} of {want.numel()} values")
        v = devmap(exe, "verify", out, "--against", src, "--dtype", dtype, "--quiet")
        assert v.returncode == 0, f"{label} {dtype}: verify --against is not clean:\n{v.stdout[-800:]}{v.stderr}"
        left = [n for n in got if n.endswith((".qweight", ".qzeros", ".scales", ".g_idx"))]
        assert not left, f"{label}: quantization tensors in the output: {left[:3]}"
        config = json.load(open(os.path.join(out, "config.json")))
        assert "quantization_config" not in config, f"{label}: quantization_config kept"
        assert not os.path.exists(os.path.join(out, "quantize_config.json")), f"{label}: quantize_config.json kept"
        if dtype == "float32":
            # The same Llama with the reference's weights: from_pretrained(OUT) computes it.
            model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
            ref_model = AutoModelForCausalLM.from_config(model_config()).to(torch.float32).eval()
            weights = {k: v.float() for k, v in state.items() if not k.endswith((".qweight", ".qzeros", ".scales", ".g_idx"))}
            weights.update({k: v.float() for k, v in reference.items()})
            ref_model.load_state_dict(weights)
            ids = torch.tensor([[1, 5, 9, 33, 2, 17, 60, 3]])
            with torch.no_grad():
                a, b = model(ids).logits, ref_model(ids).logits
            assert torch.equal(a, b), f"{label}: logits differ by {(a - b).abs().max().item()}"
    print(f"{label}: {len(reference)} weights bit for bit the reference's in float16, bfloat16, float32; logits equal")


def check_lora(exe, work, label, src, reference, state):
    """The QLoRA flow: peft's LoRA made on the model the reference dequantizes to (in
    bfloat16), merged by devmap while it dequantizes: bit-identical with peft's
    `merge_and_unload()` of it into that model."""
    from peft import LoraConfig

    def load():
        model = AutoModelForCausalLM.from_config(model_config()).to(torch.bfloat16).eval()
        weights = {k: v.to(torch.bfloat16) for k, v in state.items()
                   if not k.endswith((".qweight", ".qzeros", ".scales", ".g_idx"))}
        weights.update({k: v.to(torch.bfloat16) for k, v in reference.items()})
        model.load_state_dict(weights)
        return model

    lora = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "v_proj", "down_proj"])
    name = os.path.basename(src)
    adapter, ref, _ = saved.peft_merged(load, lora, work, f"{name}-lora")
    out = os.path.join(work, f"{name}-lora-devmap")
    r = devmap(exe, "save", src, "--out", out, "--dtype", "bfloat16", "--merge-lora", adapter, "--quiet")
    assert r.returncode == 0, f"{label} + LoRA: {r.stderr}"
    ours, theirs = saved.tensors(out), saved.tensors(ref)
    assert sorted(ours) == sorted(theirs), f"{label} + LoRA: names differ: {sorted(set(ours) ^ set(theirs))[:4]}"
    bad = saved.first_unequal(ours, theirs)
    assert bad is None, f"{label} + LoRA: {bad} differs from peft's merge"
    print(f"{label} + LoRA: merged bit-identically with peft's merge_and_unload on the dequantized model")


def refused(exe, work, label, src, needle):
    out = os.path.join(work, f"refused-{os.path.basename(src)}")
    r = devmap(exe, "save", src, "--out", out, "--dtype", "bfloat16")
    assert r.returncode != 0, f"{label}: not refused"
    assert needle in r.stderr, f"{label}: the refusal does not name `{needle}`:\n{r.stderr}"
    assert not os.path.exists(out) or not os.listdir(out), f"{label}: something was written"
    print(f"{label}: refused ({needle})")


def main():
    exe = os.path.abspath(sys.argv[1])
    work = saved.workdir("devmap-gptq-awq-")
    _, awq_version = autoawq()
    print(f"autoawq {awq_version}, torch {torch.__version__}")
    awq = build(work, "awq", "awq")
    check(exe, work, "AWQ gemm 4-bit", *awq)
    check_lora(exe, work, "AWQ gemm 4-bit", *awq)
    check_lora(exe, work, "GPTQ v1 4-bit desc_act=True", *build(work, "gptq-lora", "gptq", 4, True, True))
    for bits in (4, 8):
        for desc_act in (False, True):
            for v1 in (True, False):
                label = f"GPTQ {'v1' if v1 else 'v2'} {bits}-bit desc_act={desc_act}"
                name = f"gptq-{bits}-{int(desc_act)}-{int(v1)}"
                check(exe, work, label, *build(work, name, "gptq", bits, desc_act, v1))
    m = "model.layers.0.mlp.down_proj"

    def wrong_scales(state, config):
        state[f"{m}.scales"] = state[f"{m}.scales"][:, :-8].contiguous()

    def bad_group(state, config):
        config["quantization_config"]["group_size"] = 48
        for k in [k for k in state if k.endswith(".g_idx")]:
            del state[k]

    def g_idx_out(state, config):
        state[f"{m}.g_idx"][3] = 99

    def bits_disagree(state, config):
        config["quantization_config"]["bits"] = 8

    def nan_scale(state, config):
        state[f"{m}.scales"][1, 2] = float("nan")

    def unknown_format(state, config):
        config["quantization_config"]["checkpoint_format"] = "marlin"

    for label, edit, needle in [("scales of the wrong shape", wrong_scales, f"{m}.scales"),
                                ("a group size that does not divide", bad_group, "group_size is 48"),
                                ("g_idx out of range", g_idx_out, "group 99"),
                                ("bits that disagree with the packed width", bits_disagree, "disagrees with the config"),
                                ("a NaN scale", nan_scale, "NaN"),
                                ("an unknown format", unknown_format, "`marlin`")]:
        src, _, _ = build(work, label.replace(" ", "-"), "gptq", edit=edit)
        refused(exe, work, label, src, needle)
    print("gptq/awq: all checks passed")


if __name__ == "__main__":
    main()
