"""Modules transformers keeps in float32: a tiny model of each family is saved in
float32, loaded by transformers in bfloat16 (float16 for T5) with a cpu + disk device
map, and saved twice — by transformers' own `save_pretrained` and by `devmap save` from
the checkpoint, the loaded model's `hf_device_map` and the offload folder transformers
wrote. Every tensor must match in name, dtype and bytes (transformers is the oracle),
and `from_pretrained` of both must give the same logits.

Usage: python keep_fp32.py PATH/TO/devmap
"""

from saved import workdir
import json
import os
import subprocess
import sys

import torch
import transformers
from saved import tensors
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

SMALL = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, n_routed_experts=4,
    num_experts=4, num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1,
    first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
    qk_nope_head_dim=8, v_head_dim=16, head_dim=16, n_group=1, topk_group=1,
    max_position_embeddings=64, d_model=64, d_ff=96, d_kv=16, num_heads=4, num_layers=2,
    num_decoder_layers=2, pad_token_id=0, eos_token_id=1, bos_token_id=1,
    decoder_start_token_id=0,
)

# (model type, class, dtype loaded in, device map: None for accelerate's "auto" with a
# small cpu budget). T5 keeps `wo` on cpu: transformers 5.24 onloads a disk-offloaded
# `wo` read from a safetensors checkpoint in float16, not float32 (its keep-in-float32
# rule is applied to loaded parameters, not to what the offload hook reads back).
T5_MAP = {
    "shared": "cpu", "encoder": "cpu", "decoder.embed_tokens": "cpu", "decoder.block": "cpu",
    "decoder.final_layer_norm": "disk", "decoder.dropout": "cpu", "lm_head": "cpu",
}
FAMILIES = [
    ("deepseek_v2", AutoModelForCausalLM, torch.bfloat16, None),
    ("glm4_moe", AutoModelForCausalLM, torch.bfloat16, None),
    ("t5", AutoModelForSeq2SeqLM, torch.float16, T5_MAP),
    ("llama", AutoModelForCausalLM, torch.bfloat16, None),
]


def tiny_config(model_type):
    config = AutoConfig.for_model(model_type)
    for key, value in SMALL.items():
        if hasattr(config, key):
            try:
                setattr(config, key, value)
            except AttributeError:
                pass  # a derived attribute (Falcon's head_dim)
    # Per-layer lists sized for the real model follow the tiny layer count.
    for key in ("layer_types", "mlp_layer_types"):
        value = getattr(config, key, None)
        if isinstance(value, list) and len(value) > config.num_hidden_layers:
            setattr(config, key, value[:config.num_hidden_layers])
    return config


def check(devmap, work, model_type, auto_class, dtype, device_map, extra=(), options=None):
    """One family: `extra` goes to every devmap call (`--transformers PYTHON`),
    `options` set on the tiny config."""
    torch.manual_seed(0)
    config = tiny_config(model_type)
    for key, value in (options or {}).items():
        setattr(config, key, value)
    model = auto_class.from_config(config).to(torch.float32)
    src = os.path.join(work, model_type, "src")
    model.save_pretrained(src)
    total = sum(p.numel() * 4 for p in model.parameters())
    offload = os.path.join(work, model_type, "offload")
    placement = dict(device_map=device_map) if device_map else dict(
        device_map="auto", max_memory={"cpu": int(total * 0.45)}
    )
    loaded = auto_class.from_pretrained(src, dtype=dtype, offload_folder=offload, **placement)
    places = set(loaded.hf_device_map.values())
    if "disk" not in places:
        raise SystemExit(f"{model_type}: nothing went to disk: {loaded.hf_device_map}")
    kept = sorted(n for n, p in loaded.named_parameters() if p.dtype == torch.float32)
    if not os.path.isdir(offload) or not os.listdir(offload):
        # transformers reads disk weights straight from a safetensors checkpoint and
        # writes no offload folder: write the disk modules' loaded values as
        # accelerate's offload_state_dict does (what a user with edited weights has).
        from accelerate.utils import offload_state_dict
        full = auto_class.from_pretrained(src, dtype=dtype).state_dict()
        disk = [k for k, v in loaded.hf_device_map.items() if v == "disk"]
        values = {n: t for n, t in full.items() if any(n == k or n.startswith(k + ".") for k in disk)}
        offload_state_dict(offload, values)
    map_file = os.path.join(work, model_type, "device_map.json")
    with open(map_file, "w") as f:
        json.dump(loaded.hf_device_map, f)
    ref = os.path.join(work, model_type, "transformers")
    loaded.save_pretrained(ref)
    out = os.path.join(work, model_type, "devmap")
    run = subprocess.run(
        [devmap, "save", src, "--device-map", map_file, "--offload-folder", offload,
         "--out", out, *extra],
        capture_output=True, text=True,
    )
    if run.returncode != 0:
        raise SystemExit(f"{model_type}: devmap save failed:\n{run.stderr}")
    want, got = tensors(ref), tensors(out)
    if set(want) != set(got):
        raise SystemExit(f"{model_type}: names differ: only transformers {sorted(set(want) - set(got))[:5]}, only devmap {sorted(set(got) - set(want))[:5]}")
    for name, w in want.items():
        g = got[name]
        if g.dtype != w.dtype:
            raise SystemExit(f"{model_type}: {name} is {g.dtype} in devmap's save, {w.dtype} in transformers'\n{run.stderr}")
        if not torch.equal(g.view(torch.uint8) if g.numel() else g, w.view(torch.uint8) if w.numel() else w):
            raise SystemExit(f"{model_type}: {name} differs")
    if kept and "stay float32" not in run.stderr:
        raise SystemExit(f"{model_type}: devmap did not say which tensors stay float32:\n{run.stderr}")
    if kept:
        # An explicit --dtype casts every floating tensor, and says once which ones
        # transformers would have kept.
        explicit = os.path.join(work, model_type, "explicit")
        name = "bfloat16" if dtype == torch.bfloat16 else "float16"
        run = subprocess.run(
            [devmap, "save", src, "--device-map", map_file, "--offload-folder", offload,
             "--out", explicit, "--dtype", name, *extra],
            capture_output=True, text=True,
        )
        if run.returncode != 0:
            raise SystemExit(f"{model_type}: devmap save --dtype {name} failed:\n{run.stderr}")
        floats = {k: v.dtype for k, v in tensors(explicit).items() if v.is_floating_point()}
        if set(floats.values()) != {dtype}:
            raise SystemExit(f"{model_type}: --dtype {name} wrote {set(floats.values())}")
        said = [l for l in run.stderr.splitlines() if "although transformers keeps" in l]
        if len(said) != 1:
            raise SystemExit(f"{model_type}: --dtype {name} did not say once what transformers keeps:\n{run.stderr}")
    ids = torch.tensor([[2, 3, 4, 5, 6, 7]])
    logits = []
    for folder in (ref, out):
        back = auto_class.from_pretrained(folder)
        with torch.no_grad():
            if auto_class is AutoModelForSeq2SeqLM:
                logits.append(back(input_ids=ids, decoder_input_ids=ids).logits)
            else:
                logits.append(back(input_ids=ids).logits)
    if not torch.equal(logits[0], logits[1]):
        raise SystemExit(f"{model_type}: logits differ by {(logits[0] - logits[1]).abs().max()}")
    print(f"ok: {model_type} in {dtype}: {len(want)} tensors, {len(kept)} kept in float32 ({', '.join(kept[:2])}{', …' if len(kept) > 2 else ''})")


def main(devmap):
    work = workdir(prefix="devmap-keep-fp32-")
    for family in FAMILIES:
        check(devmap, work, *family)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    main(sys.argv[1])
