"""Writes tests/data/cast_expected.txt: for each cast devmap makes, a fingerprint of
torch's results over a fixed set of inputs (every float16 and bfloat16 bit pattern,
and a float32 grid around every rounding decision of bfloat16 and float16). The test
in tests/cast_table.rs builds the same inputs, casts them with devmap's code and must
reach the same fingerprints, so the rules are checked against torch even where torch
is not installed. Run where torch is installed:

    python scripts/gen_cast_table.py [OUT]
"""

import sys

import numpy as np
import torch

MASK = (1 << 64) - 1


def fnv1a(data: bytes) -> int:
    """FNV-1a, 64 bits: small enough to write again in Rust, and order-sensitive."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def f32_grid():
    parts = []
    highs = np.arange(0, 1 << 16, 7, dtype=np.uint32)
    for low in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF):
        parts.append((highs << 16) | low)
    exps = np.arange(100, 146, dtype=np.uint32)
    mants = (np.arange(64, dtype=np.uint32) * 16) << 13
    for low in (0, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF):
        for sign in (0, 1):
            grid = (np.uint32(sign) << np.uint32(31)) | (exps[:, None] << np.uint32(23)) | (mants[None, :] | np.uint32(low))
            parts.append(grid.ravel().astype(np.uint32))
    return np.concatenate(parts).astype(np.uint32)


def inputs():
    every16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    return {
        "f16": torch.from_numpy(every16.view(np.int16).copy()).view(torch.float16),
        "bf16": torch.from_numpy(every16.view(np.int16).copy()).view(torch.bfloat16),
        "f32": torch.from_numpy(f32_grid().view(np.int32).copy()).view(torch.float32),
    }


DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def main(out):
    lines = [f"# torch {torch.__version__}: FNV-1a 64 of torch's .to() over the inputs of tests/cast_table.rs"]
    for src, t in inputs().items():
        for dst, dtype in DTYPES.items():
            if src == dst:
                continue
            data = t.to(dtype).contiguous().view(torch.uint8).numpy().tobytes()
            lines.append(f"{src}->{dst} {t.numel()} {fnv1a(data):016x}")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/cast_expected.txt")
