"""devmap save --merge-lora against peft's own merge: for each case, transformers writes
a tiny base model, peft makes an adapter with random (non-zero) weights and saves it,
peft's route (PeftModel.from_pretrained, merge_and_unload, save_pretrained) writes the
reference, and devmap writes its merge. Checked: the same names, dtypes and shapes;
every element within one ulp of the stored dtype at the magnitude of its operands; at
least 99.5% bit-identical; logits of from_pretrained(devmap's output) equal to peft's
merged model's within 1e-3 (float32) / 2e-2 (bfloat16). An unsupported adapter type is
refused with no output left.

Usage: python lora_merge.py PATH/TO/devmap
Prints one "ok:" line per case with its bit-identical share; exits non-zero on any
failure. Needs torch, transformers, peft.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import torch
from peft import LoHaConfig, LoraConfig, PeftModel, get_peft_model
from safetensors import safe_open
from saved import tensors
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import WeightRenaming, apply_renamings
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    CLIPVisionConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    GraniteMoeConfig,
    MixtralConfig,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3MoeConfig,
    Qwen2ForCausalLM,
)

WORK = tempfile.mkdtemp(prefix="devmap-lora-")
INPUT = torch.tensor([[1, 5, 9, 33, 2, 17, 60, 3]])


def llama(dtype, tied=False):
    torch.manual_seed(0)
    m = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=96,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            tie_word_embeddings=tied,
        )
    )
    return m.to(dtype)


def gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=64, n_layer=2, n_head=4, n_positions=32))


def qwen2():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=96,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
        )
    )


def llava():
    """A tiny Llava: peft names its modules as the loaded model does
    (`model.language_model.layers.0…`), the checkpoint as `language_model.model.layers.0…`."""
    torch.manual_seed(0)
    text = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                              image_size=28, patch_size=14, projection_dim=32)
    return LlavaForConditionalGeneration(LlavaConfig(text_config=text, vision_config=vision, image_token_index=95))


def moe(config_class, dtype, **extra):
    """A tiny mixture-of-experts model: transformers 5 loads its experts fused
    (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]), the
    checkpoint holds them one by one."""
    def make():
        torch.manual_seed(0)
        config = config_class(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, num_experts_per_tok=2, **extra)
        return AutoModelForCausalLM.from_config(config).to(dtype)
    return make


def make_adapter(base_dir, dtype, config, seed, name, auto=AutoModelForCausalLM):
    """peft's own adapter over the saved base, every trainable weight randomised."""
    base = auto.from_pretrained(base_dir, dtype=dtype)
    peft_model = get_peft_model(base, config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if p.requires_grad:
                noise = torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.05
                if "magnitude" in n:
                    p.copy_((p.float() * (1.0 + noise)).to(p.dtype))
                elif "lora_" in n:
                    p.copy_(noise.to(p.dtype) * 4)
                else:  # modules_to_save copies
                    p.add_(noise.to(p.dtype))
    out = os.path.join(WORK, name)
    peft_model.save_pretrained(out)
    return out


def peft_route(base_dir, dtype, adapters, out, auto=AutoModelForCausalLM):
    model = auto.from_pretrained(base_dir, dtype=dtype)
    for a in adapters:
        model = PeftModel.from_pretrained(model, a).merge_and_unload()
    model.save_pretrained(out)
    with torch.no_grad():
        return model(INPUT).logits.float()


MANTISSA = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}

# Where the exactness claim holds, said by every run: devmap's merges are within one
# ulp of peft's (and ≥ 99.5% bit-identical) with torch's AVX2/AVX-512 kernels and
# MKL's FMA GEMM on x86-64. With MKL's conditional-reproducibility mode
# (MKL_CBWR=COMPATIBLE: no FMA) peft's GEMM rounds each of the r products of a delta
# element on its own, so an element may differ by up to r ulps of the delta's operand
# magnitude scale·Σ|B||A| (devmap's fused sum is the more exact one) plus one ulp of the
# result; that is the tolerance there, and nothing more is allowed.
CAPABILITY = torch.backends.cpu.get_cpu_capability()
BLAS = next((l.split("BLAS_INFO=")[1].split(",")[0] for l in torch.__config__.show().splitlines() if "BLAS_INFO=" in l), "unknown")
COMPATIBLE = os.environ.get("MKL_CBWR", "").upper().startswith("COMPATIBLE")
# MKL picks its kernels by CPU vendor; the one-row rule was found on AMD EPYC.
AMD = "AuthenticAMD" in open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else False


def adapter_bound(adapters, module, shape):
    """(bound, rank): see below."""
    return _adapter_bound(adapters, module, shape)


def expert_bound(adapters, module, shape, loaded_name):
    """The bound of `_adapter_bound` for a tensor a `target_parameters` LoRA changes
    through a fused experts parameter: one expert's w1/w3/w2 (gate/up/down) in the
    checkpoint (2-D), or the whole fused parameter (3-D, GraniteMoE). `loaded_name`
    maps a checkpoint name to the loaded model's. Returns (bound, rank), rank 0 when no
    adapter changes it this way."""
    import json
    import re
    per_expert = re.match(r"(.*)\.experts\.(\d+)\.(\w+)$", module)
    if per_expert:
        prefix, expert, part = per_expert.group(1), int(per_expert.group(2)), per_expert.group(3)
        owner = loaded_name(prefix + ".experts.weight")[: -len(".weight")]
        rows, cols = shape
    else:
        fused = loaded_name(module + ".weight")
        if fused.endswith(".weight") or ".experts." not in fused:
            return torch.zeros(shape), 0
        owner, expert, part = fused.rsplit(".", 1)[0], None, None
        _, rows, cols = shape
    total = torch.zeros(shape)
    rank = 0
    for a in adapters:
        with open(os.path.join(a, "adapter_config.json")) as f:
            c = json.load(f)
        r = c["r"]
        scale = c["lora_alpha"] / r ** (0.5 if c.get("use_rslora") else 1.0)
        with safe_open(os.path.join(a, "adapter_model.safetensors"), "pt") as st:
            for key in st.keys():
                base = f"base_model.model.{owner}"
                if not (key.startswith(base) and key.endswith(".lora_A.weight")):
                    continue
                wrappers = key[len(base):-len(".lora_A.weight")]
                if wrappers.replace(".base_layer", ""):
                    continue
                A = st.get_tensor(key).float().abs()
                B = st.get_tensor(key.replace("lora_A", "lora_B")).float().abs()
                experts = A.shape[0] // r
                out = B.shape[0]
                if A.shape[1] != cols or out not in (rows, 2 * rows):
                    continue
                # |delta[e]| ≤ scale · Σ_k |B[:, k·E+e]| |A[e·r+k, :]|
                per = torch.stack([
                    B[:, [k * experts + e for k in range(r)]] @ A[e * r:(e + 1) * r] for e in range(experts)
                ]) * scale
                if expert is None:
                    if per.shape != total.shape:
                        continue
                    total += per
                else:
                    half = {"w1": 0, "gate_proj": 0, "w3": 1, "up_proj": 1}.get(part, 0)
                    start = half * rows if out == 2 * rows else 0
                    total += per[expert, start:start + rows]
                rank += r
    return total, rank


def _adapter_bound(adapters, module, shape):
    """|B|·|A|·scale summed over the adapters that change `module`'s weight, laid out
    like the weight (transposed where the adapter's delta is), with the largest scale
    the adapter's config allows (patterns included)."""
    import json
    total = torch.zeros(shape)
    rank = 0
    for a in adapters:
        with open(os.path.join(a, "adapter_config.json")) as f:
            c = json.load(f)
        ranks = [c["r"], *c.get("rank_pattern", {}).values()]
        alphas = [c["lora_alpha"], *c.get("alpha_pattern", {}).values()]
        scale = max(alphas) / min(ranks) ** (0.5 if c.get("use_rslora") else 1.0)
        with safe_open(os.path.join(a, "adapter_model.safetensors"), "pt") as st:
            keys = set(st.keys())
            pairs = (
                (f"base_model.model.{module}.lora_A.weight", f"base_model.model.{module}.lora_B.weight",
                 c.get("fan_in_fan_out", False)),
                (f"base_model.model.{module}.lora_embedding_A", f"base_model.model.{module}.lora_embedding_B", True),
            )
            for a_key, b_key, transposed in pairs:
                if a_key in keys and b_key in keys:
                    rank += st.get_tensor(a_key).shape[0]
                    prod = st.get_tensor(b_key).float().abs() @ st.get_tensor(a_key).float().abs()
                    if transposed:
                        prod = prod.T
                    total += scale * prod
    return total, rank


def dora_magnitude(adapters, module):
    """The DoRA magnitude vector of `module`'s weight, if an adapter has one."""
    for a in adapters:
        with safe_open(os.path.join(a, "adapter_model.safetensors"), "pt") as st:
            for key in (f"base_model.model.{module}.lora_magnitude_vector",
                        f"base_model.model.{module}.lora_magnitude_vector.weight"):
                if key in st.keys():
                    return st.get_tensor(key).float().flatten()
    return None


def compare(case, ours_dir, ref_dir, base_dir, dtype, ref_logits, ulps=1, adapters=(), auto=AutoModelForCausalLM):
    ours, ref, base = tensors(ours_dir), tensors(ref_dir), tensors(base_dir)
    # peft keys modules by the loaded model's names (Llava's `model.language_model.…`);
    # transformers' own renamings give them for the checkpoint's names.
    with torch.device("meta"):
        loaded = auto.from_config(AutoConfig.from_pretrained(base_dir))
    renamings = [r for r in get_model_conversion_mapping(loaded) if isinstance(r, WeightRenaming)]
    loaded_module = lambda m: apply_renamings(m + ".weight", renamings)[: -len(".weight")]
    if sorted(ours) != sorted(ref):
        sys.exit(f"FAIL {case}: names differ: only devmap {sorted(set(ours) - set(ref))}, only peft {sorted(set(ref) - set(ours))}")
    same = total = 0
    for k in ref:
        a, b = ours[k], ref[k]
        if a.dtype != b.dtype or a.shape != b.shape:
            sys.exit(f"FAIL {case}: {k}: devmap {a.dtype} {tuple(a.shape)}, peft {b.dtype} {tuple(b.shape)}")
        if not a.is_floating_point():
            if not torch.equal(a, b):
                sys.exit(f"FAIL {case}: {k} differs")
            continue
        bits = a.view(torch.int16 if a.element_size() == 2 else torch.int32)
        ref_bits = b.view(bits.dtype)
        same += int((bits == ref_bits).sum())
        total += a.numel()
        # One ulp of the stored dtype at the magnitude of the operands: the result's
        # and the base weight's (a delta that cancels the weight leaves a tiny result).
        w = base.get(k, b).float()
        scale = torch.maximum(b.float().abs(), w.abs())
        ulp = lambda m: torch.pow(2.0, torch.floor(torch.log2(m.clamp_min(torch.finfo(dtype).tiny))) - MANTISSA[a.dtype])
        tol = ulp(scale)
        # The documented bound of another summation order: MKL's non-FMA path, and a
        # one-row delta off AMD (see below).
        other_order = COMPATIBLE or (not AMD and a.dim() == 2 and a.shape[0] == 1)
        if other_order and k.endswith(".weight") and a.dim() in (2, 3):
            module = k[: -len(".weight")]
            delta, rank = (torch.zeros(a.shape), 0) if a.dim() == 3 else adapter_bound(adapters, module, tuple(a.shape))
            if rank == 0 and a.dim() == 2:
                delta, rank = adapter_bound(adapters, loaded_module(module), tuple(a.shape))
            if rank == 0:
                delta, rank = expert_bound(adapters, module, tuple(a.shape), lambda n: apply_renamings(n, renamings))
            before = ulp(w.abs() + delta) + rank * ulp(delta) * (delta > 0)
            magnitude = dora_magnitude(adapters, module)
            if magnitude is not None:
                # DoRA rescales each row by m/‖W+ΔW‖, and the error with it.
                low = (w.norm(dim=1) - delta.norm(dim=1)).clamp_min(1e-12)
                before = before * (magnitude.abs() / low)[:, None]
            tol = tol + before
        # A delta with one row (a Linear with out_features = 1: Qwen2-MoE's
        # shared_expert_gate) is a matrix-vector product in torch. On AMD CPUs MKL's
        # rounds each product before adding it, which devmap follows exactly: nothing
        # less than bit-identical there. On Intel CPUs MKL dispatches another GEMV
        # (blocked over the rank: neither rule matches it), held to the ulp bound below.
        if not COMPATIBLE and AMD and a.dim() == 2 and a.shape[0] == 1 and not torch.equal(bits, ref_bits):
            i = int(torch.argmax((bits != ref_bits).int()))
            sys.exit(f"FAIL {case}: {k}: a one-row delta differs at element {i}: devmap {a.flatten()[i].item()} peft {b.flatten()[i].item()}")
        err = (a.float() - b.float()).abs()
        if bool((err > tol * ulps * 1.0001).any()):
            i = int(torch.argmax(err - tol))
            sys.exit(
                f"FAIL {case}: {k}: element {i}: devmap {a.flatten()[i].item()} peft {b.flatten()[i].item()} (more than {ulps} ulp)"
            )
    share = same / max(total, 1)
    # The bit-identical share is a claim about the FMA GEMM only.
    if share < 0.995 and not COMPATIBLE:
        sys.exit(f"FAIL {case}: only {share:.4%} of elements bit-identical")
    model = auto.from_pretrained(ours_dir, dtype=dtype)
    with torch.no_grad():
        logits = model(INPUT).logits.float()
    limit = 1e-3 if dtype == torch.float32 else 2e-2
    diff = float((logits - ref_logits).abs().max())
    if diff > limit:
        sys.exit(f"FAIL {case}: logits differ by {diff} (limit {limit})")
    print(f"ok: {case}: {len(ref)} tensors, {share:.4%} of elements bit-identical, logits within {diff:.2e}")


def devmap_save(devmap, base_dir, adapters, out, *extra):
    args = [devmap, "save", base_dir, "--out", out, "--quiet", "--max-shard-size", "200KB", *extra]
    for a in adapters:
        args += ["--merge-lora", a]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: devmap save with {adapters}: {r.stderr}")


def case(devmap, name, model_fn, dtype, configs, ulps=1, auto=AutoModelForCausalLM):
    base_dir = os.path.join(WORK, f"{name}-base")
    model_fn().save_pretrained(base_dir)
    adapters = []
    merged_dirs = [base_dir]
    for i, c in enumerate(configs):
        # Each adapter is made over the model the earlier ones merged into, as a user
        # stacking adapters would.
        adapters.append(make_adapter(merged_dirs[-1], dtype, c, 100 + i, f"{name}-adapter{i}", auto))
        if i + 1 < len(configs):
            step = os.path.join(WORK, f"{name}-merged{i}")
            peft_route(merged_dirs[-1], dtype, [adapters[-1]], step, auto)
            merged_dirs.append(step)
    ref_dir = os.path.join(WORK, f"{name}-peft")
    ref_logits = peft_route(base_dir, dtype, adapters, ref_dir, auto)
    ours = os.path.join(WORK, f"{name}-devmap")
    devmap_save(devmap, base_dir, adapters, ours)
    compare(name, ours, ref_dir, base_dir, dtype, ref_logits, ulps, adapters, auto)


def main(devmap):
    print(f"platform: torch CPU capability {CAPABILITY}, BLAS {BLAS}, MKL_CBWR={os.environ.get('MKL_CBWR', '(unset)')}, CPU {'AMD' if AMD else 'not AMD'}")
    linear = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    case(devmap, "llama-f32", lambda: llama(torch.float32), torch.float32,
         [LoraConfig(r=8, lora_alpha=16, target_modules=linear, init_lora_weights=False)])
    case(devmap, "llama-bf16", lambda: llama(torch.bfloat16), torch.bfloat16,
         [LoraConfig(r=8, lora_alpha=16, target_modules=linear, init_lora_weights=False)])
    case(devmap, "llama-rslora-patterns", lambda: llama(torch.float32), torch.float32,
         [LoraConfig(r=8, lora_alpha=16, use_rslora=True, target_modules=linear,
                     rank_pattern={"q_proj": 4, "layers.1.mlp.down_proj": 2},
                     alpha_pattern={"v_proj": 32}, init_lora_weights=False)])
    case(devmap, "gpt2-fan-in-fan-out", gpt2, torch.float32,
         [LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True, init_lora_weights=False)])
    case(devmap, "qwen2-embedding-modules-to-save", qwen2, torch.float32,
         [LoraConfig(r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"], modules_to_save=["lm_head"], init_lora_weights=False)])
    case(devmap, "qwen2-lora-bias", qwen2, torch.float32,
         [LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"], lora_bias=True, init_lora_weights=False)])
    case(devmap, "llama-dora", lambda: llama(torch.float32), torch.float32,
         [LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], use_dora=True, init_lora_weights=False)])
    case(devmap, "llama-bf16-tied-embedding", lambda: llama(torch.bfloat16, tied=True), torch.bfloat16,
         [LoraConfig(r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"], init_lora_weights=False)])
    case(devmap, "llama-two-adapters", lambda: llama(torch.float32), torch.float32,
         [LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
          LoraConfig(r=8, lora_alpha=4, target_modules=["v_proj", "down_proj"], init_lora_weights=False)])

    # peft's target_parameters on fused experts: each expert's slice of the delta goes
    # to its per-expert checkpoint tensors (Mixtral's w1/w3/w2, Qwen3-MoE's
    # gate_proj/up_proj/down_proj), in float32 and bfloat16.
    experts = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    mixtral = dict(intermediate_size=48, num_local_experts=4)
    case(devmap, "mixtral-target-parameters", moe(MixtralConfig, torch.float32, **mixtral), torch.float32,
         [LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], target_parameters=experts, init_lora_weights=False)])
    case(devmap, "mixtral-target-parameters-bf16", moe(MixtralConfig, torch.bfloat16, **mixtral), torch.bfloat16,
         [LoraConfig(r=4, lora_alpha=8, target_modules=[], target_parameters=experts, init_lora_weights=False)])
    # GraniteMoE's checkpoint holds the experts fused already (`input_linear` [E, 2I, H]).
    granite = ["block_sparse_moe.experts.gate_up_proj", "block_sparse_moe.experts.down_proj"]
    case(devmap, "granitemoe-target-parameters", moe(GraniteMoeConfig, torch.float32, **mixtral), torch.float32,
         [LoraConfig(r=4, lora_alpha=8, target_modules=[], target_parameters=granite, init_lora_weights=False)])
    case(devmap, "qwen3-moe-target-parameters", moe(Qwen3MoeConfig, torch.float32, moe_intermediate_size=32,
                                                    num_experts=4, head_dim=16), torch.float32,
         [LoraConfig(r=4, lora_alpha=8, target_modules=[], target_parameters=experts, init_lora_weights=False)])

    # all-linear on Qwen2-MoE: every expert's projections, the shared expert and its
    # one-output gate (`shared_expert_gate`, a delta torch computes as a matrix-vector
    # product).
    case(devmap, "qwen2-moe-all-linear", moe(Qwen2MoeConfig, torch.float32, moe_intermediate_size=32,
                                              shared_expert_intermediate_size=48, num_experts=4), torch.float32,
         [LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)])

    # peft names Llava's modules as the loaded model does; devmap maps them back.
    case(devmap, "llava-renamed-modules", llava, torch.float32,
         [LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "linear_1"], init_lora_weights=False)],
         auto=AutoModelForImageTextToText)

    # An adapter devmap cannot merge: refused, naming the type, nothing left.
    base_dir = os.path.join(WORK, "llama-f32-base")
    loha = make_adapter(base_dir, torch.float32, LoHaConfig(r=4, alpha=8, target_modules=["q_proj"]), 7, "loha")
    out = os.path.join(WORK, "loha-out")
    r = subprocess.run([devmap, "save", base_dir, "--out", out, "--merge-lora", loha], capture_output=True, text=True)
    if r.returncode == 0 or "LOHA" not in r.stderr or os.path.exists(out):
        sys.exit(f"FAIL: a LoHa adapter must be refused with nothing written: {r.returncode} {r.stderr}")
    print("ok: a LoHa adapter is refused, naming its type, and nothing is written")
    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])
