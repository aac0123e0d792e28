"""Writes the benchmarks' state dict (bench_state.layers_state) as a training run of
RANKS CPU ranks (gloo on 127.0.0.1) leaves it: every weight a DTensor sharded on dim
LAYOUT (0: FSDP's layout; 1: a column split), saved by `dcp.save` with the default
writer (`dcp`) or with transformers 5's distributed one (`hf`: rank files).

Usage: python dcp_ranks_save.py OUT SIZE_MB RANKS LAYOUT dcp|hf"""

import os
import sys

import torch


def rank_main(rank, world, out, size_mb, dim, writer):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_state import layers_state

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    state = {k: distribute_tensor(v, mesh, [Shard(dim)]) for k, v in layers_state(size_mb).items()}
    if writer == "hf":
        from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

        dcp.save(state, storage_writer=HuggingFaceStorageWriter(path=out, save_distributed=True,
                                                                enable_consolidation=False))
    else:
        dcp.save({"model": state, "epoch": 1}, checkpoint_id=out)
    dist.destroy_process_group()


if __name__ == "__main__":
    out, size_mb, ranks, dim, writer = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    torch.multiprocessing.spawn(rank_main, args=(ranks, out, size_mb, dim, writer), nprocs=ranks, join=True)
