"""The two sides of scripts/bench_verl.sh.

`make ACTOR WORLD`: a float32 Llama (hidden 1024, 8 layers, vocabulary 32,000:
about 0.55 GB) sharded by FSDP2 over WORLD gloo ranks on CPU and saved as verl's
FSDPCheckpointManager saves it: every rank `torch.save`s its `model.state_dict()` of
DTensors as `model_world_size_N_rank_K.pt`, the config under `huggingface/`.

`merge ACTOR OUT`: what verl's model merger does with those files (and every script
that follows it): `torch.load` each rank file, put each parameter together from the
ranks' local tensors along its shard dimension (`torch.cat`), and write the whole
state dict with safetensors' `save_file`, one file.
"""

import os
import sys

import torch


def rank_main(rank, world, port, actor):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "llama", hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=4, vocab_size=32000)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    torch.save(model.state_dict(), os.path.join(actor, f"model_world_size_{world}_rank_{rank}.pt"))
    if rank == 0:
        model.config.save_pretrained(os.path.join(actor, "huggingface"))
    dist.barrier()
    dist.destroy_process_group()


def make(actor, world):
    import torch.multiprocessing as mp

    os.makedirs(actor, exist_ok=True)
    mp.spawn(rank_main, args=(world, 29995, actor), nprocs=world, join=True)


def merge(actor, out):
    from safetensors.torch import save_file

    files = sorted(f for f in os.listdir(actor) if f.startswith("model_world_size_"))
    ranks = [torch.load(os.path.join(actor, f), map_location="cpu", weights_only=False) for f in files]
    full = {}
    for name, first in ranks[0].items():
        if not hasattr(first, "_local_tensor"):
            full[name] = first
            continue
        placement = first.placements[0]
        if placement.is_shard():
            full[name] = torch.cat([r[name]._local_tensor for r in ranks], dim=placement.dim).contiguous()
        else:
            full[name] = first._local_tensor
    os.makedirs(out, exist_ok=True)
    save_file(full, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]))
    else:
        merge(sys.argv[2], sys.argv[3])
