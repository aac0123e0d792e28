"""The real thing: transformers writes a small tied Llama checkpoint, accelerate loads it
with a cpu/disk device map, an offload folder with changed values is written (once
with accelerate's `offload_state_dict`, once in transformers 5's per-tensor safetensors
form), devmap saves it, and `from_pretrained(OUT)` must get every current value back
with `lm_head` tied.

Usage: python real_transformers.py PATH/TO/devmap
Exits non-zero on any mismatch. Needs torch, transformers, accelerate.
"""

from saved import workdir
import json
import os
import subprocess
import sys

import torch
import transformers
from accelerate.utils import offload_state_dict
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM


def per_tensor_offload(folder, tensors):
    """transformers 5 writes one `<name>.safetensors` per offloaded tensor: written here
    by transformers' own writer. Without it (an older or newer transformers that moved
    it) this check fails rather than test devmap against a layout of its own making."""
    from transformers.integrations.accelerate import offload_weight

    os.makedirs(folder, exist_ok=True)
    index = {}
    for name, t in tensors.items():
        index = offload_weight(t, name, folder, index)
    return "transformers.integrations.accelerate.offload_weight"


def main(devmap):
    work = workdir(prefix="devmap-real-")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    src = os.path.join(work, "src")
    model.save_pretrained(src)
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}

    device_map = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "cpu",
        "model.layers.2": "disk",
        "model.layers.3": "disk",
        "model.norm": "disk",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    }
    loaded = AutoModelForCausalLM.from_pretrained(
        src,
        device_map=device_map,
        offload_folder=os.path.join(work, "hf-offload"),
        torch_dtype=torch.bfloat16,
    )
    with open(os.path.join(src, "device_map.json"), "w") as f:
        json.dump(loaded.hf_device_map, f)
    on_disk = [
        n
        for n in original
        if n.startswith(("model.layers.2.", "model.layers.3.", "model.norm."))
    ]
    changed = {n: (original[n].float() + 1.0).to(torch.bfloat16) for n in on_disk}
    expected = dict(original)
    expected.update(changed)

    forms = {}
    folder_a = os.path.join(work, "offload-accelerate")
    offload_state_dict(folder_a, changed)
    forms["accelerate offload_state_dict (.dat)"] = folder_a
    folder_b = os.path.join(work, "offload-t5")
    how = per_tensor_offload(folder_b, changed)
    forms[f"per-tensor safetensors via {how}"] = folder_b

    for label, folder in forms.items():
        out = os.path.join(work, "out-" + os.path.basename(folder))
        cmd = [devmap, "save", src, "--offload-folder", folder, "--out", out,
               "--max-shard-size", "100KB", "--quiet"]
        subprocess.run(cmd, check=True)
        back = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.bfloat16)
        state = back.state_dict()
        for name, want in expected.items():
            got = state[name]
            if not torch.equal(got, want):
                raise SystemExit(f"{label}: {name} differs after devmap save")
        if back.lm_head.weight.data_ptr() != back.model.embed_tokens.weight.data_ptr():
            raise SystemExit(f"{label}: lm_head is not tied after loading")
        if not torch.equal(back.lm_head.weight, expected["model.embed_tokens.weight"]):
            raise SystemExit(f"{label}: lm_head does not hold the embedding")
        shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
        print(f"ok: {label}: {len(expected)} tensors, {len(changed)} changed, {len(shards)} shards")
    check_llava(devmap, work)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")


def check_llava(devmap, work):
    """A vision-language model, saved by transformers under other names than it loads
    (`language_model.model.layers.N` on disk, `model.language_model.layers.N` loaded):
    the loaded model's hf_device_map places every checkpoint tensor, offload values
    written under the loaded names (as transformers 5 offloads) are saved as the
    checkpoint's, and from_pretrained(OUT) holds them."""
    from transformers import AutoModelForImageTextToText, CLIPVisionConfig, LlavaConfig

    torch.manual_seed(1)
    text = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
    )
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        image_size=32, patch_size=16,
    )
    config = LlavaConfig(text_config=text, vision_config=vision, image_token_index=255)
    model = AutoModelForImageTextToText.from_config(config).to(torch.bfloat16)
    src = os.path.join(work, "llava")
    model.save_pretrained(src)
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    device_map = {
        "model.vision_tower": "cpu",
        "model.multi_modal_projector": "cpu",
        "model.language_model.embed_tokens": "cpu",
        "model.language_model.layers.0": "cpu",
        "model.language_model.layers.1": "disk",
        "model.language_model.layers.2": "disk",
        "model.language_model.norm": "disk",
        "model.language_model.rotary_emb": "cpu",
        "lm_head": "cpu",
    }
    loaded = AutoModelForImageTextToText.from_pretrained(
        src, device_map=device_map, offload_folder=os.path.join(work, "llava-hf-offload"),
        dtype=torch.bfloat16,
    )
    with open(os.path.join(src, "device_map.json"), "w") as f:
        json.dump(loaded.hf_device_map, f)
    on_disk = [n for n in original if n.startswith(("model.language_model.layers.1.", "model.language_model.layers.2."))]
    changed = {n: (original[n].float() + 1.0).to(torch.bfloat16) for n in on_disk}
    folder = os.path.join(work, "llava-offload")
    per_tensor_offload(folder, changed)
    report = json.loads(subprocess.run(
        [devmap, "inspect", src, "--offload-folder", folder, "--json"], check=True, capture_output=True, text=True,
    ).stdout)
    unmapped = [t["name"] for t in report["tensors"] if t["placement"] == "unmapped"]
    if unmapped:
        raise SystemExit(f"llava: the loaded model's map leaves {unmapped[:3]} unmapped")
    extra = [t["name"] for t in report["tensors"] if t["name"].startswith("model.language_model.")]
    if extra:
        raise SystemExit(f"llava: offload entries read as extra tensors: {extra[:3]}")
    out = os.path.join(work, "llava-out")
    subprocess.run([devmap, "save", src, "--offload-folder", folder, "--out", out, "--quiet"], check=True)
    back = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.bfloat16).state_dict()
    expected = dict(original)
    expected.update(changed)
    for name, want in expected.items():
        if not torch.equal(back[name], want):
            raise SystemExit(f"llava: {name} differs after devmap save")
    print(f"ok: llava: {len(expected)} tensors, {len(changed)} changed in an offload under loaded names")


if __name__ == "__main__":
    main(sys.argv[1])
