"""A save split over processes equals a single save, byte for byte, on the inputs of
training jobs: a torch.distributed.checkpoint folder written by 4 CPU ranks (FSDP's
dim-0 layout) and a DeepSpeed ZeRO-3 checkpoint of 2 ranks. For each, `devmap save
--part K/4` for K = 1..4 then `--commit 4` must leave OUT exactly as one `devmap save`
does. Then the 4 parts run under torchrun (`--nproc-per-node 4 --no-python`, each
part from `--part auto`: torchrun's RANK and WORLD_SIZE), and the commit.

Usage: python parts_sources.py PATH/TO/devmap
"""

from saved import start_ranks, workdir
import filecmp
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}: {r.stderr[-2000:]}")
    return r


def same_folders(a, b):
    names = sorted(os.listdir(a))
    if names != sorted(os.listdir(b)):
        return f"files differ: {names} vs {sorted(os.listdir(b))}"
    for n in names:
        if not filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False):
            return f"{n} differs"
    return None


def split_equals_single(devmap, work, name, src, config):
    single, split = os.path.join(work, f"{name}-single"), os.path.join(work, f"{name}-split")
    common = ["--config", config, "--max-shard-size", "60KB", "--quiet"]
    run([devmap, "save", src, "--out", single, *common])
    for k in range(1, 5):
        run([devmap, "save", src, "--out", split, "--part", f"{k}/4", *common])
    run([devmap, "save", src, "--out", split, "--commit", "4", *common])
    why = same_folders(single, split)
    if why:
        sys.exit(f"FAIL {name}: 4 parts + commit differ from a single save: {why}")
    shards = [n for n in os.listdir(split) if n.endswith(".safetensors")]
    print(f"ok: {name}: 4 parts + commit are byte-identical to a single save ({len(shards)} shards)")
    return single


def under_torchrun(devmap, work, name, src, config, single):
    out = os.path.join(work, f"{name}-torchrun")
    common = ["--config", config, "--max-shard-size", "60KB", "--quiet"]
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "--no-python",
         devmap, "save", src, "--out", out, "--part", "auto", *common])
    run([devmap, "save", src, "--out", out, "--commit", "4", *common])
    why = same_folders(single, out)
    if why:
        sys.exit(f"FAIL {name}: torchrun's 4 parts + commit differ from a single save: {why}")
    print(f"ok: {name}: 4 parts under torchrun (--part auto) + commit are byte-identical to a single save")


def main(devmap):
    import dcp_ranks
    import deepspeed_zero
    from transformers import AutoModelForCausalLM, LlamaConfig

    work = workdir(prefix="devmap-parts-")
    # DCP, 4 ranks, dim-0 shards.
    small = dict(vocab_size=97, hidden_size=64, intermediate_size=90, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(4)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**small))
    full = os.path.join(work, "dcp-full.pt")
    torch.save(model.state_dict(), full)
    src, config = os.path.join(work, "dcp-src"), os.path.join(work, "dcp-config")
    start_ranks(dcp_ranks.rank_main, (4, 29311, full, src, "dim0", False, False), 4, preload=dcp_ranks.PRELOAD)
    model.save_pretrained(config)
    single = split_equals_single(devmap, work, "dcp-4-ranks", src, config)
    under_torchrun(devmap, work, "dcp-4-ranks", src, config, single)
    # ZeRO-3, 2 ranks.
    src, config = os.path.join(work, "zero3-src"), os.path.join(work, "zero3-config")
    deepspeed_zero.train("ZeRO-3", (29312, 29322), 3, False, src, config)
    split_equals_single(devmap, work, "zero3", src, config)


if __name__ == "__main__":
    main(os.path.abspath(sys.argv[1]))
