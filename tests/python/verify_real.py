"""devmap verify on checkpoints transformers itself wrote: a tied bfloat16 Llama in
several shards and an untied float32 GPT-NeoX-style model in one file must verify
clean, alone and against themselves through a devmap save; and a transformers
checkpoint whose index and config were tampered with must not.

Usage: python verify_real.py PATH/TO/devmap
Exits non-zero on any mismatch. Needs torch and transformers.
"""

from saved import workdir
import json
import os
import subprocess
import sys

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM


def verify(devmap, out, *extra):
    r = subprocess.run(
        [devmap, "verify", out, "--json", "--quiet", *extra],
        capture_output=True,
        text=True,
    )
    report = json.loads(r.stdout) if r.stdout else None
    return r.returncode, report, r.stderr


def expect_clean(devmap, out, *extra):
    code, report, err = verify(devmap, out, *extra)
    if code != 0 or report["differences"] != 0:
        sys.exit(f"FAIL: {out} {extra} should verify clean: exit {code}\n{report}\n{err}")
    return report


def main(devmap):
    work = workdir(prefix="devmap-verify-real-")
    torch.manual_seed(0)

    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            tie_word_embeddings=True,
        )
    ).to(torch.bfloat16)
    tied = os.path.join(work, "llama")
    llama.save_pretrained(tied, max_shard_size="100KB")
    shards = [f for f in os.listdir(tied) if f.endswith(".safetensors")]
    assert len(shards) > 1, shards
    report = expect_clean(devmap, tied)
    print(f"ok: transformers' tied bf16 Llama ({report['tensors']} tensors, {len(shards)} shards) verifies clean")

    neox = GPTNeoXForCausalLM(
        GPTNeoXConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            tie_word_embeddings=False,
        )
    )
    untied = os.path.join(work, "neox")
    neox.save_pretrained(untied)
    expect_clean(devmap, untied)
    print("ok: transformers' untied float32 GPT-NeoX (single file) verifies clean")

    # devmap's save of transformers' checkpoint, compared tensor by tensor.
    saved = os.path.join(work, "llama-saved")
    subprocess.run([devmap, "save", tied, "--out", saved, "--quiet", "--max-shard-size", "50KB"], check=True)
    report = expect_clean(devmap, saved, "--against", tied)
    assert report["compared"] == report["tensors"], report
    print(f"ok: devmap's re-save compares equal on all {report['compared']} tensors")

    # Tampering with transformers' own output is caught.
    index_path = os.path.join(tied, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    dropped = sorted(index["weight_map"])[0]
    del index["weight_map"][dropped]
    with open(index_path, "w") as f:
        json.dump(index, f)
    code, report, err = verify(devmap, tied)
    kinds = {(d["kind"], d["subject"]) for d in report["findings"] if d["severity"] == "difference"}
    if code != 1 or ("not-in-index", dropped) not in kinds:
        sys.exit(f"FAIL: a tensor dropped from transformers' index is not named: {code} {kinds}")
    print(f"ok: dropping `{dropped}` from the index is named")


if __name__ == "__main__":
    main(sys.argv[1])
