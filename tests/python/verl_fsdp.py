"""devmap converts verl's FSDP checkpoints (`global_step_N/actor/`) to a transformers
checkpoint, checked against torch's own gathering of the same weights.

Each case trains a tiny Llama two AdamW steps under FSDP2 (`fully_shard`, gloo on CPU)
and saves it as verl's FSDPCheckpointManager does: every rank `torch.save`s its
`model.state_dict()` (DTensors, sharded along dim 0 as torch.chunk cuts them) as
`model_world_size_N_rank_K.pt`, its optimizer state as `optim_world_size_N_rank_K.pt`
and `extra_state_world_size_N_rank_K.pt`, rank 0 `fsdp_config.json` and the model's
config under `huggingface/`. The reference: the same weights gathered by torch
(`get_model_state_dict(full_state_dict=True)`), loaded into the unsharded model and
saved by transformers' `save_pretrained`.

- `devmap save ACTOR --out OUT`: the same names, dtypes and bytes as transformers'
  save (a vocabulary of 101 rows cut over 2 and 4 ranks: uneven blocks), float32 and
  bfloat16 kept as stored, a tied head written once as transformers writes it;
  `verify OUT` clean; from_pretrained's logits equal the
  unsharded model's;
- on a 2 × 2 mesh too: HSDP (replicated across, sharded within) and FSDP2 over tensor
  parallelism (q/k/v/gate/up column-parallel, o/down row-parallel: torch places them
  `(_StridedShard(0), Shard(0))` and `(Shard(0), Shard(1))`, the rest on the FSDP
  submesh alone), each against torch's gathering of the same weights: verl's own merger
  stops at "FSDP + TP is not supported yet";
- a checkpoint missing a rank's file is refused naming it, nothing written.

Usage: python verl_fsdp.py PATH/TO/devmap
"""

import json
import os
import shutil
import subprocess
import sys

import torch
from saved import shard_and_train, start_ranks, tensors, workdir

PORTS = iter(range(29961, 29990))
INPUT = torch.tensor([[3, 17, 42, 99, 5, 61, 7, 100]])


def model_of(dtype, tied=False):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=101, tie_word_embeddings=tied)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def mesh_rank(rank, world, port, layout, actor, ref):
    """A 4-rank job on a 2 × 2 mesh, saved as verl saves, and torch's gathering of it
    saved by transformers as the reference. `hsdp`: replicated across, sharded within;
    `tp`: FSDP2 (across) over tensor parallelism (within)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = model_of(torch.float32)
    if layout == "hsdp":
        mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        plan = {}
        for i in range(len(model.model.layers)):
            p = f"model.layers.{i}."
            plan.update({p + "self_attn.q_proj": ColwiseParallel(), p + "self_attn.k_proj": ColwiseParallel(),
                         p + "self_attn.v_proj": ColwiseParallel(), p + "self_attn.o_proj": RowwiseParallel(),
                         p + "mlp.gate_proj": ColwiseParallel(), p + "mlp.up_proj": ColwiseParallel(),
                         p + "mlp.down_proj": RowwiseParallel()})
        parallelize_module(model, mesh["tp"], plan)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    torch.save(model.state_dict(), os.path.join(actor, f"model_world_size_{world}_rank_{rank}.pt"))
    if layout == "tp" and rank == 0:
        state = model.state_dict()
        placed = {str(state[k].placements) for k in ("model.layers.0.self_attn.q_proj.weight",
                                                     "model.layers.0.self_attn.o_proj.weight")}
        print(f"tp placements: {sorted(placed)}", flush=True)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        model.config.save_pretrained(os.path.join(actor, "huggingface"))
        plain = model_of(torch.float32)
        plain.load_state_dict(full)
        plain.save_pretrained(ref)
    dist.barrier()
    dist.destroy_process_group()


def rank_main(rank, world, port, dtype, tied, actor, ref):
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = model_of(dtype, tied)
    optimizer = shard_and_train(model, world, rank)
    # As verl's FSDPCheckpointManager saves an FSDP2 model.
    torch.save(model.state_dict(), os.path.join(actor, f"model_world_size_{world}_rank_{rank}.pt"))
    torch.save(optimizer.state_dict(), os.path.join(actor, f"optim_world_size_{world}_rank_{rank}.pt"))
    torch.save({"rng": torch.get_rng_state()}, os.path.join(actor, f"extra_state_world_size_{world}_rank_{rank}.pt"))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        with open(os.path.join(actor, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": 2, "world_size": world}, f)
        model.config.save_pretrained(os.path.join(actor, "huggingface"))
        plain = model_of(dtype, tied)
        plain.load_state_dict(full)
        plain.save_pretrained(ref)
    dist.barrier()
    dist.destroy_process_group()


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def main():
    from transformers import AutoModelForCausalLM

    exe = os.path.abspath(sys.argv[1])
    work = workdir("devmap-verl-")
    cases = [(2, torch.float32, False), (4, torch.float32, False), (2, torch.bfloat16, False),
             (2, torch.float32, True)]
    for world, dtype, tied in cases:
        label = f"{world} ranks, {str(dtype).removeprefix('torch.')}" + (", tied" if tied else "")
        actor = os.path.join(work, f"step-{world}-{dtype}-{tied}", "actor")
        ref, out = actor + "-ref", actor + "-devmap"
        os.makedirs(actor)
        start_ranks(rank_main, (world, next(PORTS), dtype, tied, actor, ref), world,
                    preload=("torch", "transformers.models.llama.modeling_llama"))
        r = subprocess.run([exe, "save", actor, "--out", out, "--max-shard-size", "300KB"],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{label}: devmap save failed:\n{r.stderr}"
        a, b = tensors(ref), tensors(out)
        assert sorted(a) == sorted(b), (
            f"{label}: names differ: transformers only {sorted(set(a) - set(b))[:3]}, "
            f"devmap only {sorted(set(b) - set(a))[:3]}")
        differ = [k for k in a if not same_bytes(a[k], b[k])]
        assert not differ, f"{label}: {len(differ)} tensors differ from the gathered weights, e.g. {differ[:3]}"
        v = subprocess.run([exe, "verify", out], capture_output=True, text=True)
        assert v.returncode == 0, f"{label}: verify OUT is not clean:\n{v.stdout}{v.stderr}"
        with torch.no_grad():
            ours = AutoModelForCausalLM.from_pretrained(out, dtype=dtype)(INPUT).logits
            theirs = AutoModelForCausalLM.from_pretrained(ref, dtype=dtype)(INPUT).logits
        assert torch.equal(ours, theirs), f"{label}: logits differ"
        print(f"ok: verl FSDP, {label}: {len(b)} tensors equal torch's gathered weights saved by "
              "transformers, bit for bit; verify clean; logits equal")

    # A rank's file missing: refused naming it, nothing written.
    broken = os.path.join(work, "broken")
    shutil.copytree(os.path.join(work, f"step-4-{torch.float32}-False", "actor"), broken)
    os.remove(os.path.join(broken, "model_world_size_4_rank_2.pt"))
    out = os.path.join(work, "broken-out")
    r = subprocess.run([exe, "save", broken, "--out", out], capture_output=True, text=True)
    assert r.returncode != 0 and "model_world_size_4_rank_2.pt" in r.stderr, r.stderr
    assert not os.path.exists(out), f"{out} was written"
    print(f"ok: a missing rank file is refused ({r.stderr.strip().splitlines()[-1][:140]}...)")

    # A 2 × 2 mesh: HSDP, and FSDP2 over tensor parallelism.
    for layout in ["hsdp", "tp"]:
        actor = os.path.join(work, layout, "actor")
        ref, out = actor + "-ref", actor + "-devmap"
        os.makedirs(actor)
        start_ranks(mesh_rank, (4, next(PORTS), layout, actor, ref), 4,
                    preload=("torch", "transformers.models.llama.modeling_llama"))
        r = subprocess.run([exe, "save", actor, "--out", out], capture_output=True, text=True)
        assert r.returncode == 0, f"{layout}: devmap save failed:\n{r.stderr}"
        a, b = tensors(ref), tensors(out)
        assert sorted(a) == sorted(b), f"{layout}: names differ"
        differ = [k for k in a if not same_bytes(a[k], b[k])]
        assert not differ, f"{layout}: {len(differ)} tensors differ from the gathered weights, e.g. {differ[:3]}"
        print(f"ok: verl {layout} on a 2 x 2 mesh: {len(b)} tensors equal torch's gathered weights, bit for bit")


if __name__ == "__main__":
    main()
