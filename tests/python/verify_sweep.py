"""No false alarm from `devmap verify`'s check against transformers' expectations:
tiny models of many families, each saved by transformers' own `save_pretrained`, must
verify clean. A family whose tiny config transformers cannot build is skipped (said).

Usage: python verify_sweep.py PATH/TO/devmap [MODEL_TYPE...]
"""

import os
import shutil
import sys
import tempfile
import warnings

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
from verify_expects import save_pristine, verify

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

CAUSAL = [
    "llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "phi", "phi3", "phimoe", "gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "mixtral", "olmo",
    "olmo2", "olmoe", "granite", "granitemoe", "stablelm", "starcoder2", "cohere", "deepseek_v2",
    "deepseek_v3", "glm", "glm4", "glm4_moe", "gpt_oss", "jamba", "dbrx", "mpt", "persimmon",
    "nemotron", "exaone4", "smollm3", "hunyuan_v1_dense", "ernie4_5", "ernie4_5_moe", "minimax",
    "dots1", "seed_oss", "apertus", "arcee", "helium", "bitnet", "codegen", "gpt_bigcode",
    "gpt_neo", "xglm", "biogpt", "mamba", "mamba2", "recurrent_gemma", "zamba2", "falcon_h1",
]
SEQ2SEQ = ["t5", "bart", "mbart", "pegasus", "marian", "mt5", "umt5", "led", "m2m_100", "blenderbot"]


def main(devmap, only):
    work = tempfile.mkdtemp(prefix="devmap-verify-sweep-")
    clean, alarms, skipped = [], [], []
    for model_type, auto_class in [(t, AutoModelForCausalLM) for t in CAUSAL] + [(t, AutoModelForSeq2SeqLM) for t in SEQ2SEQ]:
        if only and model_type not in only:
            continue
        folder = os.path.join(work, model_type)
        try:
            save_pristine(model_type, auto_class, torch.float32, folder)
        except Exception as e:
            skipped.append(f"{model_type} ({type(e).__name__}: {str(e)[:60]})")
            continue
        code, report = verify(devmap, folder)
        diffs = [f for f in report["findings"] if f["severity"] == "difference"]
        if code == 0:
            clean.append(f"{model_type} ({report['architecture'] or 'not in the table'})")
        else:
            alarms.append(f"{model_type}: " + "; ".join(f"{f['kind']} {f['subject']}: {f['message'][:140]}" for f in diffs[:4])
                          + (f" … {len(diffs)} in all" if len(diffs) > 4 else ""))
        shutil.rmtree(folder, ignore_errors=True)
    for c in clean:
        print("clean:", c)
    for s in skipped:
        print("skipped:", s)
    for a in alarms:
        print("ALARM:", a)
    print(f"{len(clean)} clean, {len(alarms)} false alarms, {len(skipped)} skipped")
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if alarms else 0)


if __name__ == "__main__":
    main(sys.argv[1], set(sys.argv[2:]))
