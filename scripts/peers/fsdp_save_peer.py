"""One save of an FSDP2-sharded model from WORLD CPU ranks (gloo), measured per rank.

The model (a float32 Llama, about 0.9 GB) is built on the meta device, sharded with
`fully_shard`, then materialised shard by shard (`to_empty`), so each rank only ever
holds its own shards. Then, timed from a barrier to a barrier:
  devmap: `devmap.save_pretrained(model, out)` on every rank;
  gather: torch's `get_model_state_dict(full_state_dict=True, cpu_offload=True)` and
          `model.save_pretrained(out, state_dict=full)` on rank 0 (what accelerate and
          the FSDP tutorials do).
Each rank's peak RSS growth is measured from its RSS before the save (VmHWM reset
through /proc/self/clear_refs). Prints one JSON line (rank 0): seconds and, per rank,
its shards' bytes and its peak growth.

Usage: fsdp_save_peer.py devmap|gather WORLD OUT
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from measure import status


def worker(rank, world, who, out, init):
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                         num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    torch.manual_seed(rank)
    shard_bytes = 0
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local()
            local.normal_(0, 0.02)
            shard_bytes += local.numel() * local.element_size()
        model.model.rotary_emb.inv_freq.copy_(
            1.0 / (config.rope_parameters["rope_theta"] ** (torch.arange(0, 64, 2, dtype=torch.float) / 64)))
    dist.barrier()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    start = time.perf_counter()
    if who == "devmap":
        import devmap

        devmap.save_pretrained(model, out, progress=False, verify=False)
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            model.save_pretrained(out, state_dict=full)
        del full
    dist.barrier()
    seconds = time.perf_counter() - start
    growth = status("VmHWM") - before
    rows = [None] * world
    dist.all_gather_object(rows, {"rank": rank, "shard_bytes": shard_bytes, "growth": growth})
    if rank == 0:
        print(json.dumps({"who": who, "world": world, "seconds": seconds, "ranks": rows}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    who, world, out = sys.argv[1], int(sys.argv[2]), os.path.abspath(sys.argv[3])
    init = out + ".init"
    if os.path.exists(init):
        os.remove(init)
    mp.spawn(worker, args=(world, who, out, init), nprocs=world, join=True)
    os.remove(init)
