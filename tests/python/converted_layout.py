"""transformers 5 writes a Mixtral's disk-offloaded experts fused, under runtime names;
devmap must name them in inspect and refuse to save both layouts, with nothing written.

Usage: python converted_layout.py PATH/TO/devmap
"""

import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM


def main(devmap):
    work = tempfile.mkdtemp(prefix="devmap-converted-")
    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1,
    )
    src, off = os.path.join(work, "src"), os.path.join(work, "off")
    MixtralForCausalLM(config).save_pretrained(src)
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    AutoModelForCausalLM.from_pretrained(src, device_map=device_map, offload_folder=off)
    fused = sorted(f[: -len(".safetensors")] for f in os.listdir(off) if ".experts." in f)
    if not fused:
        sys.exit(f"FAIL: this transformers wrote no fused experts: {os.listdir(off)}")
    r = subprocess.run([devmap, "inspect", src, "--offload-folder", off, "--json"], capture_output=True, text=True, check=True)
    kinds = {w["kind"]: w["names"] for w in json.loads(r.stdout)["warnings"]}
    if sorted(kinds.get("converted_layout", [])) != fused:
        sys.exit(f"FAIL: inspect does not name {fused}: {kinds}")
    out = os.path.join(work, "out")
    r = subprocess.run([devmap, "save", src, "--offload-folder", off, "--out", out], capture_output=True, text=True)
    if r.returncode == 0 or os.path.exists(out) or fused[0] not in r.stderr:
        sys.exit(f"FAIL: save must refuse with nothing written: {r.returncode} {r.stderr}")
    print(f"ok: transformers' fused offload experts {fused} are named and the save is refused")


if __name__ == "__main__":
    main(sys.argv[1])
