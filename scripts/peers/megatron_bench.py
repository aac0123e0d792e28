"""The Megatron-Core side of scripts/bench_megatron.sh.

  save DIR LAYERS HIDDEN: a Llama-flavoured GPTModel (RMSNorm, SwiGLU, GQA 4:1,
      float32) built by 2 gloo ranks at TP=2 and saved as Megatron-LM saves it.
  peer DIR OUT LAYERS HIDDEN: what a user without devmap does: megatron-core's own
      `dist_checkpointing.load` into a TP=1 model, the parameters cut and renamed to
      transformers' Llama names with torch, `safetensors` save_file.

With FSDP=1 in the environment, `save` writes Megatron-LM's `fsdp_dtensor` format
instead (the model at TP=1 on 2 data-parallel ranks, each holding part of every
parameter's rows: tests/python/megatron_fsdp.py's Megatron-FSDP state, no optimizer),
and `peer` is torch's own consolidation of a DCP folder (`dcp_to_torch_save`), then
the same cut and rename.

With EXPERTS=N in the environment, every layer's MLP is a mixture of N experts
(megatron-core's SequentialMLP, FFN 7/4 · hidden, top 2, Mixtral-like), saved at EP=2
instead of TP=2; the peer loads it into an EP=1 model and renames to Mixtral's names.
"""

import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

VOCAB = 32000
EXPERTS = int(os.environ.get("EXPERTS", "0"))
FSDP = os.environ.get("FSDP") == "1"


def cpu_only():
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core import tensor_parallel

    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    # megatron-core 0.16.1's router names Transformer Engine's GEMM without it installed.
    import megatron.core.transformer.moe.moe_utils as moe_utils

    moe_utils.te_general_gemm = None


def build(layers, hidden, tp, ep=1):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    moe, spec = {}, get_gpt_layer_local_spec()
    if EXPERTS:
        moe = dict(num_moe_experts=EXPERTS, moe_router_topk=2, moe_ffn_hidden_size=hidden * 7 // 4,
                   moe_token_dispatcher_type="allgather", expert_model_parallel_size=ep)
        spec = get_gpt_layer_local_spec(num_experts=EXPERTS, moe_grouped_gemm=False)
    cfg = TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=hidden // 64,
                            num_query_groups=hidden // 256, ffn_hidden_size=hidden * 11 // 4,
                            normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
                            add_bias_linear=False, use_cpu_initialization=True, params_dtype=torch.float32,
                            tensor_model_parallel_size=tp, perform_initialization=False, **moe)
    return GPTModel(cfg, spec, vocab_size=VOCAB, max_sequence_length=4096,
                    position_embedding_type="rope", share_embeddings_and_output_weights=False)


def args(layers, hidden):
    moe = {}
    if EXPERTS:
        moe = dict(num_experts=EXPERTS, moe_router_topk=2, moe_ffn_hidden_size=hidden * 7 // 4,
                   moe_router_score_function="softmax")
    return argparse.Namespace(**moe, num_layers=layers, hidden_size=hidden, ffn_hidden_size=hidden * 11 // 4,
                              num_attention_heads=hidden // 64, group_query_attention=True,
                              num_query_groups=hidden // 256, kv_channels=64, normalization="RMSNorm",
                              swiglu=True, norm_epsilon=1e-5, rotary_base=10000,
                              max_position_embeddings=4096, position_embedding_type="rope")


def init(rank, world, tp, ep=1):
    from megatron.core import parallel_state as ps

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29731", RANK=str(rank), WORLD_SIZE=str(world))
    cpu_only()
    dist.init_process_group("gloo")
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)


def save_rank(rank, out, layers, hidden):
    from megatron.core import dist_checkpointing

    tp, ep = (1, 2) if EXPERTS else (1, 1) if FSDP else (2, 1)
    init(rank, 2, tp, ep)
    # Data-parallel ranks hold the same weights.
    torch.manual_seed(0 if FSDP else rank)
    model = build(layers, hidden, tp, ep)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    if rank == 0:
        os.makedirs(out, exist_ok=True)
    dist.barrier()
    if FSDP:
        import torch.distributed.checkpoint as dcp

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))
        import megatron_fsdp

        state = megatron_fsdp.fsdp_state(model, rank, 2, (tp, ep), args(layers, hidden), None, with_optimizer=False)
        dcp.save(state, storage_writer=dcp.FileSystemWriter(out))
    else:
        dist_checkpointing.save({"model": model.sharded_state_dict(), "args": args(layers, hidden)}, out)
    dist.barrier()
    dist.destroy_process_group()


def peer(src, out, layers, hidden):
    from megatron.core import dist_checkpointing
    from safetensors.torch import save_file

    if FSDP:
        import tempfile

        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out))) as tmp:
            dcp_to_torch_save(src, os.path.join(tmp, "whole.pt"))
            model_sd = torch.load(os.path.join(tmp, "whole.pt"), weights_only=False)["model"]
        sd = {k.removeprefix("module."): v for k, v in model_sd.items()}
    else:
        init(0, 1, 1)
        model = build(layers, hidden, 1)
        state = dist_checkpointing.load({"model": model.sharded_state_dict()}, src)
        model.load_state_dict(state["model"])
        sd = model.state_dict()
    groups, hd = hidden // 256, 64
    per_group = (hidden // 64) // groups
    hf = {"model.embed_tokens.weight": sd["embedding.word_embeddings.weight"],
          "model.norm.weight": sd["decoder.final_layernorm.weight"], "lm_head.weight": sd["output_layer.weight"]}
    for i in range(layers):
        p, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = sd[p + "self_attention.linear_qkv.weight"].view(groups, per_group + 2, hd, hidden)
        hf[h + "self_attn.q_proj.weight"] = qkv[:, :per_group].reshape(-1, hidden)
        hf[h + "self_attn.k_proj.weight"] = qkv[:, per_group].reshape(-1, hidden)
        hf[h + "self_attn.v_proj.weight"] = qkv[:, per_group + 1].reshape(-1, hidden)
        hf[h + "self_attn.o_proj.weight"] = sd[p + "self_attention.linear_proj.weight"]
        hf[h + "input_layernorm.weight"] = sd[p + "input_layernorm.weight"]
        hf[h + "post_attention_layernorm.weight"] = sd[p + "pre_mlp_layernorm.weight"]
        if EXPERTS:
            m = h + "block_sparse_moe."
            hf[m + "gate.weight"] = sd[p + "mlp.router.weight"]
            for e in range(EXPERTS):
                x = f"{p}mlp.experts.local_experts.{e}."
                gate, up = sd[x + "linear_fc1.weight"].chunk(2)
                hf[f"{m}experts.{e}.w1.weight"], hf[f"{m}experts.{e}.w3.weight"] = gate, up
                hf[f"{m}experts.{e}.w2.weight"] = sd[x + "linear_fc2.weight"]
            continue
        fc1 = p + "mlp.linear_fc1.weight"
        # fsdp_dtensor keeps the gate and the up projection apart (`_w`, `_v`).
        gate, up = (sd[fc1 + "_w"], sd[fc1 + "_v"]) if FSDP else sd[fc1].chunk(2)
        hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"] = gate, up
        hf[h + "mlp.down_proj.weight"] = sd[p + "mlp.linear_fc2.weight"]
    os.makedirs(out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in hf.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "save":
        out, layers, hidden = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        torch.multiprocessing.spawn(save_rank, args=(out, layers, hidden), nprocs=2, join=True)
    else:
        peer(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
