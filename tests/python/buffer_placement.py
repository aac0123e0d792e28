"""Where the loaded model holds each tensor, against where `devmap inspect` says it is.

transformers saves a tiny GLM-4-MoE (its routers hold the persistent buffer
`mlp.gate.e_score_correction_bias`), loads it back with layers on the CPU and on disk
through an offload folder, and writes its `hf_device_map` beside it. accelerate keeps
the buffers of disk-offloaded modules on the main device (`offload_buffers=False`,
the default), so the loaded model holds them on the CPU while their layer's weights
are on `meta`. For every tensor of the checkpoint, devmap's placement must be the
loaded model's device (`disk` for `meta`).

Usage: python buffer_placement.py PATH/TO/devmap
"""

from saved import workdir
import json
import os
import subprocess
import sys
import warnings

import torch
import transformers
from transformers import AutoModelForCausalLM, Glm4MoeConfig, Glm4MoeForCausalLM

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()


def main(devmap):
    work = workdir(prefix="devmap-buffers-")
    torch.manual_seed(0)
    config = Glm4MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, n_group=1, topk_group=1, max_position_embeddings=64,
    )
    src = os.path.join(work, "src")
    Glm4MoeForCausalLM(config).save_pretrained(src)
    device_map = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "disk",
        "model.layers.2": "disk",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    }
    offload = os.path.join(work, "offload")
    loaded = AutoModelForCausalLM.from_pretrained(src, device_map=device_map, offload_folder=offload)
    with open(os.path.join(src, "device_map.json"), "w") as f:
        json.dump(loaded.hf_device_map, f)

    held = {}
    for name, t in list(loaded.named_parameters()) + list(loaded.named_buffers()):
        held[name] = "disk" if t.device.type == "meta" else t.device.type
    buffers = [n for n in held if n.endswith("e_score_correction_bias")]
    if not buffers or any(held[n] != "cpu" for n in buffers):
        raise SystemExit(f"the premise does not hold: router buffers are held on {[held[n] for n in buffers]}")
    on_disk = [n for n, where in held.items() if where == "disk"]
    if not on_disk:
        raise SystemExit("the premise does not hold: nothing is on disk")

    args = [devmap, "inspect", src, "--json", "--transformers", "none"]
    if os.path.isdir(offload) and os.listdir(offload):
        args += ["--offload-folder", offload]
    report = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    placed = {t.get("loaded_as") or t["name"]: t["placement"] for t in report["tensors"]}
    wrong = [(n, placed.get(n), where) for n, where in held.items() if n in placed and placed[n] != where]
    compared = sum(1 for n in held if n in placed)
    if wrong or compared < len(buffers) + len(on_disk):
        raise SystemExit(f"devmap places differently from the loaded model (name, devmap, loaded): {wrong[:10]}; compared {compared}")
    print(f"ok: {compared} tensors placed as the loaded model holds them, "
          f"{len(buffers)} router buffers on cpu, {len(on_disk)} weights on disk")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    main(sys.argv[1])
