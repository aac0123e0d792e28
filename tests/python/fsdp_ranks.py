"""devmap.save_pretrained called on every rank of a sharded job (FSDP2 `fully_shard` on
CPU with gloo, 2 and 4 ranks), against transformers' save_pretrained of the same model
unsharded. Run by tests/real/python_bridge.rs with the devmap package on PYTHONPATH;
prints one `ok: ` line per case and exits non-zero on the first failure.

Each case builds a model (a tied Llama with a vocabulary no world size divides; a
Mixtral whose fused experts transformers splits per expert on save), shards it, trains
it two AdamW steps, and saves it with devmap from every rank. The reference is the
same weights gathered with torch's `get_model_state_dict(full_state_dict=True)` into an
unsharded model and saved by transformers' `save_pretrained`: names, dtypes, bytes and
config.json must be equal, and the shard files byte-identical to devmap's own save of
the unsharded model. A cast (`dtype="bfloat16"`) is checked the same way, and ranks that
disagree on the save are refused on every rank with nothing written.
"""

from saved import shard_and_train, start_ranks, tensors, workdir
import json
import os
import sys

import torch
import torch.distributed as dist

# Made by the checking process only: the ranks, forked from a server that imports this
# file again, would each make (and leave) a folder of their own.
WORK = workdir(prefix="devmap-fsdp-") if __name__ == "__main__" else None
SHARD = "40KB"


def same_bytes(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def model_of(kind):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    if kind == "llama":
        config = AutoConfig.for_model(
            "llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=101, tie_word_embeddings=True)
    else:
        config = AutoConfig.for_model(
            "mixtral", hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=96, num_local_experts=3, num_experts_per_tok=2)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def worker(rank, world, kind, init, out):
    import devmap
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    model = model_of(kind)
    shard_and_train(model, world, rank)

    ours = os.path.join(out, "devmap")
    report = devmap.save_pretrained(model, ours, max_shard_size=SHARD, progress=False)
    cast = os.path.join(out, "devmap-bf16")
    devmap.save_pretrained(model, cast, max_shard_size=SHARD, dtype="bfloat16", progress=False)

    # Ranks that disagree (another shard size on one) are refused on every rank.
    refused = os.path.join(out, "refused")
    try:
        devmap.save_pretrained(model, refused, max_shard_size=SHARD if rank else "30KB", progress=False)
        raise SystemExit(f"rank {rank}: a save the ranks disagree on was not refused")
    except devmap.DevmapError as err:
        if "planned different saves" not in str(err):
            raise SystemExit(f"rank {rank}: unexpected refusal: {err}")

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        if os.path.exists(refused) and os.listdir(refused):
            raise SystemExit(f"the refused save left {os.listdir(refused)} in {refused}")
        plain = model_of(kind)
        plain.load_state_dict(full)
        theirs = os.path.join(out, "transformers")
        plain.save_pretrained(theirs, max_shard_size=SHARD)
        single = os.path.join(out, "devmap-single")
        devmap.save_pretrained(plain, single, max_shard_size=SHARD, progress=False)
        a, b = tensors(theirs), tensors(ours)
        if sorted(a) != sorted(b):
            raise SystemExit(f"{kind}/{world}: names differ: transformers only {sorted(set(a) - set(b))}, "
                             f"devmap only {sorted(set(b) - set(a))}")
        differ = [k for k in a if not same_bytes(a[k], b[k])]
        if differ:
            raise SystemExit(f"{kind}/{world}: {len(differ)} tensors differ, e.g. {differ[:3]}")
        with open(os.path.join(theirs, "config.json")) as f, open(os.path.join(ours, "config.json")) as g:
            if json.load(f) != json.load(g):
                raise SystemExit(f"{kind}/{world}: config.json differs")
        files = sorted(n for n in os.listdir(single))
        if files != sorted(os.listdir(ours)):
            raise SystemExit(f"{kind}/{world}: files {sorted(os.listdir(ours))} != unsharded {files}")
        for name in files:
            with open(os.path.join(single, name), "rb") as f, open(os.path.join(ours, name), "rb") as g:
                if f.read() != g.read():
                    raise SystemExit(f"{kind}/{world}: {name} differs from the unsharded model's save")
        # The cast: what devmap writes of the unsharded model with dtype=bfloat16.
        single_cast = os.path.join(out, "devmap-single-bf16")
        devmap.save_pretrained(plain, single_cast, max_shard_size=SHARD, dtype="bfloat16", progress=False)
        c, d = tensors(single_cast), tensors(cast)
        if sorted(c) != sorted(d) or any(not same_bytes(c[k], d[k]) for k in c):
            raise SystemExit(f"{kind}/{world}: the bfloat16 save differs from the unsharded one's")
        if any(t.dtype != torch.bfloat16 for t in d.values() if t.is_floating_point()):
            raise SystemExit(f"{kind}/{world}: the bfloat16 save holds other floats")
        if len(report["shard_files"]) < 2:
            raise SystemExit(f"{kind}/{world}: expected several shards, got {report['shard_files']}")
        if os.path.exists(os.path.join(ours, ".devmap-parts")):
            raise SystemExit(f"{kind}/{world}: the ranks' folder was left in {ours}")
        print(f"ok: {kind} on {world} ranks: {len(b)} tensors in {len(report['shard_files'])} shards equal "
              "transformers' save of the gathered model; files equal devmap's unsharded save; bf16 cast equal; "
              "disagreeing ranks refused", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def run(kind, world):
    out = os.path.join(WORK, f"{kind}-{world}")
    os.makedirs(out)
    init = os.path.join(out, "init")
    start_ranks(worker, (world, kind, init, out), world,
                preload=("torch", "transformers.models.llama.modeling_llama",
                         "transformers.models.mixtral.modeling_mixtral", "devmap"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    cases = [("llama", 2), ("llama", 4), ("mixtral", 2), ("mixtral", 4)]
    # By hand, cases may be named (`llama-2`); other arguments (the runner's) are not cases.
    named = [c for c in cases if f"{c[0]}-{c[1]}" in sys.argv[1:]]
    cases = named or cases
    for kind, world in cases:
        run(kind, world)
