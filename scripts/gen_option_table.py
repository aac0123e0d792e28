"""Writes crates/devmap-core/src/model/option_table.txt: for each architecture of the expect table, the
config options that switch tensors on or off, or change their shapes, in ways the
integer fit of scripts/gen_expect_table.py cannot see (it varies integers only).
`devmap verify` reads it so that a pristine `save_pretrained` output never draws a
false MISSING or UNEXPECTED: a T5 with `feed_forward_proj: "gated-gelu"`, an OPT with
`do_layer_norm_before: false`, a DeepSeek-V2 with `q_lora_rank: null`.

How: from the class's default config (as the expect table takes it), each option is
set alone to each value worth trying, the way a diff-only config.json sets it (the
config class derives the rest), and the model instantiated on the `meta` device:
  - a boolean: its negation;
  - an integer: `null` (an Optional size: DeepSeek's `q_lora_rank`);
  - a `null`: 64 (a size that is off by default: `n_inner`, `head_dim`);
  - a string: each quoted value the config class's docstring gives for it.
The saved names (tied copies left out, conversions reverted, indices collapsed to
`*`, each with its members' shapes) are compared with the default's: a name in more
members is added, in fewer removed, in other shapes reshaped; and again from a second base config where the
integers that leave out a kind of layer at 0 are 1 (DeepSeek's dense first layers,
at `first_k_dense_replace: 0` by default), as the expect table does. Recorded: the options one of whose values
changes a name or a shape, with every value tried and what it changes, and the
options where no other value could be tried (a config.json that sets them another way
cannot be checked). An option whose tried values change nothing is left out: devmap
takes it as switching no modules.

    python scripts/gen_option_table.py [OUT] [CLASS...]

Format: `#` header lines; blocks opened by `= ARCH [ARCH...]`; in each, `key PATH
DEFAULT` (PATH dotted into sub-configs, DEFAULT as JSON), then one ` value VALUE` line
per value tried (JSON), each followed by what it changes, one per line: `  + NAME` a
tensor it adds, `  - NAME` one it removes, `  ~ NAME` one whose shape it changes.
A `key` with no `value` line is one where no other value could be tried.
"""

import json
import re
import sys
import warnings

import transformers

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gen_arch_table import collapse, default_config, instantiate, write_table  # noqa: E402
from gen_expect_table import saved_from_classes, saved_state  # noqa: E402

# Options that never shape the weights: how the model runs or returns, ids, and the
# tie, which the expect table already follows.
SKIPPED = {
    "transformers_version", "architectures", "_name_or_path", "model_type", "dtype",
    "torch_dtype", "return_dict", "output_hidden_states", "output_attentions",
    "use_cache", "problem_type", "tie_word_embeddings", "output_router_logits",
    "id2label", "label2id", "torchscript", "_attn_implementation",
    "_experts_implementation", "is_decoder", "is_encoder_decoder", "chunk_size_feed_forward",
}
# An activation's name: activations hold no weights.
ACTIVATION = re.compile(r"(^|_)(act|activation)(_|$)|_act_fn$|^hidden_act$|activation_function")
# A size tried for an option that is off (`null`) by default.
SIZE = 64
# Integer attributes that, at 0, leave out a kind of layer (the expect table's).
STRUCTURAL = ("layer", "dense", "expert", "moe", "sparse")


def skipped(key):
    return key in SKIPPED or key.endswith(("_id", "_ids", "_token", "_index")) or "token_id" in key


def documented_values(config_cls, key):
    """The quoted strings the config class's docstring gives in `key`'s entry."""
    doc = "".join(c.__doc__ or "" for c in config_cls.__mro__)
    m = re.search(rf"^\s+{re.escape(key)} \(.*?(?=^\s+\w+ \(|\Z)", doc, re.M | re.S)
    if not m:
        return []
    return sorted(set(re.findall(r'"([^"\s`]{1,40})"', m.group(0))))


def tried_values(config_cls, key, value):
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [None]
    if value is None:
        return [SIZE, True]
    if isinstance(value, str):
        return [v for v in documented_values(config_cls, key) if v != value]
    return []


def options(config):
    """(path, default value) of each option worth trying, sub-configs included."""
    out = []
    d = config.to_dict()
    for key, value in d.items():
        if skipped(key) or ACTIVATION.search(key):
            continue
        if isinstance(value, dict) and "model_type" in value:
            sub = getattr(config, key, None)
            if sub is not None and hasattr(sub, "to_dict"):
                out += [(f"{key}.{p}", v, s) for p, v, s in options(sub)]
            continue
        if isinstance(value, (bool, int, str)) or value is None:
            out.append((key, value, config))
    return out


def with_option(config, path, value):
    """`config` with an option of a sub-config (`text_config.attention_bias`) set; the
    rest of it is kept as is."""
    parts = path.split(".")
    d = config.to_dict()
    d[parts[0]] = {**d[parts[0]], parts[1]: value}
    return type(config).from_dict(d)


def names(cls, config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shapes, tied = saved_state(instantiate(cls, config))
    out = {}
    for name, shape in shapes.items():
        if name not in tied:
            out.setdefault(collapse(name), []).append(shape)
    return {n: sorted(shapes) for n, shapes in out.items()}


def structural(cls, config):
    """The integers that leave out a kind of layer at 0 (DeepSeek's
    `first_k_dense_replace`), set to 1: the expect table's second base config, as
    config.json keys. An option may change only the layers they add. None when there
    are none, or the class refuses them."""
    zeros = {k: 1 for k, v in config.to_dict().items()
             if v == 0 and not isinstance(v, bool) and any(w in k for w in STRUCTURAL)}
    if not zeros:
        return None
    try:
        names(cls, type(config)(**zeros))
        return zeros
    except Exception:
        return None


def changes(cls, config, keys, path, value, base):
    """(added, removed, reshaped) saved names when `path` is set to `value` in the
    config that `keys` (config.json keys) make of `config`'s class."""
    if "." in path:
        changed = names(cls, with_option(type(config)(**keys), path, value))
    else:
        changed = names(cls, type(config)(**{**keys, path: value}))
    # By collapsed name: in more or fewer members (Gemma 4's `attention_k_eq_v` drops
    # `v_proj` from its full-attention layers only), or in other shapes.
    return (
        {n for n in changed if len(changed[n]) > len(base.get(n, []))},
        {n for n in base if len(base[n]) > len(changed.get(n, []))},
        {n for n in set(base) & set(changed) if set(base[n]) != set(changed[n])},
    )


def describe(cls, model_type):
    config = default_config(cls, model_type)
    bases = [({}, names(cls, config))]
    more = structural(cls, config)
    if more is not None:
        bases.append((more, names(cls, type(config)(**more))))
    lines = []
    for path, default, owner in options(config):
        tried = []
        for value in tried_values(type(owner), path.rsplit(".", 1)[-1], default):
            found = []
            for keys, base in bases:
                try:
                    found.append(changes(cls, config, keys, path, value, base))
                except Exception:  # a value the config or the model refuses
                    pass
            if found:
                tried.append((value, [set().union(*parts) for parts in zip(*found)]))
        if tried and all(not any(c) for _, c in tried):
            continue
        if not tried and not isinstance(default, bool) and default is not None:
            # An integer that cannot be null, a string the docstring gives no other
            # value for: left to the fit, or taken as switching nothing.
            continue
        lines.append(f"key {path} {json.dumps(default)}")
        for value, (added, removed, reshaped) in tried:
            lines.append(f" value {json.dumps(value)}")
            lines += [f"  + {n}" for n in sorted(added)]
            lines += [f"  - {n}" for n in sorted(removed)]
            lines += [f"  ~ {n}" for n in sorted(reshaped)]
    if not lines:
        raise LookupError("no option changes a tensor")
    return "\n".join(lines)


def main(out):
    write_table(
        out,
        saved_from_classes(set(sys.argv[2:])),
        describe,
        120,
        ("the config options that switch tensors on and off", "per architecture (generated by scripts/gen_option_table.py)"),
        f"no option changes a tensor, or a default config transformers {transformers.__version__} cannot instantiate",
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "crates/devmap-core/src/model/option_table.txt")
