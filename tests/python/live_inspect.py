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
model = AutoModelForCausalLM.from_pretrained(os.path.join(work, "src"), device_map=device_map,
                                             offload_folder=os.path.join(work, "offload"))
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
    if "no offload folder" in report:
        raise SystemExit(f"the report warns of a missing offload folder:\n{report}")
    print("ok: the report outside a terminal")
else:
    devmap.inspect(model)
    print("INSPECTOR CLOSED")
