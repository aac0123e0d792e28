"""devmap reads `pytorch_model.bin` checkpoints as torch.save writes them: for each
case, torch writes the state dict (one file, or shards with transformers'
`pytorch_model.bin.index.json`), transformers loads the folder and saves it as
safetensors (the reference), and `devmap save` converts the same folder. Checked: the
same names, dtypes, shapes and bytes as transformers writes, and from_pretrained(OUT)
gives the reference's logits exactly. Views torch.save keeps with their strides (a
transposed head, a slice of a wider matrix, a transposed matrix past one assembly
window, cast too) are read as torch reads them. A view with no contiguous dimension
and a pickle naming a global a state dict never needs (os.system) are refused, naming
them, with nothing written and nothing run.

Usage: python torch_bin.py PATH/TO/devmap
"""

from saved import workdir
import json
import os
import pickle
import subprocess
import sys
import zipfile

import torch
from saved import differences, tensors
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

WORK = workdir(prefix="devmap-bin-")
INPUT = torch.tensor([[1, 5, 9, 33, 2, 17, 60, 3]])


def write_bin(model, folder, shards=1):
    """The state dict as transformers 4 wrote it with safe_serialization=False."""
    os.makedirs(folder, exist_ok=True)
    model.config.save_pretrained(folder)
    state = model.state_dict()
    if shards == 1:
        torch.save(state, os.path.join(folder, "pytorch_model.bin"))
        return
    names = list(state)
    per = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        part = names[i * per:(i + 1) * per]
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        torch.save({n: state[n] for n in part}, os.path.join(folder, file))
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    with open(os.path.join(folder, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)


def devmap_save(devmap, src, out):
    return subprocess.run([devmap, "save", src, "--out", out, "--quiet"], capture_output=True, text=True)


def case(devmap, name, model, shards, src=None):
    """`model` written as .bin files (or the folder `src` already written), read back
    by transformers and by devmap."""
    ref, ours = (os.path.join(WORK, f"{name}-{d}") for d in ("ref", "devmap"))
    if src is None:
        src = os.path.join(WORK, f"{name}-src")
        write_bin(model, src, shards)
    loaded = AutoModelForCausalLM.from_pretrained(src)
    loaded.save_pretrained(ref)
    with torch.no_grad():
        ref_logits = loaded(INPUT).logits
    r = devmap_save(devmap, src, ours)
    if r.returncode != 0:
        sys.exit(f"FAIL {name}: devmap save: {r.stderr}")
    why = differences(ours, ref)
    if why:
        sys.exit(f"FAIL {name}: {why}")
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(ours)(INPUT).logits
    if not torch.equal(logits, ref_logits):
        sys.exit(f"FAIL {name}: logits differ by {float((logits - ref_logits).abs().max())}")
    print(f"ok: {name}: {len(tensors(ref))} tensors from {shards} .bin file(s), identical to transformers' save; logits equal")


def refused(devmap, name, folder, needle):
    out = os.path.join(WORK, f"{name}-out")
    r = devmap_save(devmap, folder, out)
    if r.returncode == 0 or needle not in r.stderr or os.path.exists(out):
        sys.exit(f"FAIL {name}: must be refused naming `{needle}` with nothing written: {r.returncode} {r.stderr}")
    print(f"ok: {name}: refused, naming {needle}; nothing written")


def main(devmap):
    small = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    tied = AutoModelForCausalLM.from_config(LlamaConfig(tie_word_embeddings=True, **small)).to(torch.bfloat16)
    case(devmap, "llama-bf16-tied", tied, 1)
    torch.manual_seed(1)
    qwen = AutoModelForCausalLM.from_config(Qwen2Config(tie_word_embeddings=False, **small))
    case(devmap, "qwen2-f32-sharded", qwen, 3)

    # Views torch.save keeps as their storage and strides: a transposed head and a
    # slice of a wider matrix, read through their strides, as transformers loads them.
    views = AutoModelForCausalLM.from_config(Qwen2Config(tie_word_embeddings=False, **small))
    state = dict(views.state_dict())
    state["lm_head.weight"] = state["lm_head.weight"].t().contiguous().t()
    name = "model.layers.0.mlp.gate_proj.weight"
    w = state[name]
    wide = torch.zeros(w.shape[0], w.shape[1] + 7)
    wide[:, 3:3 + w.shape[1]] = w
    state[name] = wide[:, 3:3 + w.shape[1]]
    assert not state["lm_head.weight"].is_contiguous() and not state[name].is_contiguous()
    folder = os.path.join(WORK, "views-src")
    os.makedirs(folder)
    views.config.save_pretrained(folder)
    torch.save(state, os.path.join(folder, "pytorch_model.bin"))
    case(devmap, "views", None, 1, src=folder)

    # A transposed matrix past one assembly window (6.6 MB), saved as is and cast.
    folder = os.path.join(WORK, "big-view")
    os.makedirs(folder)
    big = torch.randn(1100, 1500).t()
    torch.save({"w": big, "b": torch.arange(6.0)[::1]}, os.path.join(folder, "pytorch_model.bin"))
    for dtype in (None, torch.bfloat16):
        out = os.path.join(WORK, f"big-view-{dtype}")
        extra = ["--dtype", "bfloat16"] if dtype else []
        r = subprocess.run([devmap, "save", folder, "--out", out, "--quiet", *extra], capture_output=True, text=True)
        got = tensors(out) if r.returncode == 0 else {}
        want = big.to(dtype) if dtype else big
        if "w" not in got or got["w"].dtype != want.dtype or not torch.equal(got["w"], want.contiguous()):
            sys.exit(f"FAIL big-view ({dtype}): not the view's values: {r.stderr}")
        r = subprocess.run([devmap, "verify", out, "--against", folder, "--quiet", *extra],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"FAIL big-view ({dtype}): verify --against: {r.stdout[-600:]} {r.stderr[-600:]}")
    print("ok: big-view: a transposed 1500×1100 float32 view (past one window) written as torch reads it, "
          "as is and cast to bfloat16; verify --against clean")

    # Every other element: no dimension is contiguous in storage; refused by name.
    folder = os.path.join(WORK, "strided-view")
    os.makedirs(folder)
    qwen.config.save_pretrained(folder)
    state = dict(qwen.state_dict())
    state["lm_head.weight"] = torch.zeros(96, 128)[:, ::2]
    torch.save(state, os.path.join(folder, "pytorch_model.bin"))
    refused(devmap, "every-other-element", folder, "lm_head.weight")

    # A pickle that would run os.system if loaded: never run, refused by name.
    folder = os.path.join(WORK, "evil")
    os.makedirs(folder)
    qwen.config.save_pretrained(folder)

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + os.path.join(WORK, "pwned"),))

    path = os.path.join(folder, "pytorch_model.bin")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("pytorch_model/data.pkl", pickle.dumps({"x": Evil()}, protocol=2))
    refused(devmap, "forbidden-global", folder, "posix.system")
    if os.path.exists(os.path.join(WORK, "pwned")):
        sys.exit("FAIL: the pickle ran")


if __name__ == "__main__":
    main(sys.argv[1])
