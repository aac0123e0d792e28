"""devmap converts Megatron-Core checkpoints of DeepSeek-V3-shaped and GLM-4-MoE-shaped
models (`dist_checkpointing`, torch_dist) to transformers' DeepseekV3ForCausalLM and
Glm4MoeForCausalLM, checked against megatron-core.

Both are GPTModels of 4 layers built from megatron-core's own decoder block spec
(`get_gpt_decoder_block_spec`, local modules) with `moe_layer_freq [0, 1, 1, 1]` (a
dense first layer, then MoE layers: saved a layer apart), 4 routed experts in 2 groups
(top 2, one group a token), a sigmoid router with its expert bias
(`moe_router_enable_expert_bias`; set to random values here, as training's load
balancing leaves it) and a scaling factor of 2.5, and an ungated shared expert of twice
an expert's width:

- DeepSeek-V3-shaped: multi-latent attention (q_lora_rank 24, kv_lora_rank 16, head
  dims 16 + 8 rotary, values 12; `q_layernorm`/`kv_layernorm`) with YaRN (factor 4
  over 16 positions, mscale_all_dim 1: MLA's default rope type; plain RoPE is the
  same config without `rope_parameters`' YaRN fields, checked by a unit test);
- GLM-4-MoE-shaped: grouped-query attention with query/key/value biases and RoPE on
  half of each head (`rotary_percent 0.5`).

Each is trained one SGD step on CPU with gloo and saved as Megatron-LM's training loop
saves it (args in common.pt), then resharded by megatron-core into TP=2 (GLM-4-MoE:
and EP=2) and saved again. Then:

- `devmap save DIR --out OUT` writes, bit for bit, the Megatron model's own parameters
  renamed as transformers names them (the latent attention's by renames only; the
  router's bias as `mlp.gate.e_score_correction_bias`, the shared expert as
  `mlp.shared_experts`), in the stored dtype; TP=2 and EP=2 give outputs identical
  to TP=1's; `verify OUT` is clean;
- `from_pretrained(OUT)` (config.json written by devmap from the args) gives the logits
  of the Megatron model's own forward to float32 rounding;
- `devmap plan DIR --tp 2` / `--ep 2` gives each rank the bytes megatron-core's rank
  holds (`rank_bytes`: vLLM's layout, MLA's down projections whole);
- a grouping transformers cannot compute (top k / group top k other than 2) is refused
  naming the argument, with nothing written.

megatron-core 0.16.1's latent attention needs Transformer Engine for its core attention
(the local `DotProductAttention` takes no separate key and value head dims): here a
plain causal softmax attention with MLA's own softmax scale stands in for it; the
projections, norms, rotary embedding, routing and experts are megatron-core's. The
reference converter (Megatron-Bridge) needs Transformer Engine and a GPU; not run.

Usage: python megatron_deepseek.py PATH/TO/devmap
"""

import argparse
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_dist as base  # noqa: E402
import saved  # noqa: E402

LAYERS, HIDDEN, HEADS, VOCAB, FFN = 4, 64, 4, 128, 96
EXPERTS, MOE_FFN, TOP_K, GROUPS, GROUP_TOPK, SCALING, SHARED_FFN = 4, 32, 2, 2, 1, 2.5, 64
MLA = dict(q_lora_rank=24, kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=12)
YARN = dict(rope_type="yarn", rotary_scaling_factor=4.0, original_max_position_embeddings=16,
            beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
GLM_GROUPS = 2


class CoreAttention(torch.nn.Module):
    """Causal softmax attention with the scale MLA gives (a stand-in for Transformer
    Engine's, which megatron-core's MLA needs): [s, b, h, d] in, [s, b, h·dv] out."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, softmax_scale=None, **_):
        super().__init__()
        self.scale = softmax_scale

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, **_):
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        n = scores.shape[-1]
        scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
        out = torch.matmul(torch.softmax(scores.float(), -1).to(v.dtype), v)
        return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)


def moe_fields():
    return dict(moe_router_topk=TOP_K, moe_ffn_hidden_size=MOE_FFN, moe_router_score_function="sigmoid",
                moe_router_enable_expert_bias=True, moe_router_num_groups=GROUPS,
                moe_router_group_topk=GROUP_TOPK, moe_router_topk_scaling_factor=SCALING,
                moe_shared_expert_intermediate_size=SHARED_FFN, moe_layer_freq=[0, 1, 1, 1])


def eps(kind):
    """DeepSeek-V3's norms' epsilon (transformers' latent norms have 1e-6 built in)."""
    return 1e-6 if kind.startswith("deepseek") else 1e-5


def build(kind, tp, ep):
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    common = dict(num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_hidden_size=FFN,
                  normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
                  add_bias_linear=False, use_cpu_initialization=True, params_dtype=torch.float32,
                  layernorm_epsilon=eps(kind), hidden_dropout=0.0, attention_dropout=0.0,
                  num_moe_experts=EXPERTS, moe_token_dispatcher_type="allgather", moe_grouped_gemm=False,
                  tensor_model_parallel_size=tp, expert_model_parallel_size=ep, **moe_fields())
    if kind.startswith("deepseek"):
        cfg = MLATransformerConfig(**common, **MLA, **YARN, qk_layernorm=True)
    else:
        cfg = TransformerConfig(**common, num_query_groups=GLM_GROUPS, add_qkv_bias=True)
    spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm")
    if kind.startswith("deepseek"):
        for layer in spec.layer_specs:
            layer.submodules.self_attention.submodules.core_attention = ModuleSpec(module=CoreAttention)
    return GPTModel(cfg, spec, vocab_size=VOCAB, max_sequence_length=64, position_embedding_type="rope",
                    share_embeddings_and_output_weights=False, parallel_output=False,
                    pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                    rotary_base=10000, rotary_percent=1.0 if kind.startswith("deepseek") else 0.5)


def megatron_args(kind):
    """What Megatron-LM's argument parser keeps for these runs (its names)."""
    extra = dict(MLA, **YARN, multi_latent_attention=True, qk_layernorm=True) if kind.startswith("deepseek") else dict(
        group_query_attention=True, num_query_groups=GLM_GROUPS, add_qkv_bias=True, rotary_percent=0.5)
    fields = moe_fields()
    fields["num_experts"] = EXPERTS
    return argparse.Namespace(**extra, **fields,
        num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        normalization="RMSNorm", swiglu=True, norm_epsilon=eps(kind), rotary_base=10000,
        max_position_embeddings=64, seq_length=64, position_embedding_type="rope",
        untie_embeddings_and_output_weights=True, add_bias_linear=False, params_dtype=torch.float32,
        padded_vocab_size=VOCAB, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


def rank_main(rank, world, port, job):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    import megatron.core.transformer.multi_latent_attention as mla

    base.cpu_only()
    # megatron-core 0.16.1's MLA asks isinstance(…, TELinear) when it thinks TE is there.
    mla.HAVE_TE = False
    dist.init_process_group("gloo")
    ps.initialize_model_parallel(tensor_model_parallel_size=job["tp"], expert_model_parallel_size=job["ep"])
    torch.manual_seed(0)
    model = build(job["kind"], job["tp"], job["ep"])
    if job.get("load"):
        state = dist_checkpointing.load({"model": model.sharded_state_dict()}, job["load"])
        model.load_state_dict(state["model"])
        with open(f"{job['out']}.sizes.{rank}", "w") as f:
            f.write(str(rank_bytes(model, job["tp"])))
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        base.forward(model).square().mean().backward()
        opt.step()
        # The bias training's load balancing would have left: not zeros.
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name.endswith("router.expert_bias"):
                    buffer.copy_(torch.randn(buffer.shape, generator=torch.Generator().manual_seed(len(name))) * 0.2)
        torch.save({k: v for k, v in model.state_dict().items() if "_extra_state" not in k}, job["state"])
        torch.save(base.logits(model), job["logits"])
    state = {"model": model.sharded_state_dict(), "iteration": 1, "checkpoint_version": 3.0,
             "args": megatron_args(job["kind"])}
    if rank == 0:
        os.makedirs(job["out"], exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(state, job["out"])
    dist.barrier()
    dist.destroy_process_group()


def rank_bytes(model, tp):
    """The bytes this rank holds, the oracle for `devmap plan --tp/--ep` (vLLM's
    layout): its parameters, with the router's expert bias (a buffer megatron-core
    saves; vLLM's e_score_correction_bias, on every rank), and MLA's down projections
    whole: megatron-core's local spec splits them over TP ranks, but its Transformer
    Engine spec duplicates them (`parallel_mode="duplicated"`), as vLLM replicates
    q_a_proj and kv_a_proj_with_mqa."""
    total = 0
    for name, p in model.named_parameters():
        whole = ".linear_q_down_proj." in name or ".linear_kv_down_proj." in name
        total += p.numel() * p.element_size() * (tp if whole else 1)
    for name, b in model.named_buffers():
        if name.endswith("router.expert_bias"):
            total += b.numel() * b.element_size()
    return total


def run_job(job, world, ports):
    base.run_job(job, world, ports, rank_main)


def hf_names(state, kind):
    """The Megatron model's own parameters renamed (and cut) as transformers names them."""
    out = {
        "model.embed_tokens.weight": state["embedding.word_embeddings.weight"],
        "model.norm.weight": state["decoder.final_layernorm.weight"],
        "lm_head.weight": state["output_layer.weight"],
    }
    for i in range(LAYERS):
        p, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        a = p + "self_attention."
        if kind.startswith("deepseek"):
            for megatron, hf in [("linear_q_down_proj", "q_a_proj"), ("q_layernorm", "q_a_layernorm"),
                                 ("linear_q_up_proj", "q_b_proj"), ("linear_kv_down_proj", "kv_a_proj_with_mqa"),
                                 ("kv_layernorm", "kv_a_layernorm"), ("linear_kv_up_proj", "kv_b_proj")]:
                out[f"{h}self_attn.{hf}.weight"] = state[f"{a}{megatron}.weight"]
        else:
            per_group, hd = HEADS // GLM_GROUPS, HIDDEN // HEADS
            for suffix, shape in [("weight", (GLM_GROUPS, per_group + 2, hd, HIDDEN)),
                                  ("bias", (GLM_GROUPS, per_group + 2, hd))]:
                qkv = state[f"{a}linear_qkv.{suffix}"].view(shape)
                out[f"{h}self_attn.q_proj.{suffix}"] = qkv[:, :per_group].reshape(-1, *shape[3:])
                out[f"{h}self_attn.k_proj.{suffix}"] = qkv[:, per_group].reshape(-1, *shape[3:])
                out[f"{h}self_attn.v_proj.{suffix}"] = qkv[:, per_group + 1].reshape(-1, *shape[3:])
        out[h + "self_attn.o_proj.weight"] = state[a + "linear_proj.weight"]
        out[h + "input_layernorm.weight"] = state[p + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = state[p + "pre_mlp_layernorm.weight"]
        mlps = [(p + "mlp.", h + "mlp.")] if i == 0 else [(p + "mlp.shared_experts.", h + "mlp.shared_experts.")]
        if i > 0:
            out[h + "mlp.gate.weight"] = state[p + "mlp.router.weight"]
            out[h + "mlp.gate.e_score_correction_bias"] = state[p + "mlp.router.expert_bias"]
            mlps += [(f"{p}mlp.experts.local_experts.{e}.", f"{h}mlp.experts.{e}.") for e in range(EXPERTS)]
        for src, dst in mlps:
            gate, up = state[src + "linear_fc1.weight"].chunk(2)
            out[dst + "gate_proj.weight"] = gate
            out[dst + "up_proj.weight"] = up
            out[dst + "down_proj.weight"] = state[src + "linear_fc2.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def main():
    exe = os.path.abspath(sys.argv[1])
    work = saved.workdir("devmap-megatron-deepseek-")
    ports = iter(range(29811, 29900))
    for kind, architecture, splits in [("deepseek", "DeepseekV3ForCausalLM", [("TP=2", 2, 1)]),
                                       ("glm", "Glm4MoeForCausalLM", [("TP=2", 2, 1), ("EP=2", 1, 2)])]:
        tp1 = os.path.join(work, f"{kind}-tp1")
        state_file, ref_logits = os.path.join(work, f"{kind}-state.pt"), os.path.join(work, f"{kind}-logits.pt")
        run_job({"kind": kind, "tp": 1, "ep": 1, "out": tp1, "state": state_file, "logits": ref_logits},
                1, [next(ports), next(ports)])
        layouts = {"TP=1": tp1}
        for name, tp, ep in splits:
            folder = os.path.join(work, f"{kind}-{name[:2].lower()}2")
            run_job({"kind": kind, "tp": tp, "ep": ep, "out": folder, "load": tp1}, 2, [next(ports), next(ports)])
            layouts[name] = folder
            base.ranks_match(exe, folder, f"{folder}.sizes", 2, ["--tp", str(tp), "--ep", str(ep)], f"{kind} {name}")
        want = hf_names(torch.load(state_file), kind)
        tp1_out = base.converts_bit_for_bit(exe, work, kind, layouts, want, architecture, ref_logits)
        config = json.load(open(os.path.join(tp1_out, "config.json")))
        assert config["first_k_dense_replace"] == 1 and config["n_shared_experts"] == SHARED_FFN // MOE_FFN, config

    # A grouping transformers cannot compute: refused by name, nothing written.
    grouped = os.path.join(work, "grouped")
    shutil.copytree(os.path.join(work, "glm-tp1"), grouped)
    common = torch.load(os.path.join(grouped, "common.pt"), weights_only=False)
    common["args"].moe_router_topk = 4
    torch.save(common, os.path.join(grouped, "common.pt"))
    base.refused(exe, grouped, work, "top 4 of one group", "moe_router_group_topk")
    # Latent norms whose epsilon transformers' DeepSeek-V3 cannot take.
    other_eps = os.path.join(work, "other-eps")
    shutil.copytree(os.path.join(work, "deepseek-tp1"), other_eps)
    common = torch.load(os.path.join(other_eps, "common.pt"), weights_only=False)
    common["args"].norm_epsilon = 1e-5
    torch.save(common, os.path.join(other_eps, "common.pt"))
    base.refused(exe, other_eps, work, "latent norms of epsilon 1e-5", "norm_epsilon = 1e-6")
    print("megatron deepseek/glm: all checks passed")


if __name__ == "__main__":
    main()
