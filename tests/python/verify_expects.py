"""`devmap verify` against what transformers expects, checked against transformers.

For each architecture a tiny model is saved by transformers' own `save_pretrained`
(pristine: verify must find nothing), then broken one way at a time — a dropped expert,
a renamed prefix, a transposed weight, a stale tensor, NaN, a kept-in-float32 module
written in bfloat16, a config.json that disagrees with the weights, … Each broken
folder must fail `devmap verify` (exit 1) with the expected kind of finding; and for
faults in names and shapes, transformers' own loader (`from_pretrained` with
`output_loading_info`) must name the same tensor, so the oracle is checked against the
real loader, not against itself.

Usage: python verify_expects.py PATH/TO/devmap
"""

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

import torch
import transformers
from safetensors.torch import save_file
from saved import tensors as read_tensors
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSpeechSeq2Seq,
)
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import WeightRenaming, apply_renamings

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

SMALL = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    shared_expert_intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, n_routed_experts=4, num_experts=4, num_local_experts=4,
    num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16,
    q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=16,
    n_group=1, topk_group=1, max_position_embeddings=64, d_model=64, d_ff=96, d_kv=16,
    num_heads=4, num_layers=2, num_decoder_layers=2, n_embd=64, n_layer=2, n_head=4,
    n_positions=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, num_mel_bins=16,
    max_source_positions=32, max_target_positions=32, max_length=32, layer_types=None,
    pad_token_id=0, eos_token_id=1, bos_token_id=1, decoder_start_token_id=0,
)

# (model type, auto class, dtype transformers loads and saves it in)
ARCHS = [
    ("llama", AutoModelForCausalLM, torch.float32),
    ("gpt2", AutoModelForCausalLM, torch.float32),
    ("gemma", AutoModelForCausalLM, torch.float32),
    ("mixtral", AutoModelForCausalLM, torch.float32),
    ("qwen2_moe", AutoModelForCausalLM, torch.float32),
    ("gpt_oss", AutoModelForCausalLM, torch.float32),
    ("deepseek_v2", AutoModelForCausalLM, torch.bfloat16),
    ("t5", AutoModelForSeq2SeqLM, torch.float32),
    ("bart", AutoModelForSeq2SeqLM, torch.float32),
    ("whisper", AutoModelForSpeechSeq2Seq, torch.float32),
    ("llava", AutoModelForImageTextToText, torch.float32),
    ("bert", AutoModelForMaskedLM, torch.float32),
]


def shrink(config):
    for key, value in SMALL.items():
        if hasattr(config, key) and key != "layer_types":
            setattr(config, key, value)
    if hasattr(config, "layer_types") and isinstance(config.layer_types, list):
        n = getattr(config, "num_hidden_layers", len(config.layer_types))
        config.layer_types = (config.layer_types * n)[:n]
    return config


def tiny_config(model_type):
    config = AutoConfig.for_model(model_type)
    if model_type == "llava":
        config.text_config = shrink(AutoConfig.for_model("llama"))
        vision = config.vision_config
        for k, v in dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, image_size=28, patch_size=14,
                         projection_dim=32).items():
            setattr(vision, k, v)
        return config
    return shrink(config)


def save_pristine(model_type, auto_class, dtype, folder):
    torch.manual_seed(0)
    config = tiny_config(model_type)
    model = auto_class.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.5, 0.5)
    if dtype == torch.float32:
        model.save_pretrained(folder)
        return
    # Loaded the way users load it: transformers applies its keep-in-float32 rule.
    staging = folder + "-fp32"
    model.save_pretrained(staging)
    auto_class.from_pretrained(staging, dtype=dtype).save_pretrained(folder)
    shutil.rmtree(staging)


def write(folder, tensors, config):
    os.makedirs(folder)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def layer_list(names):
    """The numbered list with the most members (`model.layers.`), and its count."""
    counts = {}
    for n in names:
        m = re.match(r"^(.*?\.)(\d+)\.", n)
        if m:
            counts.setdefault(m.group(1), set()).add(int(m.group(2)))
    prefix = max(counts, key=lambda p: len(counts[p]))
    return prefix, max(counts[prefix]) + 1


def matrix(names, t, square=False):
    """A 2-D weight inside the layer list, not square unless asked."""
    prefix, _ = layer_list(names)
    for n in sorted(names):
        if n.startswith(prefix) and n.endswith("weight") and t[n].dim() == 2:
            if (t[n].shape[0] == t[n].shape[1]) == square:
                return n
    return None


def expert_count(c):
    """The config's number of experts, under whichever name the family uses."""
    return c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts")


def experts(names):
    """(prefix before the expert index, per-expert names of expert 0) of the first MoE
    layer written per expert."""
    for n in sorted(names):
        m = re.match(r"^(.*\.experts\.)(\d+)\.(.*)$", n)
        if m:
            p = m.group(1)
            return p, [x for x in names if x.startswith(p + "0.")]
    return None, []


# Each corruption: (name, kind devmap must report, a loader check applies) and a
# function (tensors, config, model type) -> (tensors, config, subjects) or None when it
# does not apply to the architecture. `subjects`: the tensors the fault is about.
def c_drop_tensor(t, c, _):
    n = matrix(t, t)
    t.pop(n)
    return t, c, [n]


def c_drop_layer(t, c, _):
    prefix, count = layer_list(t)
    last = f"{prefix}{count - 1}."
    gone = [n for n in t if n.startswith(last)]
    for n in gone:
        t.pop(n)
    return t, c, gone


def c_drop_expert(t, c, _):
    p, names = experts(t)
    if not p:
        return None
    for n in names:
        t.pop(n)
    return t, c, names


def c_drop_last_expert_everywhere(t, c, _):
    p, _ = experts(t)
    if not p:
        return None
    count = expert_count(c)
    gone = [n for n in t if re.search(rf"\.experts\.{count - 1}\.", n)]
    for n in gone:
        t.pop(n)
    return t, c, gone


def c_extra_expert(t, c, _):
    p, names = experts(t)
    if not p:
        return None
    count = expert_count(c)
    added = []
    for n in names:
        new = n.replace(p + "0.", f"{p}{count}.", 1)
        t[new] = t[n].clone()
        added.append(new)
    return t, c, added


def c_drop_router(t, c, _):
    gates = sorted(n for n in t if re.search(r"\.(gate|router)\.weight$", n) and ".experts." not in n)
    if not gates:
        return None
    t.pop(gates[0])
    return t, c, [gates[0]]


def c_drop_shared_expert(t, c, _):
    shared = sorted(n for n in t if ".shared_expert." in n or ".shared_experts." in n)
    if not shared:
        return None
    t.pop(shared[0])
    return t, c, [shared[0]]


def c_fused_mix(t, c, _):
    """Layer 0 per expert, plus the fused tensor of the loaded model's layout."""
    p, names = experts(t)
    if not p:
        return None
    up = [n for n in names if re.search(r"\.(w1|gate_proj)\.weight$", n)]
    if not up:
        return None
    layer = p[: -len("experts.")]
    # transformers' fused name sits under the runtime module name (`mlp`).
    runtime = re.sub(r"block_sparse_moe\.$", "mlp.", layer)
    count = expert_count(c)
    rows = t[up[0]].shape[0]
    fused = f"{runtime}experts.gate_up_proj"
    t[fused] = torch.zeros(count, 2 * rows, t[up[0]].shape[1])
    return t, c, [fused]


def c_extra_stale_tensor(t, c, _):
    prefix, _ = layer_list(t)
    n = f"{prefix}0.old_adapter.weight"
    t[n] = torch.zeros(4, 4)
    return t, c, [n]


def c_extra_layer(t, c, _):
    prefix, count = layer_list(t)
    added = []
    for n in list(t):
        if n.startswith(f"{prefix}0."):
            new = f"{prefix}{count}." + n[len(f"{prefix}0."):]
            t[new] = t[n].clone()
            added.append(new)
    return t, c, added


def c_renamed_prefix(t, c, _):
    """The top-level module most tensors sit in, renamed (`model.` -> `renamed_model.`)."""
    tops = [n.split(".")[0] for n in t]
    first = max(set(tops), key=tops.count)
    out = {}
    for n, v in t.items():
        out["renamed_" + n if n.split(".")[0] == first else n] = v
    return out, c, [n for n in t if n.split(".")[0] == first]


def c_renamed_module(t, c, _):
    n = matrix(t, t)
    parts = n.split(".")
    parts[-2] = parts[-2] + "_old"
    t[".".join(parts)] = t.pop(n)
    return t, c, [n]


def c_transposed(t, c, _):
    n = matrix(t, t)
    t[n] = t[n].t().contiguous()
    return t, c, [n]


def c_transposed_every_layer(t, c, _):
    n = matrix(t, t)
    prefix, count = layer_list(t)
    rest = n[len(prefix):].split(".", 1)[1]
    hit = [f"{prefix}{i}.{rest}" for i in range(count) if f"{prefix}{i}.{rest}" in t]
    for h in hit:
        t[h] = t[h].t().contiguous()
    return t, c, hit


def c_truncated_rows(t, c, _):
    n = matrix(t, t)
    t[n] = t[n][: t[n].shape[0] // 2].contiguous()
    return t, c, [n]


def c_extra_rank(t, c, _):
    norms = sorted(n for n in t if t[n].dim() == 1 and "norm" in n)
    if not norms:
        return None
    t[norms[0]] = t[norms[0]].unsqueeze(0).contiguous()
    return t, c, [norms[0]]


def embedding(t):
    for n in sorted(t):
        if re.search(r"(embed_tokens|wte|shared|word_embeddings)\.weight$", n):
            return n
    return None


def c_resized_vocab(t, c, _):
    e = embedding(t)
    if e is None:
        return None
    t[e] = torch.cat([t[e], torch.zeros(8, t[e].shape[1], dtype=t[e].dtype)]).contiguous()
    return t, c, [e]


def config_holder(c):
    return c["text_config"] if "text_config" in c and "vocab_size" in c["text_config"] else c


def c_config_vocab(t, c, _):
    e = embedding(t)
    if e is None:
        return None
    config_holder(c)["vocab_size"] = t[e].shape[0] + 16
    return t, c, [e]


def layer_key(c):
    h = config_holder(c)
    for k in ("num_hidden_layers", "n_layer", "num_layers", "decoder_layers"):
        if k in h:
            return h, k
    return None, None


def c_config_more_layers(t, c, _):
    h, k = layer_key(c)
    if h is None:
        return None
    h[k] += 1
    return t, c, []


def c_config_fewer_layers(t, c, _):
    h, k = layer_key(c)
    if h is None or h[k] < 2:
        return None
    h[k] -= 1
    return t, c, []


def c_config_hidden(t, c, _):
    h = config_holder(c)
    k = next((k for k in ("hidden_size", "n_embd", "d_model") if k in h), None)
    if k is None:
        return None
    h[k] *= 2
    return t, c, []


def c_kept_fp32_in_bf16(t, c, _):
    if c.get("model_type") != "deepseek_v2":
        return None
    n = next(n for n in sorted(t) if n.endswith("mlp.gate.weight"))
    t[n] = t[n].to(torch.bfloat16)
    return t, c, [n]


def c_nan(t, c, _):
    n = matrix(t, t)
    t[n] = t[n].clone()
    t[n].view(-1)[3] = float("nan")
    return t, c, [n]


def c_inf(t, c, _):
    n = matrix(t, t)
    t[n] = t[n].clone()
    t[n].view(-1)[5] = float("inf")
    return t, c, [n]


def c_neg_inf_bf16(t, c, _):
    n = next((n for n in sorted(t) if t[n].dtype == torch.bfloat16), None)
    if n is None:
        return None
    t[n] = t[n].clone()
    t[n].view(-1)[0] = float("-inf")
    return t, c, [n]


def c_missing_untied_head(t, c, _):
    heads = [n for n in t if n.endswith("lm_head.weight")]
    if not heads or c.get("tie_word_embeddings", True) is not False:
        if not heads:
            return None
    if config_holder(c).get("tie_word_embeddings", c.get("tie_word_embeddings")) is True:
        return None
    t.pop(heads[0])
    return t, c, [heads[0]]


def c_untied_config_without_head(t, c, model_type):
    """A tied model whose config.json is edited to untie: the head is now missing."""
    if model_type not in ("gpt2", "gemma", "t5", "bert", "bart", "whisper"):
        return None
    if any(n.endswith("lm_head.weight") for n in t):
        return None
    c["tie_word_embeddings"] = False
    # The head's name is the architecture's (lm_head, proj_out, cls.predictions…).
    return t, c, []


def c_wrong_config_dtype(t, c, _):
    c["dtype"] = "float16" if c.get("dtype") != "float16" else "bfloat16"
    return t, c, ["config.json"]


def c_drop_bias(t, c, _):
    biases = sorted(n for n in t if n.endswith(".bias") and t[n].dim() == 1)
    if not biases:
        return None
    t.pop(biases[0])
    return t, c, [biases[0]]


def c_drop_first_block_bias(t, c, model_type):
    if model_type != "t5":
        return None
    n = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    t.pop(n)
    return t, c, [n]


def c_bias_in_later_block(t, c, model_type):
    if model_type != "t5":
        return None
    n = "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"
    t[n] = t["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].clone()
    return t, c, [n]


def c_drop_vision_layer(t, c, model_type):
    if model_type != "llava":
        return None
    gone = [n for n in t if ".vision_tower." in "." + n and ".layers.1." in n]
    for n in gone:
        t.pop(n)
    return t, c, gone


def c_drop_embedding(t, c, _):
    e = embedding(t)
    if e is None:
        return None
    t.pop(e)
    return t, c, [e]


def c_expert_shape(t, c, _):
    p, names = experts(t)
    if not p:
        return None
    n = sorted(names)[0]
    t[n] = t[n][:-1].contiguous()
    return t, c, [n]


CORRUPTIONS = [
    (c_drop_tensor, "missing", True),
    (c_drop_layer, "missing", True),
    (c_drop_expert, "missing", True),
    (c_drop_last_expert_everywhere, "missing", True),
    (c_extra_expert, "unexpected", True),
    (c_drop_router, "missing", True),
    (c_drop_shared_expert, "missing", True),
    (c_fused_mix, "mixed-layout", False),
    (c_extra_stale_tensor, "unexpected", True),
    (c_extra_layer, "unexpected", True),
    (c_renamed_prefix, "missing", True),
    (c_renamed_module, "missing", True),
    (c_transposed, "mismatched", True),
    (c_transposed_every_layer, "mismatched", True),
    (c_truncated_rows, "mismatched", True),
    (c_extra_rank, "mismatched", True),
    (c_resized_vocab, "mismatched", True),
    (c_config_vocab, "mismatched", True),
    (c_config_more_layers, "missing", False),
    (c_config_fewer_layers, "unexpected", False),
    (c_config_hidden, "mismatched", False),
    (c_kept_fp32_in_bf16, "kept-float32", False),
    (c_nan, "non-finite", False),
    (c_inf, "non-finite", False),
    (c_neg_inf_bf16, "non-finite", False),
    (c_missing_untied_head, "missing", True),
    (c_untied_config_without_head, "missing", False),
    (c_wrong_config_dtype, "config-dtype", False),
    (c_drop_bias, "missing", True),
    (c_drop_first_block_bias, "missing", True),
    (c_bias_in_later_block, "unexpected", True),
    (c_drop_vision_layer, "missing", True),
    (c_drop_embedding, "missing", True),
    (c_expert_shape, "mismatched", False),
]


def verify(devmap, folder, extra=()):
    r = subprocess.run([devmap, "verify", "--json", "--quiet", folder, *extra], capture_output=True, text=True)
    if r.returncode == 2:
        raise SystemExit(f"devmap verify could not run on {folder}: {r.stderr}")
    return r.returncode, json.loads(r.stdout)


class Captured(logging.Handler):
    def __init__(self):
        super().__init__()
        self.text = []

    def emit(self, record):
        self.text.append(record.getMessage())


def loader_names(auto_class, folder):
    """Every tensor name transformers' loader reports for `folder` (missing,
    unexpected, mismatched), and the text of what it logs or raises (a weight its
    converters cannot fuse is reported in its CONVERSION entries)."""
    handler = Captured()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    transformers.logging.set_verbosity_warning()
    try:
        _, info = auto_class.from_pretrained(folder, output_loading_info=True, ignore_mismatched_sizes=True)
        names = set(info.get("missing_keys", [])) | set(info.get("unexpected_keys", []))
        names |= {m[0] for m in info.get("mismatched_keys", [])}
        error = ""
    except Exception as e:  # refused outright: its message names the tensor
        names, error = set(), str(e)
    finally:
        logger.removeHandler(handler)
        transformers.logging.set_verbosity_error()
    log = "\n".join(handler.text)
    # The LOAD REPORT's table: `KEY | STATUS | ...`, where a key may stand for several
    # layers (`model.layers.{0, 1, 2}.mlp`).
    for key in re.findall(r"^(.+?)\s+\|\s+(?:MISSING|UNEXPECTED|MISMATCH|CONVERSION)\b", log, re.M):
        m = re.search(r"\{([\d, ]+)\}", key)
        if m:
            names |= {key[: m.start()] + i.strip() + key[m.end():] for i in m.group(1).split(",")}
        else:
            names.add(key)
    return names, error


def runtime_name(model_type, auto_class, name, cache={}):
    """How the loaded model names a checkpoint tensor (transformers' own renamings)."""
    if model_type not in cache:
        with torch.device("meta"):
            model = auto_class.from_config(tiny_config(model_type))
        cache[model_type] = [r for r in get_model_conversion_mapping(model) if isinstance(r, WeightRenaming)]
    return apply_renamings(name, cache[model_type])


def same_tensor(model_type, auto_class, ours, theirs, error):
    """Whether transformers' report names the tensor devmap named: the same name, the
    same after transformers' renaming, or the fused parameter an expert belongs to."""
    forms = {ours, runtime_name(model_type, auto_class, ours)}
    if any(f in error for f in forms):
        return True
    for t in theirs:
        if t in forms:
            return True
        parent = t.rsplit(".", 1)[0] + "."
        if ".experts." in parent + "." and any(f.startswith(parent) for f in forms):
            return True
    return False


# Architectures devmap's tables lack (their default config does not build, so the
# generators leave them out), checked with transformers asked (`--transformers`):
# (model type, options on the tiny config).
ASKED = [
    ("dots1", {}),
    ("lfm2_moe", dict(layer_types=["conv", "full_attention", "conv"], num_dense_layers=1)),
    ("hunyuan_v1_moe", {}),
    ("nemotron", {}),
    ("ministral", {}),
]


class Tally:
    def __init__(self):
        self.failures, self.kinds_seen = [], set()
        self.archs_done = self.cases = self.loader_checked = 0


def check_arch(devmap, work, tally, model_type, auto_class, pristine, extra=(), loader_check=True):
    """The pristine folder verifies clean; each corruption fails with its kind, naming
    the tensor (and, with `loader_check`, transformers' loader names it too)."""
    code, report = verify(devmap, pristine, extra)
    if code != 0 or report["architecture"] is None:
        tally.failures.append(f"{model_type}: pristine save_pretrained output: exit {code}, architecture {report['architecture']}: "
                              + "; ".join(f"{f['kind']} {f['subject']}: {f['message']}" for f in report["findings"] if f["severity"] == "difference"))
        return
    tally.archs_done += 1
    print(f"ok: {model_type} pristine verifies clean against {report['architecture']} ({report.get('expectations')})")
    base_tensors = read_tensors(pristine)
    with open(os.path.join(pristine, "config.json")) as f:
        base_config = json.load(f)
    for corrupt, kind, loader in CORRUPTIONS:
        t = dict(base_tensors)
        c = json.loads(json.dumps(base_config))
        made = corrupt(t, c, model_type)
        if made is None:
            continue
        t, c, subjects = made
        folder = os.path.join(work, f"{model_type}-{corrupt.__name__}")
        write(folder, t, c)
        tally.cases += 1
        if extra and refuses_config(folder):
            # transformers' config class refuses the edited config.json itself (a
            # layer count that disagrees with `layer_types`): that is the finding.
            kind = "config-refused"
        code, report = verify(devmap, folder, extra)
        found = [f for f in report["findings"] if f["severity"] == "difference"]
        kinds = {f["kind"] for f in found}
        case = f"{model_type} {corrupt.__name__}"
        if code != 1 or kind not in kinds:
            tally.failures.append(f"{case}: want exit 1 and {kind}, got exit {code}: "
                                  + "; ".join(f"{f['kind']} {f['subject']}" for f in found[:6]))
            continue
        tally.kinds_seen.add(corrupt.__name__)
        ours = [f["subject"] for f in found if f["kind"] == kind]
        if subjects and subjects != ["config.json"] and kind != "config-refused" and not set(subjects) & set(ours):
            tally.failures.append(f"{case}: devmap names {ours[:4]}, the fault is in {subjects[:4]}")
            continue
        if loader and loader_check and kind != "config-refused":
            theirs, error = loader_names(auto_class, folder)
            named = [s for s in ours if same_tensor(model_type, auto_class, s, theirs, error)]
            if not named:
                tally.failures.append(f"{case}: devmap names {ours[:4]}; transformers' loader names {sorted(theirs)[:6]} {error[:200]}")
                continue
            tally.loader_checked += 1
        print(f"ok: {case}: {kind} {ours[0]}")


def refuses_config(folder):
    try:
        AutoConfig.from_pretrained(folder)
        return False
    except Exception:  # noqa: BLE001 - the validators raise their own kinds
        return True


def save_asked(model_type, options, folder):
    """A tiny model of an architecture the tables lack, saved by transformers."""
    from keep_fp32 import tiny_config as tiny_asked

    torch.manual_seed(0)
    config = tiny_asked(model_type)
    for key, value in options.items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.5, 0.5)
    model.save_pretrained(folder)


def main(devmap):
    work = tempfile.mkdtemp(prefix="devmap-verify-expects-")
    tally = Tally()
    for model_type, auto_class, dtype in ARCHS:
        pristine = os.path.join(work, model_type)
        save_pristine(model_type, auto_class, dtype, pristine)
        check_arch(devmap, work, tally, model_type, auto_class, pristine)
    print(f"{tally.archs_done} architectures, {tally.cases} broken folders, {len(tally.kinds_seen)} kinds of corruption, "
          f"{tally.loader_checked} cross-checked with transformers' loader")
    # The same corruptions on architectures only transformers knows, asked.
    asked = Tally()
    for model_type, options in ASKED:
        pristine = os.path.join(work, "asked-" + model_type)
        save_asked(model_type, options, pristine)
        check_arch(devmap, work, asked, model_type, AutoModelForCausalLM, pristine,
                   extra=["--transformers", sys.executable], loader_check=False)
    print(f"asked: {asked.archs_done} architectures the tables lack, {asked.cases} broken folders, "
          f"{len(asked.kinds_seen)} kinds of corruption")
    shutil.rmtree(work, ignore_errors=True)
    failures = tally.failures + ["asked: " + f for f in asked.failures]
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
