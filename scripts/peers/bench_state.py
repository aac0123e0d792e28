"""The state dict the checkpoint-conversion benchmarks (scripts/bench_bin.sh,
scripts/bench_dcp.sh) write in torch's formats: Llama-shaped bfloat16 layers of
hidden size 1024, as many as make about SIZE_MB megabytes, random values."""

import torch


def layers_state(size_mb):
    hidden, layers = 1024, max(1, size_mb * 1_000_000 // (2 * 12 * 1024 * 1024))
    torch.manual_seed(0)
    state = {}
    for l in range(layers):
        for name, rows in [("self_attn.q_proj", hidden), ("self_attn.k_proj", hidden), ("self_attn.v_proj", hidden),
                           ("self_attn.o_proj", hidden), ("mlp.gate_proj", 2 * hidden), ("mlp.up_proj", 2 * hidden),
                           ("mlp.down_proj", hidden * 4)]:
            cols = hidden if name != "mlp.down_proj" else hidden // 2
            state[f"model.layers.{l}.{name}.weight"] = torch.randn(rows, cols).to(torch.bfloat16)
    return state
