"""devmap converts Megatron-Core distributed checkpoints (`dist_checkpointing.save`,
torch_dist) to the checkpoint transformers loads, checked against megatron-core itself.

A tiny Llama-flavoured GPTModel (local layer spec, RMSNorm, SwiGLU, 8 query heads in 2
groups, 4 layers, untied head) is built on CPU with gloo, trained one SGD step, and
saved as Megatron-LM's training loop saves it: `{"args": Namespace, "iteration",
"checkpoint_version", "model": model.sharded_state_dict()}`. The same weights are then
loaded by megatron-core into a TP=2 model and a PP=2 model (its own resharding), which
save again. For each of the three, and for a bf16 run:

- `devmap save DIR --out OUT` writes, bit for bit, the tensors the Megatron model's own
  state dict holds, renamed and cut as transformers' Llama names them (q/k/v out of the
  per-group `linear_qkv`, gate/up out of `linear_fc1`: cut here with torch from the
  model's parameters, not from the files), in the stored dtype;
- the save says what it left out (Transformer Engine's `_extra_state`); `verify OUT` is
  clean (names and shapes as transformers' LlamaForCausalLM expects);
- TP=2 and PP=2 outputs are byte-identical to TP=1's;
- `from_pretrained(OUT)` (config.json written by devmap from the args) gives the logits
  of the Megatron model's own forward (TP=1, and TP=2 with its all-reduces), to float32
  rounding: the two compute the same function in a different order (a fused QKV GEMM);
- without args in common.pt, the save is refused naming what it needs, and succeeds
  with `--config` of the written config.json;
- hostile: a missing rank file, a `.distcp` cut short, a common.pt whose pickle names a
  callable, and a model with biases (no map for `linear_proj.bias`) are refused by
  name, with nothing written.

The reference converter (Megatron-Bridge) needs Transformer Engine and a GPU; it is not
run here: the model's own parameters and forward are the reference.

megatron-core 0.16 needs two CUDA calls pointed at the CPU to save there (the writer's
`torch.cuda.synchronize` and the failure flag's device), and its attention's RNG fork
made a no-op to run forward (dropout is off).

Usage: python megatron_dist.py PATH/TO/devmap
"""

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import saved  # noqa: E402

INPUT = torch.tensor([[1, 5, 9, 33, 2, 17, 60, 3]])
LAYERS, HIDDEN, HEADS, GROUPS, FFN, VOCAB = 4, 64, 8, 2, 96, 128


def cpu_only():
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core import tensor_parallel

    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    # megatron-core 0.16.1's router names Transformer Engine's GEMM without it installed.
    import megatron.core.transformer.moe.moe_utils as moe_utils

    moe_utils.te_general_gemm = None


# A mixture-of-experts variant (tests/python/megatron_moe.py): experts, each expert's
# FFN, top k; `qk_norm` makes it Qwen3-MoE-like, without it Mixtral-like.
EXPERTS, MOE_FFN, TOP_K = 4, 32, 2
# The shared expert's FFN (the Qwen2-MoE-shaped variant, `moe["shared"]`).
SHARED_FFN = 48


def build(dtype, tp, pp, bias=False, moe=None, ep=1):
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    extra, spec = {}, get_gpt_layer_local_spec()
    if moe is not None:
        extra = dict(num_moe_experts=EXPERTS, moe_router_topk=TOP_K, moe_ffn_hidden_size=MOE_FFN,
                     moe_token_dispatcher_type="allgather", moe_router_pre_softmax=False,
                     qk_layernorm=moe["qk_norm"], expert_model_parallel_size=ep)
        if moe.get("shared"):
            # Qwen2-MoE-shaped: a gated shared expert, QKV biases, top k of a softmax.
            extra.update(moe_shared_expert_intermediate_size=SHARED_FFN, moe_shared_expert_gate=True,
                         add_qkv_bias=True, moe_router_pre_softmax=True)
        spec = get_gpt_layer_local_spec(num_experts=EXPERTS, moe_grouped_gemm=False,
                                        qk_layernorm=moe["qk_norm"])
    cfg = TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
        ffn_hidden_size=FFN, normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=bias, use_cpu_initialization=True, params_dtype=dtype, pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16, layernorm_epsilon=1e-5, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, **extra)
    return GPTModel(cfg, spec, vocab_size=VOCAB, max_sequence_length=64,
                    position_embedding_type="rope", share_embeddings_and_output_weights=False,
                    parallel_output=False, pre_process=ps.is_pipeline_first_stage(),
                    post_process=ps.is_pipeline_last_stage(), rotary_base=10000)


def megatron_args(dtype, bias=False, moe=None):
    """What Megatron-LM's argument parser keeps (the part a config needs, and an enum)."""
    from megatron.core.transformer.enums import AttnBackend

    extra = {}
    if moe is not None:
        shared = moe.get("shared", False)
        extra = dict(num_experts=EXPERTS, moe_router_topk=TOP_K, moe_ffn_hidden_size=MOE_FFN,
                     moe_router_pre_softmax=shared, moe_router_score_function="softmax",
                     moe_router_topk_scaling_factor=None,
                     moe_shared_expert_intermediate_size=SHARED_FFN if shared else None,
                     moe_shared_expert_gate=shared, add_qkv_bias=shared,
                     qk_layernorm=moe["qk_norm"], expert_model_parallel_size=1)
    return argparse.Namespace(**extra,
        num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        group_query_attention=True, num_query_groups=GROUPS, kv_channels=HIDDEN // HEADS,
        normalization="RMSNorm", swiglu=True, norm_epsilon=1e-5, rotary_base=10000,
        max_position_embeddings=64, seq_length=64, position_embedding_type="rope",
        untie_embeddings_and_output_weights=True, add_bias_linear=bias, params_dtype=dtype,
        bf16=dtype == torch.bfloat16, attention_backend=AttnBackend.local, padded_vocab_size=VOCAB,
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


def model_fields(config, target):
    """Every field of the model's TransformerConfig with its value (defaults included),
    plus the GPT fields NeMo's LlamaConfig and Megatron-Bridge's model providers add, as
    both serialise them: a function or class as `{_call_, _target_}` (their fallback
    representer), other objects left out."""
    import dataclasses
    import inspect

    def represent(value):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if callable(value) and hasattr(value, "__qualname__"):
            return {"_call_": False, "_target_": f"{inspect.getmodule(value).__name__}.{value.__qualname__}"}
        if isinstance(value, torch.dtype):
            return {"_call_": True, "_target_": "torch.dtype"}
        return represent(value.value) if hasattr(value, "value") else None

    fields = {f.name: represent(getattr(config, f.name)) for f in dataclasses.fields(config)
              if not f.name.startswith("_")}
    fields.update(_target_=target, seq_length=64, rotary_base=10000, position_embedding_type="rope",
                  share_embeddings_and_output_weights=False, make_vocab_size_divisible_by=128,
                  vocab_size=None)
    return fields


def nemo_context(config, folder):
    """context/model.yaml as NeMo 2's `io_dump` writes it (NeMo is not installed here:
    built to its layout): the model class as `_target_`, and under `config:` the
    model's configuration (`model_fields`). An `io.json` beside it in real checkpoints
    (fiddle's graph) is not read by devmap and not written here."""
    import yaml

    fields = model_fields(config, "nemo.collections.llm.gpt.model.llama.LlamaConfig")
    model = {"_target_": "nemo.collections.llm.gpt.model.llama.LlamaModel", "config": fields,
             "model_transform": None, "optim": {"_target_": "nemo.lightning.pytorch.optim.megatron.MegatronOptimizerModule"},
             "tokenizer": None}
    os.makedirs(os.path.join(folder, "context"), exist_ok=True)
    with open(os.path.join(folder, "context", "model.yaml"), "w") as f:
        yaml.safe_dump(model, f, sort_keys=True)
    # The tokenizer as NeMo's importer keeps it (transformers' `save_pretrained` into
    # context/nemo_tokenizer/), and generation_config.json in context/artifacts/.
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "the", "model"])},
                                       unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokenizer.save_pretrained(os.path.join(folder, "context", "nemo_tokenizer"))
    GenerationConfig(bos_token_id=1, eos_token_id=2, temperature=0.6, do_sample=True).save_pretrained(
        os.path.join(folder, "context", "artifacts"))


def forward(model):
    mask = torch.triu(torch.ones(8, 8), diagonal=1).bool()[None, None]
    return model(INPUT, torch.arange(8).unsqueeze(0), mask).float()


def logits(model):
    model.eval()
    with torch.no_grad():
        return forward(model)


def rank_main(rank, world, port, job):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    cpu_only()
    dist.init_process_group("gloo")
    ps.initialize_model_parallel(tensor_model_parallel_size=job["tp"],
                                 pipeline_model_parallel_size=job["pp"],
                                 expert_model_parallel_size=job.get("ep", 1))
    dtype = getattr(torch, job["dtype"])
    torch.manual_seed(0)
    model = build(dtype, job["tp"], job["pp"], job.get("bias", False), job.get("moe"), job.get("ep", 1))
    if job.get("load"):
        # megatron-core's own resharding of the TP=1 checkpoint into this layout.
        state = dist_checkpointing.load({"model": model.sharded_state_dict()}, job["load"])
        model.load_state_dict(state["model"])
    else:
        # One training step, so the weights are not an initialisation's.
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        forward(model).square().mean().backward()
        opt.step()
        if job.get("state"):
            torch.save({k: v for k, v in model.state_dict().items() if "_extra_state" not in k},
                       job["state"])
    if job.get("sizes"):
        # The bytes this rank's parameters take: the oracle for `devmap plan --tp/--pp/--ep`.
        with open(f"{job['sizes']}.{rank}", "w") as f:
            f.write(str(sum(p.numel() * p.element_size() for p in model.parameters())))
    if job.get("logits") and job["pp"] == 1:
        out = logits(model)
        if rank == 0:
            torch.save(out, job["logits"])
    if job.get("nemo"):
        # NeMo 2's checkpoint: MegatronParallel's `module.` before megatron-core's names,
        # the trainer's state beside them (no Megatron-LM `args`), and the model's
        # configuration in context/model.yaml.
        state = {"state_dict": model.sharded_state_dict(prefix="module."), "global_step": 1,
                 "pytorch-lightning_version": "2.5.0"}
        if rank == 0:
            nemo_context(model.config, job["nemo"])
    else:
        # `singleton_local_shards`: each expert, and each half of a gated linear_fc1, a
        # tensor of its own (megatron-core's other layout of the same weights).
        metadata = {"singleton_local_shards": True} if job.get("singleton") else None
        state = {"model": model.sharded_state_dict(metadata=metadata), "iteration": 1,
                 "checkpoint_version": 3.0}
    if job.get("args", True) and not job.get("nemo"):
        state["args"] = megatron_args(dtype, job.get("bias", False), job.get("moe"))
    if rank == 0:
        os.makedirs(job["out"], exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(state, job["out"])
    dist.barrier()
    if job.get("run_config") and rank == 0:
        # Megatron-Bridge's: the run's configuration as YAML beside the weights.
        import yaml

        with open(os.path.join(job["out"], "run_config.yaml"), "w") as f:
            yaml.safe_dump({"model": model_fields(model.config, "megatron.bridge.models.llama.llama_provider.LlamaModelProvider"),
                            "train": {"train_iters": 1}}, f, sort_keys=True)
    dist.destroy_process_group()


def run_job(job, world, ports, rank_fn=None, preload=()):
    """`rank_fn(rank, world, port, job)` (this script's `rank_main` unless given) on
    `world` ranks, on the first of `ports` that works; `preload`: more modules the
    ranks' server imports once."""
    for port in ports:
        try:
            saved.start_ranks(rank_fn or rank_main, (world, port, job), world, preload=(
                "torch", "megatron.core", "megatron.core.dist_checkpointing", "megatron.core.models.gpt",
                "megatron.core.transformer.moe.moe_utils", *preload))
            return
        except torch.multiprocessing.ProcessExitedException as e:
            print(f"a rank exited ({e}); once more on another port", file=sys.stderr)
            shutil.rmtree(job["out"], ignore_errors=True)
    raise SystemExit(f"megatron-core could not save {job['out']}")


def devmap(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True)


def ranks_match(exe, folder, sizes, world, flags, label):
    """`devmap plan FOLDER --tp/--pp/--ep --json`: each rank's weights are the bytes
    megatron-core's rank of the same layout holds (its parameters, whose column, row,
    vocabulary and expert splits and pipeline stages vLLM shares for these models)."""
    r = devmap(exe, "plan", folder, *flags, "--json")
    assert r.returncode == 0, f"{label}: devmap plan {flags} failed:\n{r.stderr}"
    got = [rank["weights"] for rank in json.loads(r.stdout)["ranks"]]
    want = [int(open(f"{sizes}.{i}").read()) for i in range(world)]
    assert got == want, f"{label}: devmap plan {' '.join(flags)} gives {got} bytes per rank, megatron-core's ranks hold {want}"
    print(f"{label}: devmap plan {' '.join(flags)} per-rank bytes = megatron-core's ranks {want}")


def hf_names(state):
    """The Megatron model's own parameters, cut and renamed as transformers names them."""
    per_group = HEADS // GROUPS
    hd = HIDDEN // HEADS
    out = {
        "model.embed_tokens.weight": state["embedding.word_embeddings.weight"],
        "model.norm.weight": state["decoder.final_layernorm.weight"],
        "lm_head.weight": state["output_layer.weight"],
    }
    for i in range(LAYERS):
        p = f"decoder.layers.{i}."
        h = f"model.layers.{i}."
        qkv = state[p + "self_attention.linear_qkv.weight"].view(GROUPS, per_group + 2, hd, HIDDEN)
        out[h + "self_attn.q_proj.weight"] = qkv[:, :per_group].reshape(-1, HIDDEN)
        out[h + "self_attn.k_proj.weight"] = qkv[:, per_group].reshape(-1, HIDDEN)
        out[h + "self_attn.v_proj.weight"] = qkv[:, per_group + 1].reshape(-1, HIDDEN)
        out[h + "self_attn.o_proj.weight"] = state[p + "self_attention.linear_proj.weight"]
        out[h + "input_layernorm.weight"] = state[p + "input_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = state[p + "pre_mlp_layernorm.weight"]
        gate, up = state[p + "mlp.linear_fc1.weight"].chunk(2)
        out[h + "mlp.gate_proj.weight"] = gate
        out[h + "mlp.up_proj.weight"] = up
        out[h + "mlp.down_proj.weight"] = state[p + "mlp.linear_fc2.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def converts_bit_for_bit(exe, work, label, layouts, want, architecture, ref_logits):
    """`devmap save` of each of `layouts` ({name: folder}, "TP=1" among them) is `want`
    (the Megatron model's parameters as transformers names them) bit for bit, `verify`
    clean, every layout's output identical to TP=1's; TP=1's config.json names
    `architecture` and `from_pretrained` of it gives the logits saved in `ref_logits`
    (float32 rounding). Returns TP=1's output folder."""
    from transformers import AutoModelForCausalLM

    outputs = {}
    for name, folder in layouts.items():
        out = os.path.join(work, f"{label}-out-{name[:2]}{name[-1]}")
        r = devmap(exe, "save", folder, "--out", out, "--max-shard-size", "200KB")
        assert r.returncode == 0, f"{label} {name}: devmap save failed:\n{r.stderr}"
        v = devmap(exe, "verify", out)
        assert v.returncode == 0, f"{label} {name}: verify OUT is not clean:\n{v.stdout}{v.stderr}"
        got = saved.tensors(out)
        bad = saved.first_unequal(got, want)
        assert bad is None and sorted(got) == sorted(want), (
            f"{label} {name}: {bad} differs from the Megatron model's own parameter "
            f"(only devmap: {sorted(set(got) - set(want))[:3]}, only Megatron: {sorted(set(want) - set(got))[:3]})")
        outputs[name] = out
        print(f"{label} {name}: {len(got)} tensors equal to the Megatron model's parameters, bit for bit")
    for name, out in outputs.items():
        if name != "TP=1":
            d = saved.differences(out, outputs["TP=1"])
            assert d is None, f"{label} {name} differs from TP=1: {d}"
    config = json.load(open(os.path.join(outputs["TP=1"], "config.json")))
    assert config["architectures"] == [architecture], config
    model = AutoModelForCausalLM.from_pretrained(outputs["TP=1"], dtype=torch.float32)
    with torch.no_grad():
        hf = model(INPUT).logits.float()
    ref = torch.load(ref_logits)
    gap = (hf - ref).abs().max().item()
    assert gap <= 1e-5 * max(1.0, ref.abs().max().item()), (
        f"{label}: from_pretrained's logits differ from Megatron's forward by {gap}")
    print(f"{label}: from_pretrained(OUT) logits = Megatron forward (max gap {gap:.2e})")
    return outputs["TP=1"]


def refused(exe, src, work, what, needle):
    out = os.path.join(work, "refused-out")
    r = devmap(exe, "save", src, "--out", out)
    assert r.returncode != 0, f"{what}: devmap accepted it:\n{r.stdout}"
    assert needle in r.stderr, f"{what}: the refusal does not name {needle!r}:\n{r.stderr}"
    assert not os.path.exists(out), f"{what}: {out} was written"
    print(f"{what}: refused ({r.stderr.strip().splitlines()[-1][:150]}...)")


def main():
    exe = os.path.abspath(sys.argv[1])
    work = saved.workdir("devmap-megatron-")
    from transformers import AutoModelForCausalLM

    results = {}
    for dtype in ["float32", "bfloat16"]:
        tp1 = os.path.join(work, f"tp1-{dtype}")
        state_file = os.path.join(work, f"state-{dtype}.pt")
        ref_logits = os.path.join(work, f"logits-{dtype}.pt")
        run_job({"tp": 1, "pp": 1, "dtype": dtype, "out": tp1, "state": state_file,
                 "logits": ref_logits}, 1, [29411, 29412])
        layouts = {"TP=1": tp1}
        tp2_logits = os.path.join(work, f"logits-tp2-{dtype}.pt")
        if dtype == "float32":
            for name, tp, pp in [("TP=2", 2, 1), ("PP=2", 1, 2)]:
                folder = os.path.join(work, f"{name[:2].lower()}2-{dtype}")
                sizes = os.path.join(work, f"sizes-{name[:2]}")
                job = {"tp": tp, "pp": pp, "dtype": dtype, "out": folder, "load": tp1,
                       "logits": tp2_logits if tp == 2 else None, "sizes": sizes}
                run_job(job, 2, [29413 + tp, 29423 + tp])
                layouts[name] = folder
                ranks_match(exe, folder, sizes, 2, ["--tp", str(tp), "--pp", str(pp)], name)
        want = hf_names(torch.load(state_file))
        outputs = {}
        for name, folder in layouts.items():
            out = os.path.join(work, f"out-{name[:2]}{name[-1]}-{dtype}")
            r = devmap(exe, "save", folder, "--out", out, "--max-shard-size", "200KB")
            assert r.returncode == 0, f"{name} {dtype}: devmap save failed:\n{r.stderr}"
            said = r.stdout + r.stderr
            assert "_extra_state" in said and "left out" in said, f"{name}: the save does not say what it left out:\n{said}"
            v = devmap(exe, "verify", out)
            assert v.returncode == 0, f"{name} {dtype}: verify OUT is not clean:\n{v.stdout}{v.stderr}"
            got = saved.tensors(out)
            bad = saved.first_unequal(got, want)
            assert bad is None and sorted(got) == sorted(want), (
                f"{name} {dtype}: {bad} differs from the Megatron model's own parameter "
                f"(names only devmap: {sorted(set(got) - set(want))[:3]}, only Megatron: {sorted(set(want) - set(got))[:3]})")
            assert all(t.dtype == want[k].dtype for k, t in got.items()), f"{name}: dtype changed"
            outputs[name] = out
            print(f"{name} {dtype}: {len(got)} tensors equal to the Megatron model's parameters, bit for bit")
        for name, out in outputs.items():
            if name != "TP=1":
                d = saved.differences(out, outputs["TP=1"])
                assert d is None, f"{name} differs from TP=1: {d}"
        config = json.load(open(os.path.join(outputs["TP=1"], "config.json")))
        assert config["architectures"] == ["LlamaForCausalLM"], config
        assert config["num_key_value_heads"] == GROUPS and config["dtype"] == dtype, config
        model = AutoModelForCausalLM.from_pretrained(outputs["TP=1"], dtype=getattr(torch, dtype))
        with torch.no_grad():
            hf = model(INPUT).logits.float()
        tolerance = 1e-5 if dtype == "float32" else 2e-2
        for label, path in [("TP=1", ref_logits), ("TP=2", tp2_logits)]:
            if not os.path.exists(path):
                continue
            ref = torch.load(path)
            gap = (hf - ref).abs().max().item()
            assert gap <= tolerance * max(1.0, ref.abs().max().item()), (
                f"{dtype}: from_pretrained's logits differ from Megatron's {label} forward by {gap}")
            print(f"{dtype}: from_pretrained(OUT) logits = Megatron {label} forward (max gap {gap:.2e})")
        results[dtype] = outputs

    # Without args: refused naming what is needed; --config makes it work.
    bare = os.path.join(work, "no-args")
    run_job({"tp": 2, "pp": 1, "dtype": "float32", "out": bare, "load": os.path.join(work, "tp1-float32"),
             "args": False}, 2, [29441, 29442])
    refused(exe, bare, work, "no training arguments", "num_attention_heads")
    out = os.path.join(work, "with-config")
    r = devmap(exe, "save", bare, "--out", out, "--config", results["float32"]["TP=1"])
    assert r.returncode == 0, r.stderr
    d = saved.differences(out, results["float32"]["TP=1"])
    assert d is None, f"--config: {d}"
    print("no args + --config: identical")
    # Megatron-Bridge's run_config.yaml beside the same weights gives what args gave.
    bridge = os.path.join(work, "run-config")
    run_job({"tp": 2, "pp": 1, "dtype": "float32", "out": bridge, "load": os.path.join(work, "tp1-float32"),
             "args": False, "run_config": True}, 2, [29445, 29446])
    out = os.path.join(work, "with-run-config")
    r = devmap(exe, "save", bridge, "--out", out)
    assert r.returncode == 0, f"run_config.yaml: {r.stderr}"
    d = saved.differences(out, results["float32"]["TP=1"])
    assert d is None, f"run_config.yaml: {d}"
    written = json.load(open(os.path.join(out, "config.json")))
    assert written == json.load(open(os.path.join(results["float32"]["TP=1"], "config.json"))), written
    assert not os.path.exists(os.path.join(out, "run_config.yaml")), "run_config.yaml copied into the output"
    print("no args + run_config.yaml (Megatron-Bridge): identical tensors and config.json")

    # Hostile variants, each a copy of the TP=2 checkpoint.
    tp2 = os.path.join(work, "tp2-float32")

    def variant(name, change):
        folder = os.path.join(work, name)
        shutil.copytree(tp2, folder)
        change(folder)
        return folder

    refused(exe, variant("missing-rank", lambda f: os.remove(os.path.join(f, "__1_0.distcp"))),
            work, "a missing rank file", "__1_0.distcp")

    def cut(f):
        path = os.path.join(f, "__1_0.distcp")
        os.truncate(path, os.path.getsize(path) // 2)

    refused(exe, variant("cut-short", cut), work, "a .distcp cut short", "__1_0.distcp")
    refused(exe, variant("callable", lambda f: torch.save({"args": os.system}, os.path.join(f, "common.pt"))),
            work, "a common.pt naming a callable", "system")
    # NeMo 2: the TP=2 model saved as NeMo saves it, weights/ and context/model.yaml.
    nemo = os.path.join(work, "nemo2")
    run_job({"tp": 2, "pp": 1, "dtype": "float32", "out": os.path.join(nemo, "weights"),
             "load": os.path.join(work, "tp1-float32"), "nemo": nemo}, 2, [29443, 29444])
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(os.path.join(nemo, "weights")).read_metadata().state_dict_metadata
    assert keys and all(k.startswith("module.") for k in keys), f"NeMo 2: names without module.: {sorted(keys)[:3]}"
    out = os.path.join(work, "out-nemo2")
    r = devmap(exe, "save", nemo, "--out", out)
    assert r.returncode == 0, f"NeMo 2: devmap save failed:\n{r.stderr}"
    got = saved.tensors(out)
    want = hf_names(torch.load(os.path.join(work, "state-float32.pt")))
    bad = saved.first_unequal(got, want)
    assert bad is None and sorted(got) == sorted(want), f"NeMo 2: {bad} differs ({sorted(set(got) ^ set(want))[:3]})"
    print(f"NeMo 2 TP=2 float32: {len(got)} tensors equal to the Megatron model's parameters, bit for bit")
    written = json.load(open(os.path.join(out, "config.json")))
    from_args = json.load(open(os.path.join(results["float32"]["TP=1"], "config.json")))
    assert written == from_args, f"NeMo 2: config.json from context/model.yaml differs: {written} vs {from_args}"
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        hf = model(INPUT).logits.float()
    ref = torch.load(os.path.join(work, "logits-tp2-float32.pt"))
    gap = (hf - ref).abs().max().item()
    assert gap <= 1e-5 * max(1.0, ref.abs().max().item()), f"NeMo 2: logits differ by {gap}"
    print(f"NeMo 2: from_pretrained(OUT) logits = Megatron TP=2 forward (max gap {gap:.2e})")
    # Its tokenizer and generation config beside the weights, as they were.
    from transformers import AutoTokenizer, GenerationConfig

    context = os.path.join(nemo, "context")
    for side in ("nemo_tokenizer", "artifacts"):
        for name in os.listdir(os.path.join(context, side)):
            with open(os.path.join(context, side, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
                assert a.read() == b.read(), f"NeMo 2: {name} of context/{side} is not copied as it was"
    ids = AutoTokenizer.from_pretrained(out)("the model")["input_ids"]
    assert ids == [3, 4], f"NeMo 2: the copied tokenizer encodes 'the model' as {ids}"
    assert GenerationConfig.from_pretrained(out).eos_token_id == 2
    print("NeMo 2: the tokenizer (context/nemo_tokenizer) and generation_config.json (context/artifacts) are copied")
    refused(exe, os.path.join(nemo, "weights"), work, "a NeMo 2 weights/ folder given alone", "NeMo 2 checkpoint")
    scaled = os.path.join(work, "nemo2-scaled")
    shutil.copytree(nemo, scaled)
    yaml_path = os.path.join(scaled, "context", "model.yaml")
    text = open(yaml_path).read()
    with open(yaml_path, "w") as f:
        f.write(text.replace("config:\n", "config:\n  scale_factor: 8.0\n", 1))
    refused(exe, scaled, work, "NeMo 2 with RoPE scaling", "scale_factor")

    biased = os.path.join(work, "biased")
    run_job({"tp": 1, "pp": 1, "dtype": "float32", "out": biased, "bias": True}, 1, [29451, 29452])
    refused(exe, biased, work, "an architecture with no map", "linear_fc1.bias`: has no Hugging Face name")
    print("megatron: all checks passed")


if __name__ == "__main__":
    main()
