"""Reading a saved checkpoint folder back with Python's safetensors (shared by the
reference-library checks)."""

import os

from safetensors import safe_open


def tensors(folder):
    """{name: tensor} for every tensor of every `.safetensors` file in `folder`."""
    out = {}
    for file in sorted(os.listdir(folder)):
        if file.endswith(".safetensors"):
            with safe_open(os.path.join(folder, file), "pt") as st:
                for key in st.keys():
                    out[key] = st.get_tensor(key)
    return out
