"""The KV cache `devmap plan --context N --batch B` counts, against the cache
transformers itself fills.

For 11 architectures — Llama, Qwen2, Mistral (every layer sliding-window), Gemma 2
(alternating), Gemma 3 (five local layers to one global), Qwen3, DeepSeek V3 (MLA: its
compressed KV and rotary key), gpt-oss (alternating, MoE), and the hybrids Qwen3-Next
(gated delta net), LFM2 (short convolutions) and Jamba (Mamba) — a tiny random model is
saved with `save_pretrained` in bfloat16, then run by transformers over N tokens of a
batch of 2 with `DynamicCache(config=model.config)`, the cache `generate` makes. At
N = 3, 6 and 20 (below, at and past the sliding window of 6), the bytes every layer
holds (keys and values, or a linear layer's convolution and recurrent states) must
equal devmap's count for that layer, and the totals.

Usage: python kv_cache.py PATH/TO/devmap
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

BATCH = 2


def config(model_type, **extra):
    base = dict(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=False)
    base.update(extra)
    return AutoConfig.for_model(model_type, **base)


CASES = {
    "llama": config("llama"),
    "qwen2": config("qwen2", use_sliding_window=False, sliding_window=8),
    "mistral": config("mistral", sliding_window=6),
    "gemma2": config("gemma2", sliding_window=6),
    "gemma3_text": config("gemma3_text", sliding_window=6, num_hidden_layers=7),
    "qwen3": config("qwen3"),
    "deepseek_v3": config("deepseek_v3", head_dim=8, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24,
                          qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_routed_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1,
                          topk_group=1),
    "gpt_oss": config("gpt_oss", sliding_window=6, num_local_experts=4, num_experts_per_tok=2),
    # Hybrids: fixed-size states beside the full-attention layers' KV.
    "qwen3_next": config("qwen3_next", linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                         linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32, shared_expert_intermediate_size=32,
                         layer_types=["linear_attention"] * 3 + ["full_attention"]),
    "lfm2": config("lfm2", conv_L_cache=3, layer_types=["conv", "conv", "full_attention", "conv"]),
    "jamba": config("jamba", mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8, attn_layer_period=2,
                    attn_layer_offset=1, num_experts=2, expert_layer_period=2, expert_layer_offset=1),
}


def held(layer):
    """Bytes a cache layer holds: keys and values, or a linear layer's states."""
    tensors = [getattr(layer, "keys", None), getattr(layer, "values", None)]
    for states in ("conv_states", "recurrent_states"):
        tensors += list((getattr(layer, states, None) or {}).values())
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def main(devmap):
    work = tempfile.mkdtemp(prefix="devmap-kv-")
    failures = []
    for name, cfg in CASES.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
        folder = os.path.join(work, name)
        model.save_pretrained(folder)
        for n in (3, 6, 20):
            cache = DynamicCache(config=model.config)
            with torch.no_grad():
                model(torch.arange(BATCH * n).reshape(BATCH, n) % 64, past_key_values=cache, use_cache=True)
            theirs = [held(layer) for layer in cache.layers]
            r = subprocess.run([devmap, "plan", folder, "--max-memory", "cpu=10GiB", "--context", str(n),
                                "--batch", str(BATCH), "--json"], capture_output=True, text=True)
            if r.returncode != 0:
                failures.append(f"{name} at {n}: plan failed: {r.stderr}")
                continue
            ours = json.loads(r.stdout)["kv_cache"]
            per_layer = [layer["bytes"] for layer in ours["layers"]]
            if per_layer != theirs or ours["bytes"] != sum(theirs):
                failures.append(f"{name} at {n} tokens: devmap {per_layer} (= {ours['bytes']}), "
                                f"transformers {theirs} (= {sum(theirs)})")
                continue
            print(f"ok: {name} at {n} tokens × {BATCH}: {sum(theirs)} bytes in {len(theirs)} layers, "
                  "each as transformers' DynamicCache holds it")
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
