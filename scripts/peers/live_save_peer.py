"""One save of a live model, measured: loads the bench model with half its layers on
disk and the rest on the CPU (loaded as it is stored), edits one parameter in place,
then saves it with `devmap.save_pretrained` or transformers' `save_pretrained` and
prints one JSON line: seconds, the RSS before the save and its growth to the peak
during the save (the peak is reset after loading, through /proc/self/clear_refs).

Usage: live_save_peer.py MODEL OFFLOAD OUT devmap|transformers [--no-fsync]
"""
import json
import sys

import torch
from measure import measure
from transformers import AutoConfig, AutoModelForCausalLM


model_dir, offload, out, who = sys.argv[1:5]
fsync = sys.argv[5:] != ["--no-fsync"]
layers = AutoConfig.from_pretrained(model_dir).num_hidden_layers
device_map = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
for i in range(layers):
    device_map[f"model.layers.{i}"] = "disk" if i >= layers // 2 else "cpu"
model = AutoModelForCausalLM.from_pretrained(model_dir, device_map=device_map, offload_folder=offload,
                                             dtype="auto")
with torch.no_grad():
    model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
if who == "devmap":
    import devmap

    def save():
        devmap.save_pretrained(model, out, progress=False, verify=False, force=True, fsync=fsync)
else:
    def save():
        model.save_pretrained(out)
result = measure(save)
print(json.dumps({"who": who, **result}))
