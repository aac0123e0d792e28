"""The user's transformers as the oracle (issue 36), `--transformers PYTHON`.

1. Pristine `save_pretrained` output of configs whose options switch modules on and
   off — DeepSeek-V2 with `q_lora_rank: null` (V2-Lite), T5 with `gated-gelu`
   (flan-T5), OPT with `do_layer_norm_before: false` (opt-350m), Falcon with
   `new_decoder_architecture: true`, Llama with `attention_bias` and with `mlp_bias`,
   GPT-2 with `add_cross_attention` — verifies clean when transformers is asked, and
   `devmap save` of it warns of nothing before writing (devmap's table, fitted on
   integers only, false-alarms on some: counted and printed, not asserted).
2. Architectures devmap's table lacks (dots1, lfm2_moe, hunyuan_v1_moe, nemotron, ministral), loaded by
   transformers in bfloat16 with layers offloaded to disk: `devmap save` from the
   checkpoint, the map and the offload folder, asked, writes what the loaded model's
   `save_pretrained` writes, byte for byte — the modules transformers keeps in
   float32 included (keep_fp32.py's check).
3. Without transformers (`--transformers none`), the same architectures: a cast warns
   before writing that what they keep in float32 cannot be known, and verify's verdict
   is "not checked".

Usage: python oracle.py PATH/TO/devmap
"""

import os
import subprocess
import sys
import tempfile
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from keep_fp32 import check, tiny_config  # noqa: E402

PY = sys.executable
ASK = ["--transformers", PY]
SWITCHED = [
    ("deepseek_v2", AutoModelForCausalLM, dict(q_lora_rank=None)),
    ("t5", AutoModelForSeq2SeqLM, dict(feed_forward_proj="gated-gelu")),
    ("opt", AutoModelForCausalLM, dict(do_layer_norm_before=False, word_embed_proj_dim=64, ffn_dim=96)),
    ("falcon", AutoModelForCausalLM, dict(new_decoder_architecture=True, num_kv_heads=2)),
    ("llama", AutoModelForCausalLM, dict(attention_bias=True)),
    ("llama", AutoModelForCausalLM, dict(mlp_bias=True)),
    ("gpt2", AutoModelForCausalLM, dict(add_cross_attention=True, n_embd=64, n_layer=2, n_head=4)),
]
# Architectures devmap's table lacks, with the options a tiny one needs.
UNKNOWN = [
    ("dots1", {}),
    ("lfm2_moe", dict(layer_types=["conv", "full_attention", "conv"], num_dense_layers=1)),
    ("hunyuan_v1_moe", {}),
    ("nemotron", {}),
    ("ministral", {}),
]


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def switched(devmap, work):
    """Part 1."""
    for i, (model_type, auto, options) in enumerate(SWITCHED):
        config = tiny_config(model_type)
        for k, v in options.items():
            setattr(config, k, v)
        torch.manual_seed(0)
        model = auto.from_config(config)
        model.config.architectures = [type(model).__name__]
        src = os.path.join(work, f"switched-{i}-{model_type}")
        model.save_pretrained(src)
        name = f"{model_type} {options}"
        asked = run([devmap, "verify", src, *ASK])
        assert asked.returncode == 0 and ", asked)" in asked.stdout, f"{name}: {asked.stdout}{asked.stderr}"
        out = os.path.join(work, f"switched-{i}-out")
        saved = run([devmap, "save", src, "--out", out, *ASK])
        assert saved.returncode == 0, f"{name}: {saved.stderr}"
        alarms = [l for l in saved.stderr.splitlines() if any(w in l for w in ("MISSING", "UNEXPECTED", "MISMATCHED"))]
        assert not alarms, f"{name}: false warnings before writing: {alarms}"
        table = run([devmap, "verify", src, "--transformers", "none", "--json"])
        print(f"ok: {name}: clean when transformers is asked (the table alone: exit {table.returncode})")


def unknown(devmap, work):
    for model_type, options in UNKNOWN:
        check(devmap, work, model_type, AutoModelForCausalLM, torch.bfloat16, None, ASK, options)
        # Without an oracle: a cast warns, verify says "not checked".
        src = os.path.join(work, model_type, "src")
        out = os.path.join(work, model_type, "no-oracle")
        r = run([devmap, "save", src, "--out", out, "--dtype", "bfloat16", "--transformers", "none"])
        assert r.returncode == 0 and "cannot be known" in r.stderr and "--transformers" in r.stderr, r.stderr
        r = run([devmap, "verify", out, "--transformers", "none"])
        assert "as transformers expects: not checked" in r.stdout, r.stdout


def timing(devmap, work):
    """Asking about a 70B-size config: the first time, and cached."""
    config = AutoConfig.for_model("llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                  num_attention_heads=64, num_key_value_heads=8, vocab_size=128256)
    config.architectures = ["LlamaForCausalLM"]
    folder = os.path.join(work, "llama-70b-config")
    config.save_pretrained(folder)
    cache = os.path.join(work, "cache")
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    times = []
    for _ in range(2):
        started = time.perf_counter()
        r = subprocess.run([devmap, "verify", folder, *ASK], capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - started)
        assert "asked" in r.stdout + r.stderr, r.stdout + r.stderr
    print(f"ok: a 70B-size Llama config asked in {times[0]:.2f} s, {times[1]:.2f} s cached")


def main(devmap):
    work = tempfile.mkdtemp(prefix="devmap-oracle-")
    switched(devmap, work)
    unknown(devmap, work)
    timing(devmap, work)
    import shutil

    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(os.path.abspath(sys.argv[1]))
