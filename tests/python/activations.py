"""The activations `devmap plan --context N --prefill N` estimates for one forward,
against what torch allocates in transformers' own forward.

For Llama, Qwen2, Qwen3, Mistral, Mixtral, Qwen3-MoE and Qwen2-MoE (shared expert), a
tiny random model is saved with `save_pretrained` and run by transformers 5 (sdpa, no
cache, the last token's logits: the prefill `generate` makes) over N tokens, in float32
and bfloat16. Every aten op is intercepted (a TorchDispatchMode) and the bytes the
process has allocated are read after each (glibc's `mallinfo2`, one malloc arena, one
torch thread), so the peak is what the forward's tensors took at once: it must be
within 3% of devmap's `activations.per_layer` + `logits` for the same model, tokens
and dtype.

Usage: python activations.py PATH/TO/devmap
"""

import ctypes
import json
import os
import subprocess
import sys

if os.environ.get("MALLOC_ARENA_MAX") != "1":
    # One arena, so mallinfo2 sees every allocation: set before the interpreter starts
    # (tests/real/transformers_plan.rs sets it, so the script starts in a fresh one).
    os.environ["MALLOC_ARENA_MAX"] = "1"
    os.execv(sys.executable, [sys.executable, *sys.argv])

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import saved  # noqa: E402

torch.set_num_threads(1)
LIBC = ctypes.CDLL("libc.so.6")


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


LIBC.mallinfo2.restype = MallInfo2


def allocated():
    m = LIBC.mallinfo2()
    return m.uordblks + m.hblkhd


class Peak(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, allocated())
        return out


def config(model_type, **extra):
    base = dict(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                num_attention_heads=8, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)
    base.update(extra)
    return AutoConfig.for_model(model_type, **base)


CASES = {
    "llama": config("llama"),
    "qwen2": config("qwen2"),
    "qwen3": config("qwen3"),
    "mistral": config("mistral", sliding_window=None),
    # Attention larger than the MLP: the rotary step is the peak.
    "llama-narrow-mlp": config("llama", intermediate_size=16, num_key_value_heads=8),
    "mixtral": config("mixtral", num_local_experts=8, num_experts_per_tok=2),
    "qwen3_moe": config("qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=344,
                        decoder_sparse_step=1, mlp_only_layers=[]),
    "qwen2_moe": config("qwen2_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=344,
                        shared_expert_intermediate_size=1376, decoder_sparse_step=1, mlp_only_layers=[]),
}


def measured(model, tokens):
    ids = torch.randint(0, 512, (1, tokens))
    with torch.no_grad():
        model(ids, logits_to_keep=1, use_cache=False)  # warm: lazy buffers, allocator pools
        before = allocated()
        peak = Peak()
        with peak:
            model(ids, logits_to_keep=1, use_cache=False)
    return peak.peak - before


def main():
    exe = os.path.abspath(sys.argv[1])
    work = saved.workdir("devmap-activations-")
    failures = 0
    for name, cfg in CASES.items():
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa").eval()
            src = os.path.join(work, f"{name}-{str(dtype)[6:]}")
            model.save_pretrained(src)
            for tokens in (1024, 4096):
                got = measured(model, tokens)
                r = subprocess.run([exe, "plan", src, "--max-memory", "cpu=64GiB", "--context", str(tokens),
                                    "--json"], capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"FAILED {name}: {r.stderr}")
                    failures += 1
                    continue
                act = json.loads(r.stdout)["activations"]
                want = act["per_layer"] + act["logits"] + act["mask"]
                gap = abs(got - want) / got
                line = f"{name} {str(dtype)[6:]} {tokens} tokens: devmap {want} B, torch allocated {got} B ({gap:.1%})"
                if gap > 0.03:
                    print(f"DIFFERS {line}")
                    failures += 1
                else:
                    print(f"within 3%: {line}")
    print(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
