"""Pristine `save_pretrained` output with a config option switched verifies clean with
devmap's tables alone (no `--transformers`): no false MISSING, UNEXPECTED or
MISMATCHED, and its save prints no such warning.

The cases: the options that cried wolf (flan-T5's gated-gelu, DeepSeek-V2-Lite's
`q_lora_rank: null`, OPT-350m's post-norm, Falcon-40b's new decoder, Llama's biases,
GPT-2's cross-attention), then every option value crates/devmap-core/src/model/option_table.txt records,
for the first architecture of each of its blocks, built tiny by transformers and saved
by it. A case transformers cannot build tiny (an option another one must come with, a
size the small config breaks) is counted as not built, never as passed.

Usage: python option_sweep.py PATH/TO/devmap [MAX_SWEPT]
(MAX_SWEPT: the most cases taken from the table, after the listed ones; default all.)
"""

import json
import os
import subprocess
import sys
import tempfile
import warnings

import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
from verify_expects import SMALL  # noqa: E402

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

TABLE = os.path.join(os.path.dirname(__file__), "..", "..", "crates", "devmap-core", "src", "model", "option_table.txt")
LISTED = [
    ("T5ForConditionalGeneration", "feed_forward_proj", "gated-gelu"),
    ("DeepseekV2ForCausalLM", "q_lora_rank", None),
    ("OPTForCausalLM", "do_layer_norm_before", False),
    ("FalconForCausalLM", "new_decoder_architecture", True),
    ("LlamaForCausalLM", "attention_bias", True),
    ("LlamaForCausalLM", "mlp_bias", True),
    ("GPT2LMHeadModel", "add_cross_attention", True),
]
# Values the table never tried: verify passes, and says what it did not check.
# A config the small sizes do not reach (a sub-config's own sizes) is not built.
MAX_PARAMETERS = 5_000_000
UNTRIED = [("T5ForConditionalGeneration", "feed_forward_proj", "gated-silu")]


def table_cases():
    """(class, option, value) for every value the table records, first class per block."""
    cases, arch = [], None
    with open(TABLE) as f:
        for line in f:
            if line.startswith("= "):
                arch = line.split()[1]
            elif line.startswith("key "):
                key = line.split()[1]
            elif line.startswith(" value "):
                cases.append((arch, key, json.loads(line[len(" value ") :])))
    return cases


def tiny(cls, key, value):
    """A tiny config of `cls` with `key` set to `value` as a diff-only config.json sets
    it (the config class derives the rest)."""
    config_cls = cls.config_class
    defaults = config_cls().to_dict()
    kwargs = {k: v for k, v in SMALL.items() if k in defaults and k != "layer_types"}
    # Per-layer lists as long as a count the small config cuts (Reformer's
    # `attn_layers`, `layer_types`) are cut with it, as a real config's agree.
    for k, small in list(kwargs.items()):
        old = defaults[k]
        if isinstance(old, int) and not isinstance(old, bool) and old > 1 and small != old:
            for other, v in defaults.items():
                if isinstance(v, list) and len(v) == old and other not in kwargs:
                    kwargs[other] = (v * (small // old + 1))[:small]
    kwargs[key] = value
    return config_cls(**kwargs)


def build(name, key, value, folder):
    cls = getattr(transformers, name)
    torch.manual_seed(0)
    config = tiny(cls, key, value)
    with torch.device("meta"):
        size = sum(p.numel() for p in cls(config).parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"the small config still has {size} parameters")
    model = cls(config)
    if getattr(config, key, object()) != value:
        raise ValueError(f"the config did not keep {key}={value!r}")
    model.save_pretrained(folder)


def verify(devmap, folder):
    env = dict(os.environ, DEVMAP_PYTHON="")
    return subprocess.run([devmap, "verify", folder, "--transformers", "none"], capture_output=True, text=True, env=env)


def save_warnings(devmap, folder, out):
    env = dict(os.environ, DEVMAP_PYTHON="")
    r = subprocess.run([devmap, "save", folder, "-o", out, "-q", "--transformers", "none"], capture_output=True, text=True, env=env)
    said = r.stdout + r.stderr
    return r.returncode, [line for line in said.splitlines() if any(w in line for w in ("MISSING", "UNEXPECTED", "MISMATCHED"))]


def main():
    devmap = sys.argv[1]
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else None
    swept = [c for c in table_cases() if c not in LISTED and "." not in c[1]]
    cases = [(c, True) for c in LISTED] + [(c, False) for c in swept[:limit]]
    clean, alarms, not_built, listed_failed = 0, [], [], False
    for (name, key, value), listed in cases:
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "model")
            try:
                build(name, key, value, folder)
            except Exception as e:  # noqa: BLE001 - counted, named below
                not_built.append(f"{name} {key}={value!r}: {type(e).__name__}: {str(e)[:100]}")
                if listed:
                    listed_failed = True
                    print(f"LISTED CASE NOT BUILT: {not_built[-1]}")
                continue
            r = verify(devmap, folder)
            said = r.stdout + r.stderr
            code, warned = save_warnings(devmap, folder, os.path.join(tmp, "out"))
            if r.returncode == 0 and code == 0 and not warned:
                clean += 1
                if listed:
                    print(f"listed {name} {key}={value!r}: verifies clean, saves without a warning")
            else:
                alarms.append(f"{name} {key}={value!r}: verify exit {r.returncode}, save exit {code}\n{said[-1500:]}\n{warned[:5]}")
                print(f"FALSE ALARM {alarms[-1]}")
    for name, key, value in UNTRIED:
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, "model")
            build(name, key, value, folder)
            r = verify(devmap, folder)
            said = r.stdout + r.stderr
            if r.returncode != 0 or "never tried" not in said or "not checked" not in said:
                listed_failed = True
                print(f"UNTRIED {name} {key}={value!r}: verify exit {r.returncode}, no not-checked note\n{said[-1500:]}")
            else:
                note = next(line for line in said.splitlines() if "never tried" in line)
                print(f"untried {name} {key}={value!r}: verifies with the note: {note.strip()}")
    print(f"{len(cases)} cases ({len(LISTED)} listed, {len(cases) - len(LISTED)} from the option table), "
          f"{clean} clean, {len(alarms)} false alarms, {len(not_built)} not built")
    for n in not_built:
        print(f"not built: {n}")
    sys.exit(1 if alarms or listed_failed else 0)


if __name__ == "__main__":
    main()
