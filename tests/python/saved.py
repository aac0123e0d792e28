"""Reading a saved checkpoint folder back with Python's safetensors, and peft's own
merge as a reference (shared by the reference-library checks)."""

import os

from safetensors import safe_open


def workdir(prefix):
    """A fresh folder in the system's temporary folder, removed when this process exits,
    failed check or not: the checks leave nothing behind."""
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


def tensors(folder):
    """{name: tensor} for every tensor of every `.safetensors` file in `folder`."""
    out = {}
    for file in sorted(os.listdir(folder)):
        if file.endswith(".safetensors"):
            with safe_open(os.path.join(folder, file), "pt") as st:
                for key in st.keys():
                    out[key] = st.get_tensor(key)
    return out


def differences(ours, ref):
    """Why the checkpoint in folder `ours` is not exactly the one in `ref` (names,
    dtypes, shapes, every value), or None."""
    import torch

    a, b = tensors(ours), tensors(ref)
    if sorted(a) != sorted(b):
        return f"names differ: only devmap {sorted(set(a) - set(b))}, only the reference {sorted(set(b) - set(a))}"
    for k in b:
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k], b[k]):
            return (f"{k}: devmap {a[k].dtype} {tuple(a[k].shape)}, reference {b[k].dtype} {tuple(b[k].shape)}, "
                    f"equal values: {a[k].shape == b[k].shape and torch.equal(a[k].float(), b[k].float())}")
    return None


def first_unequal(got, want, dtype=None):
    """The first name whose tensor in `got` is not `want`'s (cast to `dtype` as torch's
    `.to()` casts, when given) in dtype, shape and every value; None when all are."""
    import torch

    for k, t in want.items():
        t = t.to(dtype) if dtype else t
        g = got.get(k)
        if g is None or g.dtype != t.dtype or g.shape != t.shape or not torch.equal(g, t):
            return k
    return None


def bit_unequal(ours, theirs):
    """The names of `theirs` whose tensor in `ours` differs in dtype, shape or any bit
    (a bitwise comparison: −0 is not +0, a NaN is its own payload)."""
    import torch

    def bits(t):
        return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])

    return [k for k in theirs if ours[k].dtype != theirs[k].dtype or ours[k].shape != theirs[k].shape
            or not torch.equal(bits(ours[k]), bits(theirs[k]))]


def peft_merged(load, lora_config, work, label):
    """An adapter peft makes on the model `load()` gives (`lora_config`, its LoRA
    weights random and non-zero, seed 5), saved under `work`; then peft's own
    `merge_and_unload()` of it into a fresh `load()`, saved with `save_pretrained`.
    Returns (adapter folder, reference folder, the merged model)."""
    import torch
    from peft import PeftModel, get_peft_model

    peft_model = get_peft_model(load(), lora_config)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_" in n:
                p.copy_((torch.randn(p.shape, generator=g) * 0.2).to(p.dtype))
    adapter = os.path.join(work, f"{label}-adapter")
    peft_model.save_pretrained(adapter)
    merged = PeftModel.from_pretrained(load(), adapter).merge_and_unload()
    ref = os.path.join(work, f"{label}-peft")
    merged.save_pretrained(ref)
    return adapter, ref, merged


def start_ranks(fn, args, nprocs, preload=("torch",)):
    """torch.multiprocessing.spawn's `fn(rank, *args)` on `nprocs` ranks, each forked from
    a server process that has imported `preload` once (multiprocessing's forkserver)
    instead of a fresh interpreter importing torch and the rest anew: the ranks are still
    processes of their own, as a launcher starts them. Raises as spawn raises when a rank
    fails (torch.multiprocessing.ProcessExitedException / ProcessRaisedException)."""
    import multiprocessing

    import torch.multiprocessing

    # Read when the server starts: the first call of a script decides.
    multiprocessing.set_forkserver_preload(list(preload))
    torch.multiprocessing.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def shard_and_train(model, world, rank, steps=2):
    """`model` (a transformers causal LM) sharded with FSDP2 over a 1-dimensional mesh of
    `world` CPU ranks (`fully_shard` on each layer, then the whole) and trained `steps`
    AdamW steps on this rank's random batches. Returns the optimizer."""
    import torch
    from torch.distributed.fsdp import fully_shard

    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(rank)
    for _ in range(steps):
        ids = torch.randint(0, model.config.vocab_size, (2, 8))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer
