"""The seed's flow of issue 37, one save measured: a float32 Llama loaded with layers
0–2 on the CPU and the rest on disk (`offload_folder`), a LoRA on q_proj/v_proj of
every layer merged with peft's `merge_and_unload()` (peft onloads the disk layers'
values into plain dicts on their hooks), then saved by `devmap.save_pretrained` or
transformers' `save_pretrained`. Prints one JSON line (see measure.py).

Usage: peft_offload_peer.py MODEL OFFLOAD OUT devmap|devmap-no-fsync|transformers
"""
import json
import sys
import warnings

import torch
from measure import measure
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

model_dir, offload, out, who = sys.argv[1:5]
layers = AutoConfig.from_pretrained(model_dir).num_hidden_layers
device_map = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
for i in range(layers):
    device_map[f"model.layers.{i}"] = "cpu" if i < 3 else "disk"
model = AutoModelForCausalLM.from_pretrained(model_dir, device_map=device_map, offload_folder=offload,
                                             dtype=torch.float32)
torch.manual_seed(1)
lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
model = get_peft_model(model, lora).merge_and_unload()
if who.startswith("devmap"):
    import devmap

    def save():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the note naming the layers peft left unmerged
            devmap.save_pretrained(model, out, progress=False, verify=False, force=True,
                                   fsync=who == "devmap")
else:
    def save():
        model.save_pretrained(out)
print(json.dumps({"who": who, **measure(save)}))
