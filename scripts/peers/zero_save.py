"""Writes a DeepSpeed ZeRO checkpoint for the benchmarks: a stack of 1024×1024 linear
layers (about SIZE_MB megabytes of fp32 parameters), one AdamW step by RANKS CPU ranks
(gloo on 127.0.0.1) under ZeRO STAGE, saved by `engine.save_checkpoint(OUT)`.

Usage: python zero_save.py OUT SIZE_MB RANKS STAGE"""

import os
import sys

import torch


def rank_main(rank, world, out, size_mb, stage):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29563", RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), DS_ACCELERATOR="cpu")
    import deepspeed

    # gloo's all-reduce instead of the shared-memory one DeepSpeed would compile.
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    layers = max(1, size_mb * 1_000_000 // (4 * 1024 * 1024))
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(layers)])
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage}}
    engine, *_ = deepspeed.initialize(model=model, config=config,
                                      optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
    engine.backward(engine(torch.randn(1, 1024)).sum())
    engine.step()
    engine.save_checkpoint(out)


if __name__ == "__main__":
    out, size_mb, ranks, stage = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.multiprocessing.spawn(rank_main, args=(ranks, out, size_mb, stage), nprocs=ranks, join=True)
