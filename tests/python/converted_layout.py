"""transformers 5 offloads a mixture-of-experts layer's experts fused, under runtime
names (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`); devmap must read them
back as the checkpoint's per-expert tensors. Mixtral, Qwen2-MoE, LFM2-MoE (w1/w3/w2
under `feed_forward`, not renamed) and Nemotron-H (experts without a gate,
`mixer.experts.up_proj`, the checkpoint's `backbone.` loaded as `model.`): load with layer 1
on disk, change the fused offload values (as an edit on disk would), save with devmap,
and from_pretrained(OUT) must hold exactly the changed values and no extra keys.

Usage: python converted_layout.py PATH/TO/devmap
"""

from saved import workdir
import os
import subprocess
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Lfm2MoeConfig, MixtralConfig, NemotronHConfig, Qwen2MoeConfig

LLAMA_LIKE_MAP = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}


def check(devmap, family, config, device_map=LLAMA_LIKE_MAP):
    work = workdir(prefix=f"devmap-converted-{family}-")
    torch.manual_seed(0)
    src, off, out = (os.path.join(work, d) for d in ("src", "off", "out"))
    AutoModelForCausalLM.from_config(config).save_pretrained(src)
    AutoModelForCausalLM.from_pretrained(src, device_map=device_map, offload_folder=off)
    fused = sorted(f for f in os.listdir(off) if ".experts." in f and f.endswith(".safetensors"))
    if not fused:
        sys.exit(f"FAIL {family}: this transformers wrote no fused experts: {os.listdir(off)}")
    changed = {}
    for f in fused:
        path = os.path.join(off, f)
        with safe_open(path, "pt") as st:
            (key,) = list(st.keys())
            value = st.get_tensor(key)
        value = (value.float() * 2 + 0.5).to(value.dtype)
        save_file({key: value.contiguous()}, path, metadata={"format": "pt"})
        changed[key] = value
    r = subprocess.run([devmap, "save", src, "--offload-folder", off, "--out", out, "--quiet"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL {family}: devmap save: {r.stderr}")
    keys = set()
    for f in os.listdir(out):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(out, f), "pt") as st:
                keys |= set(st.keys())
    with safe_open(os.path.join(src, "model.safetensors"), "pt") as st:
        if keys != set(st.keys()):
            sys.exit(f"FAIL {family}: names differ from the checkpoint's: {sorted(keys ^ set(st.keys()))[:6]}")
    model = AutoModelForCausalLM.from_pretrained(out)
    params = dict(model.named_parameters())
    for key, value in changed.items():
        if not torch.equal(params[key].data, value):
            sys.exit(f"FAIL {family}: {key} after from_pretrained(OUT) is not the changed offload value")
    print(f"ok: {family}: {len(changed)} fused offload entries read back as per-expert tensors; transformers loads them exactly")


def main(devmap):
    small = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    check(devmap, "mixtral", MixtralConfig(intermediate_size=48, num_local_experts=3, num_experts_per_tok=1, **small))
    check(devmap, "qwen2_moe", Qwen2MoeConfig(moe_intermediate_size=24, shared_expert_intermediate_size=40,
                                              num_experts=3, num_experts_per_tok=1, **small))
    # Layer 0 dense, layer 1 a convolution block with fused experts.
    lfm2 = Lfm2MoeConfig(intermediate_size=48, moe_intermediate_size=24, num_experts=3, num_experts_per_tok=1,
                         num_dense_layers=1, layer_types=["full_attention", "conv"], **small)
    check(devmap, "lfm2_moe", lfm2, {"model.embed_tokens": "cpu", "model.layers.0": "cpu",
                                     "model.layers.1": "disk", "model.pos_emb": "cpu",
                                     "model.embedding_norm": "cpu", "lm_head": "cpu"})
    # Layer 0 attention, layer 1 a mixture of experts without gates.
    nemotron = NemotronHConfig(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=8, layers_block_type=["full_attention", "moe"], n_routed_experts=3,
                               num_experts_per_tok=1, moe_intermediate_size=24,
                               moe_shared_expert_intermediate_size=24, n_shared_experts=1, intermediate_size=48,
                               mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8, n_groups=1)
    check(devmap, "nemotron_h", nemotron, {"model.embeddings": "cpu", "model.layers.0": "cpu",
                                           "model.layers.1": "disk", "model.norm_f": "cpu", "lm_head": "cpu"})


if __name__ == "__main__":
    main(sys.argv[1])
