"""devmap converts Megatron-Core mixture-of-experts checkpoints (`dist_checkpointing`,
torch_dist) to transformers' Qwen3-MoE, Mixtral and Qwen2-MoE, checked against
megatron-core.

The GPTModel of megatron_dist.py with MoE layers (megatron-core's local spec: a router
and `SequentialMLP` experts, 4 experts, top 2, top-k then softmax; allgather dispatch,
which runs on CPU), trained one SGD step on CPU with gloo, saved as Megatron-LM saves
it; then resharded by megatron-core itself into TP=2 and into EP=2 (each rank holds
half the experts) and saved again, both also in megatron-core's `singleton_local_shards`
form (each expert, and each half of a gated `linear_fc1`, a tensor of its own). With
per-head q/k norms it is Qwen3-MoE-shaped, without them Mixtral-shaped; with a gated shared expert (`moe_shared_expert_gate`),
QKV biases and the top k of a softmax (`moe_router_pre_softmax`) Qwen2-MoE-shaped
(also resharded into TP=2). For each:

- `devmap save DIR --out OUT` writes, bit for bit, the Megatron model's own parameters
  (router → `mlp.gate` / `block_sparse_moe.gate`; each expert's `linear_fc1` cut with
  torch into gate and up, `linear_fc2` as down / w1, w3, w2), in the stored dtype;
  TP=2 and EP=2 give byte-identical outputs to TP=1's; `verify OUT` is clean;
- config.json (written by devmap from the args: `Qwen3MoeForCausalLM` with
  `norm_topk_prob`, or `MixtralForCausalLM`) loads with `from_pretrained`, whose logits
  equal the Megatron model's forward to float32 rounding;
- a router devmap cannot express (`moe_router_score_function = sigmoid`) is refused
  naming the argument, and a shared expert asked to become Qwen3-MoE (`--config` of a
  qwen3_moe model) naming the tensor, with nothing written.

Usage: python megatron_moe.py PATH/TO/devmap
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_dist as base  # noqa: E402
import saved  # noqa: E402


def hf_names(state, family):
    """The Megatron model's own parameters, cut and renamed as transformers names them."""
    per_group = base.HEADS // base.GROUPS
    hd = base.HIDDEN // base.HEADS
    out = {
        "model.embed_tokens.weight": state["embedding.word_embeddings.weight"],
        "model.norm.weight": state["decoder.final_layernorm.weight"],
        "lm_head.weight": state["output_layer.weight"],
    }
    for i in range(base.LAYERS):
        p, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = state[p + "self_attention.linear_qkv.weight"].view(base.GROUPS, per_group + 2, hd, base.HIDDEN)
        out[h + "self_attn.q_proj.weight"] = qkv[:, :per_group].reshape(-1, base.HIDDEN)
        out[h + "self_attn.k_proj.weight"] = qkv[:, per_group].reshape(-1, base.HIDDEN)
        out[h + "self_attn.v_proj.weight"] = qkv[:, per_group + 1].reshape(-1, base.HIDDEN)
        out[h + "self_attn.o_proj.weight"] = state[p + "self_attention.linear_proj.weight"]
        if family == "qwen2_moe":
            bias = state[p + "self_attention.linear_qkv.bias"].view(base.GROUPS, per_group + 2, hd)
            out[h + "self_attn.q_proj.bias"] = bias[:, :per_group].reshape(-1)
            out[h + "self_attn.k_proj.bias"] = bias[:, per_group].reshape(-1)
            out[h + "self_attn.v_proj.bias"] = bias[:, per_group + 1].reshape(-1)
            x = p + "mlp.shared_experts."
            gate, up = state[x + "linear_fc1.weight"].chunk(2)
            out[h + "mlp.shared_expert.gate_proj.weight"] = gate
            out[h + "mlp.shared_expert.up_proj.weight"] = up
            out[h + "mlp.shared_expert.down_proj.weight"] = state[x + "linear_fc2.weight"]
            out[h + "mlp.shared_expert_gate.weight"] = state[x + "gate_weight"]
        if family == "qwen3_moe":
            out[h + "self_attn.q_norm.weight"] = state[p + "self_attention.q_layernorm.weight"]
            out[h + "self_attn.k_norm.weight"] = state[p + "self_attention.k_layernorm.weight"]
        out[h + "input_layernorm.weight"] = state[p + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = state[p + "pre_mlp_layernorm.weight"]
        qwen = family != "mixtral"
        moe = h + ("mlp." if qwen else "block_sparse_moe.")
        names = ("gate_proj", "up_proj", "down_proj") if qwen else ("w1", "w3", "w2")
        out[moe + "gate.weight"] = state[p + "mlp.router.weight"]
        for e in range(base.EXPERTS):
            x = f"{p}mlp.experts.local_experts.{e}."
            gate, up = state[x + "linear_fc1.weight"].chunk(2)
            out[f"{moe}experts.{e}.{names[0]}.weight"] = gate
            out[f"{moe}experts.{e}.{names[1]}.weight"] = up
            out[f"{moe}experts.{e}.{names[2]}.weight"] = state[x + "linear_fc2.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def main():
    exe = os.path.abspath(sys.argv[1])
    work = saved.workdir("devmap-megatron-moe-")
    ports = iter(range(29711, 29800))
    for family, qk_norm, architecture in [("qwen3_moe", True, "Qwen3MoeForCausalLM"),
                                          ("mixtral", False, "MixtralForCausalLM"),
                                          ("qwen2_moe", False, "Qwen2MoeForCausalLM")]:
        moe = {"qk_norm": qk_norm, "shared": family == "qwen2_moe"}
        tp1 = os.path.join(work, f"{family}-tp1")
        state_file, ref_logits = os.path.join(work, f"{family}-state.pt"), os.path.join(work, f"{family}-logits.pt")
        base.run_job({"tp": 1, "pp": 1, "dtype": "float32", "out": tp1, "state": state_file,
                      "logits": ref_logits, "moe": moe}, 1, [next(ports), next(ports)])
        layouts = {"TP=1": tp1}
        if family != "mixtral":
            # Qwen2-MoE: resharded into TP=2 (its shared expert split as a dense MLP is).
            splits = [("TP=2", 2, 1), ("EP=2", 1, 2)] if family == "qwen3_moe" else [("TP=2", 2, 1)]
            if family == "qwen3_moe":
                # The same weights in megatron-core's singleton_local_shards form.
                splits += [("TP=2 singleton", 2, 1), ("EP=2 singleton", 1, 2)]
            for name, tp, ep in splits:
                singleton = name.endswith("singleton")
                folder = os.path.join(work, f"{family}-{name[:2].lower()}2{'-singleton' if singleton else ''}")
                sizes = os.path.join(work, f"{family}-sizes-{name[:2]}")
                base.run_job({"tp": tp, "pp": 1, "ep": ep, "dtype": "float32", "out": folder, "load": tp1,
                              "moe": moe, "sizes": sizes, "singleton": singleton}, 2, [next(ports), next(ports)])
                layouts[name] = folder
                if family == "qwen3_moe" and not singleton:
                    base.ranks_match(exe, folder, sizes, 2, ["--tp", str(tp), "--ep", str(ep)], f"{family} {name}")
        want = hf_names(torch.load(state_file), family)
        base.converts_bit_for_bit(exe, work, family, layouts, want, architecture, ref_logits)

    # A router transformers' Qwen3-MoE cannot compute: refused by name.
    sigmoid = os.path.join(work, "sigmoid")
    import shutil

    shutil.copytree(os.path.join(work, "qwen3_moe-tp1"), sigmoid)
    common = torch.load(os.path.join(sigmoid, "common.pt"), weights_only=False)
    common["args"].moe_router_score_function = "sigmoid"
    torch.save(common, os.path.join(sigmoid, "common.pt"))
    base.refused(exe, sigmoid, work, "a sigmoid router", "moe_router_score_function")
    # A shared expert where the family asked for has none: refused naming the tensor.
    out = os.path.join(work, "shared-as-qwen3-out")
    r = base.devmap(exe, "save", os.path.join(work, "qwen2_moe-tp1"), "--out", out,
                    "--config", os.path.join(work, "qwen3_moe-out-TP1"))
    assert r.returncode != 0 and "shared_experts" in r.stderr and "qwen3_moe" in r.stderr, r.stderr
    assert not os.path.exists(out), f"{out} was written"
    print(f"a shared expert as Qwen3-MoE: refused ({r.stderr.strip().splitlines()[-1][:150]}...)")
    print("megatron moe: all checks passed")


if __name__ == "__main__":
    main()
