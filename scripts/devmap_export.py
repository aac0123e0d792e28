"""From a Python session to devmap: write what devmap needs to see a model you loaded
with a device map.

    from devmap_export import export
    model = AutoModelForCausalLM.from_pretrained(path, device_map=..., offload_folder=...)
    export(model, path, offload_folder)          # then: devmap path  /  devmap save path ...

It writes
- `device_map.json` beside the checkpoint (or where `device_map_path` says): the
  model's `hf_device_map`;
- `index.json` in the offload folder, when the folder has none: the offload index that
  transformers 5 keeps only in memory, entries `{safetensors_file, weight_name, dtype}`
  pointing into the checkpoint with the dtype the model loads them as.

What devmap can see is what is on disk: the checkpoint and the offload folder. Values
changed only in RAM or on a GPU (an in-place edit of a cpu or cuda parameter) are not
on disk and devmap cannot save them; save those with save_pretrained, or write them
into the offload folder first. To save a model with a LoRA adapter merged, give devmap
the base model and the adapter (`--merge-lora`) instead of merging in Python.
"""

import json
import os


def offload_index(model):
    """The offload index accelerate's hooks hold for a model loaded with disk offload."""
    index = {}
    for module in model.modules():
        hook = getattr(module, "_hf_hook", None)
        loader = getattr(getattr(hook, "weights_map", None), "dataset", None)
        index.update(getattr(loader, "index", None) or {})
    return index


def export(model, checkpoint_dir, offload_folder=None, device_map_path=None):
    """Writes device_map.json (and the offload index, when on disk there is none)."""
    path = device_map_path or os.path.join(checkpoint_dir, "device_map.json")
    with open(path, "w") as f:
        json.dump(model.hf_device_map, f, indent=2)
    written = [path]
    if offload_folder:
        target = os.path.join(offload_folder, "index.json")
        index = offload_index(model)
        if index and not os.path.exists(target):
            os.makedirs(offload_folder, exist_ok=True)
            with open(target, "w") as f:
                json.dump(index, f, indent=2)
            written.append(target)
    return written
