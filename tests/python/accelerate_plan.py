"""Acceptance test of `devmap plan --device-map sequential`: the walk of the planner
`from_pretrained` runs — transformers' own `infer_auto_device_map` (accelerate's walk,
with transformers' sizes: each tensor in the dtype the model is loaded in, a boolean
one byte), on a model built under `init_empty_weights` in the load dtype — and devmap
must place every tensor on the same device, for cpu/disk budgets and for GPU budgets
(only a warning about GPUs it cannot see). tests/python/transformers_plan.py checks the
balanced modes on top of it.

Usage: python accelerate_plan.py PATH/TO/devmap
Prints one line per case and exits non-zero on any difference.
"""

from saved import workdir
import json
import os
import subprocess
import sys

import accelerate
import torch
from safetensors.torch import save_file
import transformers
from accelerate import init_empty_weights
from transformers.integrations.accelerate import compute_module_sizes, infer_auto_device_map
from transformers import AutoModelForCausalLM, LlamaConfig


def placement(device_map, name):
    """accelerate's rule: strip components until a key matches."""
    parts = name.split(".")
    while True:
        key = ".".join(parts)
        if key in device_map:
            return str(device_map[key])
        if not parts:
            return "unmapped"
        parts = parts[:-1]


def families():
    """Small configs of several architectures, each with tied or untied heads."""
    from transformers import GPT2Config, GPTNeoXConfig, MistralConfig, Qwen2Config

    yield "llama", LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    yield "gpt2", GPT2Config(vocab_size=512, n_embd=64, n_layer=6, n_head=4, n_positions=64)
    yield "qwen2", Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    yield "mistral", MistralConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    yield "gpt_neox", GPTNeoXConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=6,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    yield from more_families()
    yield from vision_families()
    yield from wider_families()


def more_families():
    """The rest of issue 11's eleven: each a different shape of model (Gemma's scaled
    norms, Phi's final_layernorm, OPT's decoder with the final norm defined before the
    layers, BERT's masked-LM head tied to the embeddings, T5's encoder-decoder with one
    shared embedding, Mixtral's and Qwen3-MoE's experts)."""
    from transformers import (
        BertConfig,
        GemmaConfig,
        MixtralConfig,
        OPTConfig,
        PhiConfig,
        Qwen3MoeConfig,
        T5Config,
    )

    small = dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=6, num_attention_heads=4)
    yield "gemma", GemmaConfig(**small, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
    yield "phi", PhiConfig(**small, max_position_embeddings=64)
    yield "opt", OPTConfig(
        vocab_size=512, hidden_size=64, ffn_dim=176, num_hidden_layers=6, num_attention_heads=4,
        max_position_embeddings=64, word_embed_proj_dim=64,
    )
    yield "bert", BertConfig(**small, max_position_embeddings=64)
    yield "t5", T5Config(vocab_size=512, d_model=64, d_kv=16, d_ff=176, num_layers=6, num_decoder_layers=6, num_heads=4)
    yield "mixtral", MixtralConfig(
        **small, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
    )
    yield "qwen3_moe", Qwen3MoeConfig(
        **small, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
        max_position_embeddings=64, head_dim=16,
    )


def wider_families():
    """Issue 20's widening to 30 families: encoder-decoders (BART, Whisper's speech
    seq2seq), encoders (RoBERTa, DeBERTa-v2 with its non-persistent `position_ids`
    buffer, which accelerate counts), and more decoder shapes."""
    import transformers as t

    small = dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=6, num_attention_heads=4)
    decoder = dict(small, max_position_embeddings=64)
    yield "bart", t.BartConfig(
        vocab_size=512, d_model=64, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=176, decoder_ffn_dim=176, max_position_embeddings=64,
    )
    yield "whisper", t.WhisperConfig(
        vocab_size=512, d_model=64, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=176, decoder_ffn_dim=176, num_mel_bins=16,
        max_source_positions=32, max_target_positions=64, pad_token_id=1, bos_token_id=2, eos_token_id=3,
        decoder_start_token_id=2,
    )
    yield "roberta", t.RobertaConfig(**small, max_position_embeddings=66)
    yield "deberta_v2", t.DebertaV2Config(**small, max_position_embeddings=64)
    yield "falcon", t.FalconConfig(vocab_size=512, hidden_size=64, num_hidden_layers=6, num_attention_heads=4)
    yield "bloom", t.BloomConfig(vocab_size=512, hidden_size=64, n_layer=6, n_head=4)
    yield "gptj", t.GPTJConfig(vocab_size=512, n_embd=64, n_layer=6, n_head=4, n_positions=64, rotary_dim=8)
    yield "gpt_neo", t.GPTNeoConfig(
        vocab_size=512, hidden_size=64, num_layers=6, num_heads=4, max_position_embeddings=64,
        attention_types=[[["global", "local"], 3]],
    )
    yield "stablelm", t.StableLmConfig(**decoder, num_key_value_heads=4)
    yield "phi3", t.Phi3Config(**decoder, num_key_value_heads=4, pad_token_id=0)
    yield "starcoder2", t.Starcoder2Config(**decoder, num_key_value_heads=2)
    yield "olmo", t.OlmoConfig(**decoder, num_key_value_heads=4)
    yield "gemma2", t.Gemma2Config(**decoder, num_key_value_heads=2, head_dim=16)
    yield "qwen3", t.Qwen3Config(**decoder, num_key_value_heads=2, head_dim=16)
    yield "granite", t.GraniteConfig(**decoder, num_key_value_heads=2)
    yield "cohere", t.CohereConfig(**decoder, num_key_value_heads=2)
    yield "olmo2", t.Olmo2Config(**decoder, num_key_value_heads=4)


def vision_families():
    """A vision-language model, which transformers 5 saves under other names than it
    loads (`language_model.model.layers.N` in the checkpoint, `model.language_model.layers.N`
    in the model): devmap plans under the loaded names."""
    from transformers import CLIPVisionConfig, LlavaConfig

    text = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
    )
    vision = CLIPVisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        image_size=32, patch_size=16,
    )
    yield "llava", LlavaConfig(text_config=text, vision_config=vision, image_token_index=511)


def model_class(config):
    """The head each family is used with: causal LM, masked LM (BERT), seq2seq (T5),
    image-text-to-text (Llava)."""
    from transformers import (
        AutoModelForImageTextToText,
        AutoModelForMaskedLM,
        AutoModelForSeq2SeqLM,
        AutoModelForSpeechSeq2Seq,
    )

    if config.model_type in ("bert", "roberta", "deberta-v2", "deberta_v2"):
        return AutoModelForMaskedLM
    if config.model_type in ("t5", "bart"):
        return AutoModelForSeq2SeqLM
    if config.model_type == "whisper":
        return AutoModelForSpeechSeq2Seq
    if config.model_type == "llava":
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def main(devmap):
    only = os.environ.get("DEVMAP_PLAN_FAMILY")
    failures = 0
    total_cases = 0
    for family, config in families():
        if only and family != only:
            continue
        f, n = check_family(devmap, family, config)
        failures += f
        total_cases += n
    # Stored in float32, loaded as bfloat16: `dtype=` in from_pretrained, `--dtype` in devmap.
    if not only or only == "llama-f32":
        _, llama = next(families())
        f, n = check_family(devmap, "llama-f32", llama, store=torch.float32, load=torch.bfloat16)
        failures += f
        total_cases += n
    # Every family again stored in float32 (five budgets each): sizes double, so other
    # boundaries are crossed.
    for family, config in families():
        if only and only != f"{family}-f32":
            continue
        f, n = check_family(devmap, f"{family}-f32", config, store=torch.float32, first=5)
        failures += f
        total_cases += n
    if not only:
        f, n = check_transformers5_rule(devmap)
        failures += f
        total_cases += n
    # Budgets at the edges accelerate's sizes give, where a module's non-persistent
    # buffers (never in a checkpoint) decide whether it fits.
    for family, config in families():
        if family not in BUFFER_FAMILIES or (only and only != f"{family}-edges"):
            continue
        f, n = check_edges(devmap, f"{family}-edges", config)
        failures += f
        total_cases += n
    if not only or only == "llama-fp8-dequantize":
        _, llama = next(families())
        f, n = check_family(devmap, "llama-fp8-dequantize", llama, fp8_dequantize=True)
        failures += f
        total_cases += n
    print(f"accelerate {accelerate.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"{total_cases - failures} of {total_cases} cases identical")
    sys.exit(1 if failures else 0)


def check_transformers5_rule(devmap):
    """devmap's warning about transformers 5's device-map matching must count exactly
    the tensors where transformers' own expand_device_map disagrees with accelerate."""
    import re

    from transformers.integrations.accelerate import expand_device_map

    _, config = next(families())
    config.num_hidden_layers = 12
    work = workdir(prefix="devmap-t5rule-")
    src = os.path.join(work, "src")
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(src)
    device_map = {"model.embed_tokens": 0, "model.layers.1": 1, "model.layers": "cpu", "model.norm": "cpu", "lm_head": 0}
    path = os.path.join(work, "map.json")
    with open(path, "w") as f:
        json.dump(device_map, f)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    names = list(model.state_dict().keys())
    theirs = expand_device_map(device_map, names)
    expected = sum(1 for n in names if str(theirs[n]) != placement(device_map, n))
    out = subprocess.run(
        [devmap, "inspect", src, "--json", "--device-map", path], check=True, capture_output=True, text=True
    ).stdout
    warned = sum(
        int(m.group(1))
        for w in json.loads(out)["warnings"]
        if w["kind"] == "transformers5_placement"
        for m in [re.match(r"transformers 5 puts (\d+) tensor", w["message"])]
        if m
    )
    status = "same" if warned == expected and expected > 0 else f"devmap warns of {warned}, transformers differs on {expected}"
    print(f"transformers 5 device-map rule [{device_map}]: {len(names)} tensors: {status}")
    return (0 if status == "same" else 1), 1


def fp8_checkpoint(model, src, block=16):
    """`model`'s checkpoint with every 2-D `*proj.weight` as fine-grained FP8 (e4m3, one
    float32 scale per 16×16 block) and a config that asks transformers to load it
    dequantized (`dequantize: true`): accelerate then plans the plain bfloat16 model."""
    os.makedirs(src)
    out, seen = {}, set()
    for name, w in model.state_dict().items():
        # A tied weight is saved once (under its first name), as transformers saves it.
        if w.data_ptr() in seen:
            continue
        seen.add(w.data_ptr())
        if name.endswith("proj.weight") and w.dim() == 2:
            m, n = w.shape
            s = torch.ones(-(-m // block), -(-n // block))
            out[name] = w.float().clamp(-448, 448).to(torch.float8_e4m3fn)
            out[name + "_scale_inv"] = s
        else:
            out[name] = w.contiguous()
    save_file(out, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.update(architectures=[type(model).__name__], dtype="bfloat16",
               quantization_config={"quant_method": "fp8", "weight_block_size": [block, block],
                                    "activation_scheme": "dynamic", "dequantize": True})
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(cfg, f)


# Families whose models hold non-persistent buffers accelerate counts: rotary
# `inv_freq` (Llama, Qwen3), BERT-family `position_ids`/`token_type_ids`, GPT-Neo's
# causal mask per layer.
BUFFER_FAMILIES = ("llama", "qwen3", "bert", "roberta", "deberta_v2", "gpt_neo")


def check_edges(devmap, family, config):
    """Plans one GPU budget at each edge of accelerate's walk (the largest layer kept
    free, then the sizes of the leaf modules in order, summed, and one byte less) with
    a cpu that holds the rest: the budgets where a buffer's bytes decide where a module
    goes. Compares every tensor's device, and the modules that hold only buffers
    (`model.rotary_emb`) too."""
    from accelerate.utils.modeling import get_max_layer_size

    work = workdir(prefix=f"devmap-plan-{family}-")
    torch.manual_seed(0)
    src = os.path.join(work, "src")
    auto = model_class(config)
    auto.from_config(config).to(torch.bfloat16).save_pretrained(src)
    with init_empty_weights():
        model = auto.from_config(config, torch_dtype=torch.bfloat16)
    model.tie_weights()
    names = list(model.state_dict().keys())
    sizes = compute_module_sizes(model, only_modules=False)[0]
    top = list(model.named_parameters(recurse=False)) + list(model.named_children()) + list(model.named_buffers(recurse=False))
    largest, _ = get_max_layer_size(top, sizes, model._no_split_modules)
    buffer_only = [
        n for n, m in model.named_modules()
        if n and not list(m.parameters()) and list(m.buffers(recurse=False))
    ]
    edges, running = set(), 0
    for n, m in model.named_modules():
        if n and not list(m.children()):
            running += sizes[n]
            edges |= {running, running - 1}
    failures = skipped = 0
    for edge in sorted(edges):
        budget = int(largest + edge)
        try:
            theirs = infer_auto_device_map(
                model, max_memory={0: budget, "cpu": int(4 * sizes[""])}, no_split_module_classes=model._no_split_modules
            )
        except IndexError:
            # The walk fails on some budgets of tied models
            # (`get_module_size_with_ties` looks for a tied module already placed):
            # no reference to compare with.
            skipped += 1
            continue
        spec = f"0={budget},cpu={int(4 * sizes[''])}"
        out = subprocess.run([devmap, "plan", src, "--max-memory", spec, "--device-map", "sequential"], check=True, capture_output=True, text=True).stdout
        ours = json.loads(out)
        diff = [(n, placement(theirs, n), placement(ours, n)) for n in names + buffer_only if placement(theirs, n) != placement(ours, n)]
        if diff:
            print(f"{family}, gpu edge [{spec}]: {len(diff)} differ, e.g. {diff[:3]}\n  accelerate: {dict(theirs)}\n  devmap:     {ours}")
            failures += 1
    checked = len(edges) - skipped
    print(f"{family}: {checked} edge budgets, {checked - failures} identical ({skipped} where accelerate itself fails)")
    return failures, checked


def check_family(devmap, family, config, store=torch.bfloat16, load=None, first=None, fp8_dequantize=False):
    """Plans `family` stored as `store` (loaded as `load`) under every budget below (the
    `first` N only, when given), against accelerate's infer_auto_device_map. With
    `fp8_dequantize`, the checkpoint holds FP8 weights with block scales and a config
    saying `dequantize: true`: devmap must plan the plain model transformers loads."""
    work = workdir(prefix=f"devmap-plan-{family}-")
    torch.manual_seed(0)
    src = os.path.join(work, "src")
    auto = model_class(config)
    if fp8_dequantize:
        fp8_checkpoint(auto.from_config(config).to(store), src)
    else:
        auto.from_config(config).to(store).save_pretrained(src)
    with init_empty_weights():
        model = auto.from_config(config, torch_dtype=store)
    model.tie_weights()
    names = list(model.state_dict().keys())
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if load is not None:
        total //= 2
    # The model transformers plans: built in the dtype it is loaded in.
    walked = model
    if load is not None:
        with init_empty_weights():
            walked = auto.from_config(config, torch_dtype=load)
        walked.tie_weights()
    kb = total // 1000
    cases = {
        "cpu holds all": {"cpu": f"{2 * kb}KB"},
        "cpu 50%": {"cpu": f"{kb // 2}KB"},
        "cpu 30% (GiB units)": {"cpu": f"{int(total * 0.3 / 1024)}KiB"},
        "gpu 30% + cpu 40%": {0: f"{int(kb * 0.3)}KB", "cpu": f"{int(kb * 0.4)}KB"},
        "two gpus 25% + cpu 30%": {0: f"{kb // 4}KB", 1: f"{kb // 4}KB", "cpu": f"{int(kb * 0.3)}KB"},
        "gpu 60% + cpu 60%": {0: f"{int(kb * 0.6)}KB", "cpu": f"{int(kb * 0.6)}KB"},
        "tiny gpu + cpu 45%": {0: "20KB", "cpu": f"{int(kb * 0.45)}KB"},
        # accelerate's max_memory may name disk too (its budget does not cap it).
        "cpu 36% + disk budget": {"cpu": f"{int(kb * 0.36)}KB", "disk": f"{kb // 10}KB"},
    }
    # The same budgets with nothing protected from splitting.
    splittable = {
        "no no-split, cpu 50%": {"cpu": f"{kb // 2}KB"},
        "no no-split, gpu 30% + cpu 40%": {0: f"{int(kb * 0.3)}KB", "cpu": f"{int(kb * 0.4)}KB"},
        "no no-split, two gpus 25% + cpu 30%": {0: f"{kb // 4}KB", 1: f"{kb // 4}KB", "cpu": f"{int(kb * 0.3)}KB"},
    }
    failures = 0
    runs = [(label, b, True) for label, b in cases.items()] + [(label, b, False) for label, b in splittable.items()]
    if first is not None:
        runs = runs[:first]
    for label, budgets, protect in runs:
        theirs = infer_auto_device_map(
            walked,
            max_memory=dict(budgets),
            no_split_module_classes=model._no_split_modules if protect else [],
        )
        spec = ",".join(f"{k}={v}" for k, v in budgets.items())
        extra = [] if protect else ["--no-split", "none"]
        if load is not None:
            extra += ["--dtype", str(load).replace("torch.", "")]
        out = subprocess.run(
            [devmap, "plan", src, "--max-memory", spec, "--device-map", "sequential"] + extra, check=True, capture_output=True, text=True
        ).stdout
        ours = json.loads(out)
        # devmap's map uses the names the loaded model has (GPT-NeoX's `lm_head`, saved
        # as `embed_out`), as accelerate's does.
        diff = [(n, placement(theirs, n), placement(ours, n)) for n in names if placement(theirs, n) != placement(ours, n)]
        status = "same" if not diff else f"{len(diff)} tensors differ, e.g. {diff[:3]}"
        print(f"{family}, {label} [{spec}]: {len(names)} tensors: {status}")
        if diff:
            print(f"  accelerate: {dict(theirs)}\n  devmap:     {ours}")
            failures += 1
    return failures, len(runs)


if __name__ == "__main__":
    main(sys.argv[1])
