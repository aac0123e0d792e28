"""Writes crates/devmap-core/src/model/buffer_table.txt: for each architecture of the expect table
(language, seq2seq, vision-language and speech models), the non-persistent buffers
the loaded model holds (rotary `inv_freq`, BERT-family `position_ids` and
`token_type_ids`, GPT-Neo's causal mask), their dtypes, and their shapes as functions
of config.json. A checkpoint never holds them, but accelerate's
`infer_auto_device_map` counts them in their module's size, so `devmap plan` must too.

How: as scripts/gen_expect_table.py fits the saved tensors (each integer attribute of
the config changed alone, then the fitted ones together), on a config with its layer
and expert counts cut to 2 first (instantiating 61 layers of 192 experts to learn the
shape of a rotary table would take minutes per class; counts are fitted all the same).
A class whose cut config cannot instantiate is fitted on its default config.

    python scripts/gen_buffer_table.py [OUT] [CLASS...]

Format: as the expect table's blocks, with only `default PATH VALUE` lines (the
defaults of the attributes the shapes use, from the class's real default config; for
an attribute the config class derives when config.json leaves it out, the expression
it derives it by, fitted the same way: `default head_dim hidden_size/num_attention_heads`) and
one `form buffers` tree, whose tensor lines end with the buffer's dtype (`F32`, `I64`,
`BOOL`, …) as the model holds it loaded in float32, then ` load` where the buffer
follows the dtype the model is loaded in (made in the default dtype: Gemma's
`embed_scale`), unlike one made in float32 explicitly (rotary `inv_freq`). Classes without non-persistent buffers are left out.
"""

import re
import sys
import warnings

import torch
import transformers
from accelerate import init_empty_weights

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gen_arch_table import TooSlow, collapse, default_config, instantiate, write_table  # noqa: E402
from gen_expect_table import (  # noqa: E402
    _get,
    attributes_used,
    buffer_dtypes,
    derived,
    fit,
    fitted,
    flat_ints,
    other_value,
    render,
    render_expr,
    saved_from_classes,
    state_of,
    with_value,
)

# Attributes that count layers or experts: cut to 2 before fitting.
COUNTS = re.compile(r"^(num_hidden_layers|num_layers|n_layers?|\w+_layers|num_\w*experts|n_routed_experts)$")


def buffer_kinds(model):
    """The model's non-persistent buffers, indices collapsed: which kinds it has."""
    return {collapse(n) for n in state_of(model, "buffers")[0]}


def cut(cls, config):
    """`config` with its layer and expert counts cut to 2, one at a time, keeping each
    cut only if the class still instantiates with it and still has every kind of
    buffer (Gemma 3's full-attention rotary tables exist only where a full-attention
    layer does: two layers of its pattern are both sliding)."""
    kinds = buffer_kinds(instantiate(cls, config))
    for path, value in flat_ints(config.to_dict()).items():
        if value <= 2 or not COUNTS.match(path.rsplit(".", 1)[-1]):
            continue
        try:
            smaller = with_value(config, path, 2, resize=True)
            if buffer_kinds(instantiate(cls, smaller)) != kinds:
                continue
            config = smaller
        except TooSlow:
            raise
        except Exception:
            pass
    return config


def derivation(config, path, others):
    """How the config class derives the attribute at `path` when config.json leaves it
    out (Llama's head_dim: hidden_size / num_attention_heads; DeepSeek's:
    qk_rope_head_dim), fitted as the shapes are, from the config alone: each other
    attribute changed alone with `path` left out, then the fitted ones together. The
    expression stands as the attribute's default (`None`: no fit)."""
    slot = (("attribute", path),)
    base = {slot: {_get(config.to_dict(), path)}}
    changed = {}
    for other in others:
        value = _get(config.to_dict(), other)
        new = other_value(value)
        try:
            got = _get(with_value(config, other, new, underived=[path]).to_dict(), path)
        except Exception:  # a change the config refuses says nothing
            continue
        if isinstance(got, int):
            changed[other] = (value, new, {slot: {got}})
    first = fit(base, changed, None)
    paths = set(attributes_used(first))
    together = None
    if paths:
        try:
            c = config
            for p in paths:
                c = with_value(c, p, other_value(_get(c.to_dict(), p)), underived=[path])
            together = (paths, {slot: {_get(c.to_dict(), path)}})
        except Exception:
            together = None
    return fit(base, changed, together).get(slot)


def describe(cls, model_type):
    config = default_config(cls, model_type)
    small = cut(cls, config)
    model = instantiate(cls, small)
    if not state_of(model, "buffers")[0]:
        raise LookupError("no non-persistent buffers")
    fit = fitted(cls, small, {"buffers": state_of(model, "buffers")})
    tree, exprs, _ = fit["buffers"]
    dtypes = buffer_dtypes(model)
    # Loaded in bfloat16: a floating buffer made in the default dtype follows the load
    # dtype (Gemma's `embed_scale`); one made in float32 explicitly stays so (`inv_freq`).
    with init_empty_weights(include_buffers=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        half = cls._from_config(small, dtype=torch.bfloat16)
    for name, dtype in buffer_dtypes(half).items():
        if dtype == "BF16" and dtypes.get(name) == "F32":
            dtypes[name] = "F32 load"
    lines = render(tree, exprs, set(), set(), dtypes=dtypes)
    used = attributes_used(exprs)
    values = config.to_dict()
    others = list(flat_ints(values))
    defaults = {}
    for p in used:
        if derived(config, p, others):
            how = derivation(small, p, [o for o in others if o != p])
            defaults[p] = render_expr(how)
            # What it derives from needs a default too.
            for q in attributes_used({p: how}):
                defaults.setdefault(q, _get(values, q))
        else:
            defaults[p] = _get(values, p)
    defaults = [f"default {p} {v}" for p, v in sorted(defaults.items())]
    return "\n".join(defaults + ["form buffers"] + lines)


def main(out):
    write_table(
        out,
        saved_from_classes(set(sys.argv[2:])),
        describe,
        300,
        ("the non-persistent buffers", "each architecture's model holds (generated by scripts/gen_buffer_table.py)"),
        f"no non-persistent buffers, or a default config transformers {transformers.__version__} cannot instantiate",
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "crates/devmap-core/src/model/buffer_table.txt")
