"""Reads a saved checkpoint with the Python `safetensors` library (a client devmap's
authors did not write) and prints what it found as JSON on stdout:

    {"index": {...} | null, "tensors": {name: {"dtype", "shape", "hex"}}}

`hex` is the tensor's bytes as numpy sees them; for bfloat16, which numpy lacks, the
bytes are read through `get_slice` metadata and the raw file range instead.
"""

import json
import os
import sys

from safetensors import safe_open


def main(out_dir):
    index_path = os.path.join(out_dir, "model.safetensors.index.json")
    index = None
    if os.path.exists(index_path):
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)
        files = sorted(set(index["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        path = os.path.join(out_dir, name)
        with open(path, "rb") as raw:
            header_len = int.from_bytes(raw.read(8), "little")
            header = json.loads(raw.read(header_len))
            blob = raw.read()
        with safe_open(path, framework="numpy") as f:
            assert f.metadata() == {"format": "pt"}, f.metadata()
            for key in f.keys():
                sl = f.get_slice(key)
                dtype = sl.get_dtype()
                shape = list(sl.get_shape())
                if dtype == "BF16":
                    begin, end = header[key]["data_offsets"]
                    data = blob[begin:end]
                else:
                    data = f.get_tensor(key).tobytes()
                if index is not None:
                    assert index["weight_map"][key] == name, key
                tensors[key] = {"dtype": dtype, "shape": shape, "hex": data.hex()}
    json.dump({"index": index, "tensors": tensors}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
