"""devmap's --dtype casts against torch's own `.to(dtype)`, bit for bit, and the `auto`
rule against transformers' `save_pretrained` on a model loaded in another dtype.

1. A checkpoint holds every float16 and every bfloat16 bit pattern (65,536 each), and
   float32 values chosen to hit every rounding case (ties to even either way, values a
   hair off a tie, subnormals of both targets, overflow, infinities, NaNs with and
   without payloads and signs) plus two million random bit patterns; and an int64 and a
   bool tensor that no cast may touch. devmap saves it with --dtype float32, bfloat16
   and float16; every output element must equal torch's result bit for bit, and
   config.json must record the dtype with every other byte unchanged.
2. transformers writes a float32 Llama, loads it with dtype=bfloat16 and a cpu/disk
   device map (its offload index, kept in memory, says the disk tensors load as
   bfloat16; written out as index.json); devmap saves it with the default --dtype auto;
   save_pretrained saves the loaded model. Both outputs must hold the same names,
   dtypes, shapes and bytes.

Usage: python dtype_cast.py PATH/TO/devmap
Exits non-zero on any difference. Needs torch, transformers, accelerate, safetensors.
"""

from saved import workdir
import json
import os
import subprocess
import sys

import numpy as np
import torch
from safetensors import safe_open
from saved import tensors
from safetensors.numpy import save_file

BITS_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
TARGETS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def f32_cases(rng):
    """float32 bit patterns around every rounding decision of bf16 and f16."""
    parts = []
    # bf16 keeps the top 16 bits: the low half decides. Every exponent and sign, a
    # spread of mantissas, each with the low halves below, at, and above the tie.
    highs = np.arange(0, 1 << 16, 7, dtype=np.uint32)
    for low in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF):
        parts.append((highs << 16) | low)
    # f16 keeps 10 of 23 mantissa bits (13 dropped) in its normal range, fewer for
    # subnormals: all exponents from below f16's subnormals to past its maximum.
    exps = np.arange(100, 146, dtype=np.uint32)
    mants = rng.integers(0, 1 << 10, size=300, dtype=np.uint32) << 13
    for low in (0, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF):
        for sign in (0, 1):
            grid = (sign << 31) | (exps[:, None] << 23) | (mants[None, :] | low)
            parts.append(grid.ravel().astype(np.uint32))
    # Infinities, NaNs of every kind, zeros, the extremes.
    parts.append(np.array([
        0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF812345,
        0x7FA00000, 0x7FFFFFFF, 0x00000000, 0x80000000, 0x00000001, 0x807FFFFF,
        0x7F7FFFFF, 0xFF7FFFFF, 0x477FE000, 0x477FF000, 0x477FEFFF, 0x33800000,
        0x33000000, 0x33000001, 0x387FC000, 0x38800000,
    ], dtype=np.uint32))
    parts.append(rng.integers(0, 1 << 32, size=2_000_000, dtype=np.uint64).astype(np.uint32))
    return np.concatenate(parts)


def bits(t):
    return t.contiguous().view(BITS_VIEW[t.dtype])


# Where the bit-exact claim holds, said by every run: x86-64 with torch's AVX2/AVX-512
# CPU kernels. With ATEN_CPU_CAPABILITY=default (its scalar kernels) only NaN payloads
# differ, and that is all this check then lets through.
CAPABILITY = torch.backends.cpu.get_cpu_capability()
SCALAR = CAPABILITY == "DEFAULT"


def check_casts(devmap, work):
    rng = np.random.default_rng(0)
    src = os.path.join(work, "casts")
    os.makedirs(src)
    every16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    inputs = {
        "f16_all": torch.from_numpy(every16.view(np.int16).copy()).view(torch.float16),
        "bf16_all": torch.from_numpy(every16.view(np.int16).copy()).view(torch.bfloat16),
        "f32_cases": torch.from_numpy(f32_cases(rng).view(np.int32).copy()).view(torch.float32),
    }
    ints = np.arange(-50, 50, dtype=np.int64)
    flags = (np.arange(64) % 3 == 0)
    from safetensors.torch import save_file as save_torch
    save_torch({**inputs, "ints": torch.from_numpy(ints), "flags": torch.from_numpy(flags)},
               os.path.join(src, "model.safetensors"))
    config_text = '{\n  "architectures": ["LlamaForCausalLM"],\n  "torch_dtype": "float32",\n  "vocab_size": 7\n}\n'
    with open(os.path.join(src, "config.json"), "w") as f:
        f.write(config_text)
    total = sum(t.numel() for t in inputs.values())
    for name, dtype in TARGETS.items():
        payloads = 0
        out = os.path.join(work, f"out-{name}")
        subprocess.run([devmap, "save", src, "--out", out, "--dtype", name, "--quiet"], check=True)
        with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
            for key, t in inputs.items():
                got = f.get_tensor(key)
                want = t.to(dtype)
                if got.dtype != dtype:
                    raise SystemExit(f"{name}: {key} written as {got.dtype}")
                differ = bits(got) != bits(want)
                if SCALAR:
                    # The one documented difference: torch's scalar kernels write NaN
                    # payloads of their own (float32→bfloat16 NaN is 0x7FC0 there,
                    # 0xFFFF in its AVX2/AVX-512 kernels, which devmap follows).
                    nan_payloads = differ & torch.isnan(got.float()) & torch.isnan(want.float())
                    payloads += int(nan_payloads.sum())
                    differ = differ & ~nan_payloads
                differ = differ.nonzero().flatten()
                if len(differ):
                    i = int(differ[0])
                    raise SystemExit(
                        f"{name}: {key}: {len(differ)} of {t.numel()} elements differ from torch; "
                        f"first at {i}: input {int(bits(t)[i]) & 0xFFFFFFFF:#x} -> devmap "
                        f"{int(bits(got)[i]) & 0xFFFFFFFF:#x}, torch {int(bits(want)[i]) & 0xFFFFFFFF:#x}")
            if not np.array_equal(f.get_tensor("ints").numpy(), ints):
                raise SystemExit(f"{name}: the int64 tensor changed")
            if not np.array_equal(f.get_tensor("flags").numpy(), flags):
                raise SystemExit(f"{name}: the bool tensor changed")
        with open(os.path.join(out, "config.json")) as f:
            written = f.read()
        expected = config_text if name == "float32" else config_text.replace('"float32"', f'"{name}"')
        if written != expected:
            raise SystemExit(f"{name}: config.json is\n{written}\nexpected\n{expected}")
        if payloads:
            print(f"ok: --dtype {name}: {total} elements identical to torch's .to() but {payloads} NaN payloads (torch's scalar kernels)")
        else:
            print(f"ok: --dtype {name}: {total} elements identical to torch's .to()")


def check_auto(devmap, work):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=32, tie_word_embeddings=False)
    src = os.path.join(work, "f32-model")
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(src)
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
                  "model.layers.2": "disk", "model.layers.3": "disk", "model.norm": "disk",
                  "model.rotary_emb": "cpu", "lm_head": "cpu"}
    offload = os.path.join(work, "offload")
    # Loaded with relative paths, as users type them: the exported index must still
    # work from any folder devmap runs in.
    cwd = os.getcwd()
    os.chdir(work)
    loaded = AutoModelForCausalLM.from_pretrained("f32-model", device_map=device_map,
                                                  offload_folder="offload", dtype=torch.bfloat16)
    theirs = os.path.join(work, "transformers-saved")
    loaded.save_pretrained(theirs)
    ours = os.path.join(work, "devmap-saved")
    # transformers 5 writes no weights into the offload folder here: it keeps an index
    # of entries pointing into the float32 checkpoint, with the dtype it loads them as,
    # in memory only. The devmap package's export writes it out (and device_map.json);
    # its pure-Python part is imported from the checkout (no build needed).
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "devmap"))
    from _export import export, offload_index

    index = offload_index(loaded)
    if not index or not all(e.get("dtype") == "bfloat16" for e in index.values()):
        raise SystemExit(f"unexpected offload index from transformers: {list(index.items())[:2]}")
    written = export(loaded, "f32-model", "offload")
    os.chdir(cwd)
    with open(os.path.join(offload, "index.json")) as f:
        relative = [e["safetensors_file"] for e in json.load(f).values() if not os.path.isabs(e["safetensors_file"])]
    if relative:
        raise SystemExit(f"export wrote relative paths: {relative[:2]}")
    if len(written) != 2:
        raise SystemExit(f"devmap export wrote {written}")
    subprocess.run([devmap, "save", src, "--offload-folder", offload, "--out", ours, "--quiet"],
                   check=True)

    a, b = tensors(theirs), tensors(ours)
    if sorted(a) != sorted(b):
        raise SystemExit(f"names differ: transformers {sorted(set(a) - set(b))}, devmap {sorted(set(b) - set(a))}")
    size = 0
    for key in a:
        if a[key].dtype != b[key].dtype or a[key].shape != b[key].shape:
            raise SystemExit(f"{key}: transformers {a[key].dtype} {tuple(a[key].shape)}, "
                             f"devmap {b[key].dtype} {tuple(b[key].shape)}")
        if not torch.equal(bits(a[key]), bits(b[key])):
            raise SystemExit(f"{key}: values differ from transformers' save")
        size += a[key].numel() * a[key].element_size()
    with open(os.path.join(ours, "config.json")) as f:
        recorded = json.load(f)
    dtype = recorded.get("dtype", recorded.get("torch_dtype"))
    if dtype != "bfloat16":
        raise SystemExit(f"devmap's config.json records {dtype}, not bfloat16")
    print(f"ok: --dtype auto: {len(a)} tensors, {size} bytes, identical to save_pretrained (bfloat16)")


def main(devmap):
    work = workdir(prefix="devmap-dtype-")
    check_casts(devmap, work)
    check_auto(devmap, work)
    print(f"torch {torch.__version__}, CPU capability {CAPABILITY}, machine {os.uname().machine}")


if __name__ == "__main__":
    main(sys.argv[1])
