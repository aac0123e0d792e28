"""The bytes `devmap plan` counts for a quantized checkpoint, against what transformers
holds once it has loaded it: `get_memory_footprint()` of the model `from_pretrained`
makes (compressed-tensors' compressed modules, on CPU), for NVFP4, MXFP8, packed INT4
(symmetric, groups of 32) and per-row FP8. Each checkpoint is made by
compressed-tensors' own compressors (the generators of the dequantization checks).

Usage: python quantized_footprint.py PATH/TO/devmap
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM

import compressed_fp8
import nvfp4_mxfp8
import packed_int

MAKERS = {
    "nvfp4": lambda d: nvfp4_mxfp8.make(d, "NVFP4A16"),
    "mxfp8": lambda d: nvfp4_mxfp8.make(d, "MXFP8A16"),
    "int4 groups of 32, symmetric": lambda d: packed_int.make(d, 4, "group", 32, True, torch.bfloat16),
    "fp8 per row": lambda d: compressed_fp8.make(d, "channel", torch.bfloat16),
}


def main(devmap):
    work = tempfile.mkdtemp(prefix="devmap-footprint-")
    failures = []
    for i, (name, make) in enumerate(MAKERS.items()):
        folder = os.path.join(work, str(i))
        make(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
        theirs = model.get_memory_footprint()
        r = subprocess.run([devmap, "plan", folder, "--max-memory", "cpu=10GiB", "--json"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"{name}: plan failed: {r.stderr}")
            continue
        ours = sum(d["bytes"] for d in json.loads(r.stdout)["devices"])
        if ours != theirs:
            failures.append(f"{name}: devmap plans {ours} bytes, transformers holds {theirs}")
            continue
        print(f"ok: {name}: devmap plans {ours} bytes, get_memory_footprint() {theirs}")
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
