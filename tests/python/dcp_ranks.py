"""devmap puts together torch.distributed.checkpoint folders that several ranks wrote.
A tiny Llama (vocabulary 97 and intermediate size 90, so splits are uneven) is saved
by `dcp.save` from 2 and from 4 CPU ranks (gloo on 127.0.0.1) as DTensors: sharded on
dim 0 everywhere (FSDP's layout), and on dim 0 and dim 1 mixed with replicated ones.
`devmap save DIR --config CONFIG` must write, bit for bit, the state dict torch itself
loads from the folder (`dcp_to_torch_save`) — cast as torch's `.to()` casts where
`--dtype` asks — and what transformers' `save_pretrained` writes for the model;
`from_pretrained(OUT)` gives the logits of transformers' own save, and `verify OUT --against DIR` is
clean. The same from transformers 5's distributed checkpoint writer (rank files
`shard-0000R-model-….safetensors`, 2 ranks, mixed), against torch's
`consolidate_safetensors_files`; and transformers' own
`save_pretrained(..., distributed_checkpoint=True)` from 2 ranks, FSDP and tensor
parallel, read back bit for bit as its ordinary save writes the model. A chunk dropped from `.metadata` (a gap) and a chunk moved onto its neighbour
(an overlap) are named by `inspect` as a warning and refused by `save`, nothing written.

Usage: python dcp_ranks.py PATH/TO/devmap
"""

from saved import start_ranks, workdir
import json
import os
import pickle
import subprocess
import sys

import torch

INPUT = torch.tensor([[1, 5, 9, 33, 2, 17, 60, 3]])


# What the ranks import, imported once by the server they are forked from.
PRELOAD = ("torch", "torch.distributed.checkpoint", "transformers.models.llama.modeling_llama")


def rank_main(rank, world, port, full_path, folder, layout, nested, hf_files):
    """One rank: distribute every tensor of the full state dict as `layout` says and
    take part in `dcp.save` — with the default writer, or with `hf_files` the one
    transformers 5's `save_pretrained(..., distributed_checkpoint=True)` uses. Imports
    torch only (spawned processes re-import this file)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    full = torch.load(full_path, weights_only=True)
    model = {}
    for i, (name, t) in enumerate(sorted(full.items())):
        if layout == "dim0":
            placement = Shard(0)
        elif t.dim() == 2:
            placement = Shard(i % 2)
        else:
            placement = Replicate() if i % 2 == 0 else Shard(0)
        model[name] = distribute_tensor(t, mesh, [placement])
    state = {"model": model, "step": 5} if nested else model
    if hf_files:
        from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

        writer = HuggingFaceStorageWriter(path=folder, save_distributed=True, enable_consolidation=False)
        dcp.save(state, storage_writer=writer)
    else:
        dcp.save(state, checkpoint_id=folder)
    dist.destroy_process_group()


def transformers_rank(rank, world, port, ref, out, kind):
    """One rank of transformers 5's own distributed save: the model loaded with a
    DistributedConfig (FSDP or tensor parallel), then
    `save_pretrained(out, distributed_checkpoint=True)`."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    config = DistributedConfig(fsdp_size=world) if kind == "fsdp" else DistributedConfig(tp_size=world)
    model = AutoModelForCausalLM.from_pretrained(ref, distributed_config=config)
    model.save_pretrained(out, distributed_checkpoint=True)
    dist.destroy_process_group()


def transformers_case(devmap, work, kind, port):
    """transformers' own distributed save from 2 ranks, read back by devmap: what
    transformers' ordinary save of the model writes, and torch's consolidation."""
    from saved import differences, first_unequal, tensors
    from transformers import AutoModelForCausalLM, LlamaConfig

    name = f"transformers-{kind}"
    small = dict(vocab_size=97, hidden_size=64, intermediate_size=90, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(7)
    src, ref, ours = (os.path.join(work, f"{name}-{d}") for d in ("src", "ref", "devmap"))
    AutoModelForCausalLM.from_config(LlamaConfig(**small)).save_pretrained(ref)
    start_ranks(transformers_rank, (2, port, ref, src, kind), 2, preload=PRELOAD)
    r = run([devmap, "save", src, "--out", ours, "--quiet"])
    if r.returncode != 0:
        sys.exit(f"FAIL {name}: devmap save: {r.stderr}")
    why = differences(ours, ref)
    if why:
        sys.exit(f"FAIL {name}: against transformers' ordinary save: {why}")
    consolidated = torch_loaded(src, False, work, True)
    if sorted(consolidated) != sorted(tensors(ours)) or first_unequal(tensors(ours), consolidated):
        sys.exit(f"FAIL {name}: differs from torch's consolidate_safetensors_files")
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(ours)(INPUT).logits
        want = AutoModelForCausalLM.from_pretrained(ref)(INPUT).logits
    if not torch.equal(logits, want):
        sys.exit(f"FAIL {name}: logits differ")
    r = run([devmap, "verify", ours, "--against", src, "--quiet"])
    if r.returncode != 0:
        sys.exit(f"FAIL {name}: verify --against: {r.stdout[-600:]} {r.stderr[-600:]}")
    print(f"ok: {name}: save_pretrained(distributed_checkpoint=True) from 2 ranks ({kind}), bit for bit "
          f"transformers' ordinary save and torch's consolidation; logits equal; verify --against clean")


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def torch_loaded(src, nested, work, hf_files):
    """The state dict torch itself loads from a DCP folder; for rank files, what its
    `consolidate_safetensors_files` writes."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    if hf_files:
        from saved import tensors
        from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files
        from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

        out = os.path.join(work, os.path.basename(src) + "-consolidated")
        os.makedirs(out)
        names = HuggingFaceStorageReader(src).read_metadata().state_dict_metadata
        consolidate_safetensors_files(input_dir=src, output_dir=out, fqn_to_index_mapping=dict.fromkeys(names, 1))
        return tensors(out)

    path = os.path.join(work, os.path.basename(src) + ".pt")
    dcp_to_torch_save(src, path)
    state = torch.load(path, weights_only=False)
    return state["model"] if nested else state


def case(devmap, work, name, world, layout, nested, dtype, port, hf_files=False):
    from saved import differences, first_unequal, tensors
    from transformers import AutoModelForCausalLM, LlamaConfig

    small = dict(vocab_size=97, hidden_size=64, intermediate_size=90, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(world)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**small))
    full_path = os.path.join(work, f"{name}-full.pt")
    torch.save(model.state_dict(), full_path)
    src, ref, ours = (os.path.join(work, f"{name}-{d}") for d in ("src", "ref", "devmap"))
    start_ranks(rank_main, (world, port, full_path, src, layout, nested, hf_files), world, preload=PRELOAD)
    (model.to(dtype) if dtype else model).save_pretrained(ref)
    with torch.no_grad():
        want_logits = AutoModelForCausalLM.from_pretrained(ref)(INPUT).logits
    extra = ["--dtype", str(dtype).removeprefix("torch.")] if dtype else []
    r = run([devmap, "save", src, "--config", ref, "--out", ours, "--quiet", *extra])
    if r.returncode != 0:
        sys.exit(f"FAIL {name}: devmap save: {r.stderr}")
    # The oracle: what torch loads from the folder, cast as torch casts.
    loaded = torch_loaded(src, nested, work, hf_files)
    got = tensors(ours)
    if sorted(got) != sorted(loaded):
        sys.exit(f"FAIL {name}: names differ from torch's: {sorted(set(got) ^ set(loaded))}")
    unequal = first_unequal(got, loaded, dtype)
    if unequal:
        sys.exit(f"FAIL {name}: {unequal} differs from the state dict torch loads")
    why = differences(ours, ref)
    if why:
        sys.exit(f"FAIL {name}: against transformers' save: {why}")
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(ours)(INPUT).logits
    if not torch.equal(logits, want_logits):
        sys.exit(f"FAIL {name}: logits differ by {float((logits - want_logits).abs().max())}")
    r = run([devmap, "verify", ours, "--against", src, "--config", ref, "--quiet", *extra])
    if r.returncode != 0:
        sys.exit(f"FAIL {name}: verify --against: {r.stdout[-600:]} {r.stderr[-600:]}")
    r = run([devmap, "inspect", src, "--config", ref, "--json"])
    chunks = [t["source"] for t in json.loads(r.stdout)["tensors"]
              if t["source"]["kind"] == "pieces"]
    ranks = {c["rank"] for s in chunks for c in s["chunks"]}
    split_dims = {d for s in chunks for c in s["chunks"] for d, o in enumerate(c["offsets"]) if o > 0}
    if split_dims != ({0} if layout == "dim0" else {0, 1}):
        sys.exit(f"FAIL {name}: the checkpoint is split along {split_dims}, not as the case means")
    if r.returncode != 0 or not chunks or ranks != set(range(world)):
        sys.exit(f"FAIL {name}: inspect --json does not show the chunks and their ranks: {r.stdout[-400:]} {r.stderr}")
    how = "cast to " + str(dtype).removeprefix("torch.") if dtype else "as stored"
    oracle = "torch's consolidate_safetensors_files" if hf_files else "the state dict torch loads"
    print(f"ok: {name}: {len(loaded)} tensors from {world} ranks ({layout}{', nested' if nested else ''}), {how}, "
          f"bit for bit {oracle} and transformers' save; logits equal; verify --against clean; "
          f"inspect names {len(chunks)} split tensors' chunks and ranks")
    return src, ref


def damaged(devmap, work, src, config, label, damage, needles):
    """A copy of `src` whose `.metadata` is edited by `damage(metadata)`: inspect warns
    naming `needles`, save refuses naming them with nothing written."""
    import shutil

    folder = os.path.join(work, label)
    shutil.copytree(src, folder)
    path = os.path.join(folder, ".metadata")
    with open(path, "rb") as f:
        meta = pickle.load(f)
    damage(meta)
    with open(path, "wb") as f:
        pickle.dump(meta, f)
    r = run([devmap, "inspect", folder, "--config", config])
    seen = r.stdout + r.stderr
    if r.returncode != 0 or any(n not in seen for n in needles):
        sys.exit(f"FAIL {label}: inspect must warn naming {needles}: {r.returncode} {seen[-800:]}")
    out = os.path.join(work, f"{label}-out")
    r = run([devmap, "save", folder, "--config", config, "--out", out, "--quiet"])
    if r.returncode == 0 or any(n not in r.stderr for n in needles) or os.path.exists(out):
        sys.exit(f"FAIL {label}: save must be refused naming {needles}, nothing written: {r.returncode} {r.stderr}")
    print(f"ok: {label}: inspect warns and save refuses, naming {', '.join(needles)}; nothing written")


def main(devmap):
    work = workdir(prefix="devmap-dcp-ranks-")
    src, ref = case(devmap, work, "two-ranks-dim0", 2, "dim0", True, None, 29531)
    case(devmap, work, "four-ranks-mixed", 4, "mixed", False, torch.bfloat16, 29532)
    case(devmap, work, "transformers-rank-files", 2, "mixed", False, None, 29533, hf_files=True)
    transformers_case(devmap, work, "fsdp", 29534)
    transformers_case(devmap, work, "tp", 29535)

    from torch.distributed.checkpoint.metadata import MetadataIndex

    name = "model.model.layers.0.mlp.up_proj.weight"

    def gap(meta):
        meta.state_dict_metadata[name].chunks.pop()

    def overlap(meta):
        entry = meta.state_dict_metadata[name]
        second = entry.chunks[1]
        moved = torch.Size([second.offsets[0] - 1, *second.offsets[1:]])
        for index in [i for i in meta.storage_data if i.fqn == name and i.offset == second.offsets]:
            meta.storage_data[MetadataIndex(name, moved, index.index)] = meta.storage_data.pop(index)
        second.offsets = moved

    short = name.removeprefix("model.")
    damaged(devmap, work, src, ref, "chunk-missing", gap, [f"`{short}`", "in no chunk", "[45, 0]"])
    damaged(devmap, work, src, ref, "chunks-overlap", overlap, [f"`{short}`", "chunks 0 and 1 overlap"])


if __name__ == "__main__":
    main(sys.argv[1])
