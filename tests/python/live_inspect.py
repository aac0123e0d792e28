"""devmap.inspect on a live model (cpu + disk) for tests/real/python_bridge.rs: in a
terminal (tmux) the inspector takes the screen until `q`, then `INSPECTOR CLOSED` is
printed; with `--report` (stdout not a terminal) the text report is printed instead
and checked here.
"""
from saved import workdir
import os
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import devmap

work = workdir(prefix="devmap-inspect-")
torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2)
LlamaForCausalLM(config).save_pretrained(os.path.join(work, "src"))
device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
              "model.layers.2": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
# Loaded as bfloat16 from a float32 checkpoint: the offload folder may keep the stored
# float32, and the report must count what the model holds.
model = AutoModelForCausalLM.from_pretrained(os.path.join(work, "src"), device_map=device_map,
                                             offload_folder=os.path.join(work, "offload"),
                                             dtype=torch.bfloat16)
if sys.argv[1:] == ["--report"]:
    import contextlib
    import io

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        devmap.inspect(model)
    report = text.getvalue()
    for want in ("LlamaForCausalLM in this Python session", "device map: 7 keys", "disk", "cpu",
                 "layers"):
        if want not in report:
            raise SystemExit(f"the report lacks {want!r}:\n{report}")
    # The disk's share of the bytes, as the model holds them (every tensor bfloat16).
    numel = {name: p.numel() for name, p in model.named_parameters()}
    on_disk = sum(n for name, n in numel.items() if name.startswith(("model.layers.1.", "model.layers.2.")))
    share = f"{on_disk * 100 / sum(numel.values()):.1f}%"
    disk_line = next((line for line in report.splitlines() if line.strip().startswith("disk ")), "")
    if not disk_line.endswith(share):
        raise SystemExit(f"the disk's share is not {share} (bfloat16 as held):\n{report}")
    if "no offload folder" in report:
        raise SystemExit(f"the report warns of a missing offload folder:\n{report}")
    print("ok: the report outside a terminal")
else:
    devmap.inspect(model)
    print("INSPECTOR CLOSED")
