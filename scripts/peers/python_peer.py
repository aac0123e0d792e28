"""What transformers does to save an offloaded model, as a benchmark peer: for each shard,
onload every tensor of it into RAM (checkpoint tensors through `safetensors.safe_open`,
disk-offloaded ones from accelerate's `.dat` files), write the shard with
`safetensors.numpy.save_file`, release it. Peak memory grows with the shard size.

Usage: python python_peer.py MODEL_DIR OUT_DIR MAX_SHARD_BYTES
"""

import json
import os
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file


def main(model, out, max_shard):
    with open(os.path.join(model, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    offload = os.path.join(model, "offload")
    with open(os.path.join(offload, "index.json")) as f:
        offload_index = json.load(f)

    def layer_key(name):
        return [int(p) if p.isdigit() else p for p in name.split(".")]

    names = sorted(set(weight_map) | set(offload_index), key=layer_key)
    sizes = {}
    for name in names:
        if name in offload_index:
            info = offload_index[name]
            n = int(np.prod(info["shape"])) if info["shape"] else 1
            sizes[name] = n * np.dtype(info["dtype"]).itemsize
        else:
            with safe_open(os.path.join(model, weight_map[name]), "numpy") as f:
                sl = f.get_slice(name)
                n = int(np.prod(sl.get_shape())) if sl.get_shape() else 1
                sizes[name] = n * {"F16": 2, "F32": 4, "BF16": 2}[sl.get_dtype()]
    shards, current, total = [], [], 0
    for name in names:
        if current and total + sizes[name] > max_shard:
            shards.append(current)
            current, total = [], 0
        current.append(name)
        total += sizes[name]
    if current:
        shards.append(current)
    os.makedirs(out, exist_ok=True)
    for k, members in enumerate(shards):
        tensors = {}
        for name in members:
            if name in offload_index:
                info = offload_index[name]
                tensors[name] = np.fromfile(os.path.join(offload, name + ".dat"), dtype=info["dtype"]).reshape(info["shape"])
            else:
                with safe_open(os.path.join(model, weight_map[name]), "numpy") as f:
                    tensors[name] = f.get_tensor(name)
        save_file(tensors, os.path.join(out, f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"), metadata={"format": "pt"})
        del tensors


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
