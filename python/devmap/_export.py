"""From a Python session to devmap: write what devmap needs to see a model you loaded
with a device map.

    import devmap
    model = AutoModelForCausalLM.from_pretrained(path, device_map=..., offload_folder=...)
    devmap.export(model, path, offload_folder)   # then: devmap path  /  devmap save path ...

It writes
- `device_map.json` beside the checkpoint (or where `device_map_path` says): the
  model's `hf_device_map`;
- `index.json` in the offload folder: the offload index that transformers 5 keeps only
  in memory, entries `{safetensors_file, weight_name, dtype}` pointing into the
  checkpoint (absolute paths) with the dtype the model loads them as; written again on
  every export, unless the folder holds an index of another kind.

The `devmap` command sees what is on disk: the checkpoint and the offload folder.
Values changed only in memory are saved from the session by `devmap.save_pretrained`.
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


def device_map(model):
    """The model's `hf_device_map`; a model that transformers put on one device has
    none, and is `{"": device}`."""
    mapped = getattr(model, "hf_device_map", None)
    if mapped:
        return mapped
    device = next(model.parameters()).device
    return {"": device.index if device.type == "cuda" else device.type}


def export(model, checkpoint_dir, offload_folder=None, device_map_path=None):
    """Writes device_map.json and the offload index; returns the paths written.

    Paths in the index are absolute (the loader keeps them as they were given, relative
    to the folder Python ran in, which need not be devmap's). Exporting again rewrites
    an index export wrote before, so it follows the model's current offload state; an
    index of another kind (accelerate's `.dat` index) is left alone."""
    path = device_map_path or os.path.join(checkpoint_dir, "device_map.json")
    with open(path, "w") as f:
        json.dump(device_map(model), f, indent=2)
    written = [path]
    if offload_folder:
        folder = os.path.abspath(offload_folder)
        # The folder exists after an export even when nothing is offloaded (devmap
        # refuses an --offload-folder that is not there).
        os.makedirs(folder, exist_ok=True)
        target = os.path.join(folder, "index.json")
        index = {}
        for name, entry in offload_index(model).items():
            entry = dict(entry)
            file = entry.get("safetensors_file")
            if file is not None:
                file = os.path.abspath(file)
                # A per-tensor file in the offload folder itself is read by devmap as
                # it is; listing it here too would name the tensor twice.
                if os.path.dirname(file) == folder:
                    continue
                entry["safetensors_file"] = file
            index[name] = entry
        ours = True
        if os.path.exists(target):
            with open(target) as f:
                existing = json.load(f)
            ours = all(isinstance(e, dict) and "safetensors_file" in e for e in existing.values())
        if index and ours:
            os.makedirs(folder, exist_ok=True)
            with open(target, "w") as f:
                json.dump(index, f, indent=2)
            written.append(target)
    return written
