"""Writes crates/devmap-core/src/model/arch_table.txt: for each architecture transformers ships for
language models (causal LM, seq2seq, masked LM, image-text-to-text), speech seq2seq,
sequence, token and image classification, and the bare models (`AutoModel`), what accelerate's
`infer_auto_device_map` sees of it, taken from transformers itself by instantiating the
architecture on the `meta` device from its default config:

- the order accelerate walks the model in: at every module its own parameters first
  (registration order), then its children (definition order), the indices of a list of
  one class collapsed to `*` (a list of several classes, like T5's `layer`, keeps them);
  modules that hold no parameter are left out;
- which of those modules are never split (their class is in `_no_split_modules`);
- the tied parameters (`find_tied_parameters`), the one transformers saves first (the
  source in `_tied_weights_keys`), and whether a tie holds only when the config's
  `tie_word_embeddings` is true (instantiated both ways).

devmap embeds the file (crates/devmap-core/src/model/arch.rs reads it) and uses it for the planner's
order and no-split rule and for tie inference. Run where torch and transformers are
installed:

    python scripts/gen_arch_table.py [OUT]

tests/python/arch_table.py checks the committed file against the installed
transformers for the families of the planner's acceptance test, in CI.

Format: a header of `#` lines; then blocks, each opened by `= ARCH [ARCH...]` (the
architectures that share the block), then one line per walk entry, indented one space
per level below its parent, the last component of its name, ` !` when the module is
never split, ` ~` when it has a child module without parameters (which accelerate
still splits it into), ` 0` when it has no parameters itself (a dropout, a rotary
embedding: transformers' walk meets it and names it where its parent is split); then `tie A B [...]` lines (dotted names, `*` for indices), ending with
` ?` when the tie needs `tie_word_embeddings`; then `rename CHECKPOINT RUNTIME` lines:
a name that starts with the checkpoint prefix (`*` matching an index) is loaded under
the runtime prefix instead (how transformers 5 writes and reads the model's weights);
then `fp32 NAME...` (`_keep_in_fp32_modules`: kept in float32 when the model is loaded
in float16) and `fp32-strict NAME...` (`_keep_in_fp32_modules_strict`: kept in float32
when loaded in float16 or bfloat16). transformers matches each NAME as a regular
expression searched anywhere in a loaded parameter name (`.` any character, `*` any
run), and so does devmap; then `empty NAME...`: modules that hold no parameter and no
persistent buffer (every index `*`), which a device map may name; then `buffers
NAME...`: the persistent buffers, which the checkpoint holds but accelerate keeps off
the disk (every index `*`).
"""

import copy
import re
import signal
import sys
import warnings

import torch
import transformers
from accelerate import init_empty_weights
from accelerate.utils import find_tied_parameters
from transformers import AutoConfig
from transformers.models.auto import modeling_auto

MAPPINGS = [
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    # The other classes `from_pretrained(device_map=...)` is used with.
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_MAPPING_NAMES",
]

# What transformers' loader accepts in a keep-in-float32 entry, which it uses as a
# regular expression: devmap matches `.` as any character and `*` as any run, and
# nothing else, so anything else is refused here rather than matched wrongly.
KEEP_PATTERN = re.compile(r"^[A-Za-z0-9_.*]+$")


def collapse(name):
    return re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", name)


def walk(model):
    """({key: (is no-split, has a child without parameters)} in accelerate's order, {real name: key}) for the modules and
    parameters that hold parameters. A key collapses the index of a list whose members
    are all one class (`layers.*`); a list of different classes (T5's `layer`: self-
    attention, cross-attention, feed-forward) keeps its indices."""
    no_split = set(getattr(model, "_no_split_modules", None) or [])
    seen = {}
    keys = {}

    def visit(module, prefix, key):
        if not any(True for _ in module.parameters()):
            # A module without parameters (dropout, rotary embedding): transformers'
            # walk still meets it, and names it in the map where its parent is split.
            if prefix and key not in seen:
                keys[prefix] = key
                seen[key] = (False, False, True)
            return
        if prefix:
            keys[prefix] = key
            if key not in seen:
                # A child without parameters still makes a module splittable for
                # accelerate (MixtralExperts: gate_up_proj, down_proj and act_fn).
                bare = any(not any(True for _ in c.parameters()) for _, c in module.named_children())
                seen[key] = (type(module).__name__ in no_split, bare, False)
        for name, _ in module.named_parameters(recurse=False):
            full = f"{prefix}.{name}" if prefix else name
            keys[full] = f"{key}.{name}" if key else name
            seen.setdefault(keys[full], (False, False, False))
        children = list(module.named_children())
        numbered = [c for n, c in children if n.isdigit()]
        same_class = len({type(c).__name__ for c in numbered}) <= 1
        for name, child in children:
            part = "*" if name.isdigit() and same_class else name
            visit(child, f"{prefix}.{name}" if prefix else name, f"{key}.{part}" if key else part)

    visit(model, "", "")
    return seen, keys


def ties(model, keys):
    """Tie groups, each with the name transformers keeps when saving first (the source
    of `_tied_weights_keys`), then the others by name."""
    declared = getattr(model, "_tied_weights_keys", None)
    sources = {keys.get(v, collapse(v)) for v in declared.values()} if isinstance(declared, dict) else set()
    groups = set()
    for group in find_tied_parameters(model):
        names = {keys.get(n, collapse(n)) for n in group}
        groups.add(tuple(sorted(names, key=lambda n: (n not in sources, n))))
    return groups


def renames(model):
    """How the checkpoint names what the loaded model names otherwise: the renamings
    transformers 5 reverts on save (as `revert_weight_conversion` does: the model's
    conversion mapping, reversed), applied to each parameter, as pairs of (checkpoint
    prefix, runtime prefix) — Llava's `language_model.model` is
    `model.language_model`, Mixtral's `model.layers.*.block_sparse_moe` is
    `model.layers.*.mlp`. Parameters a converter makes (fused experts, anything whose
    bytes change) are left out: devmap's expert templates handle those it knows.

    Each pair keeps as little of the common tail as lets it stand alone: no two pairs
    may give one prefix two meanings, and a pair where one side only adds or drops
    components (`model` -> `model.language_model`) keeps the next component too, so it
    does not also claim that prefix's other children (`model.visual`)."""
    from collections import defaultdict

    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        PrefixChange,
        WeightConverter,
        WeightRenaming,
        apply_converters,
        apply_renamings,
    )

    conversions = [c for c in get_model_conversion_mapping(model, add_legacy=False) if not isinstance(c, PrefixChange)]
    reverse = [c.reverse_transform() for c in conversions[::-1]]
    renamings = [r for r in reverse if isinstance(r, WeightRenaming)]
    converters = [r for r in reverse if isinstance(r, WeightConverter)]
    full = set()
    for name, _ in model.named_parameters():
        if apply_converters(name, converters)[1] is not None:
            continue
        saved = apply_renamings(name, renamings)
        if saved != name:
            full.add((tuple(collapse(saved).split(".")), tuple(collapse(name).split("."))))
    full = sorted(full)

    def common_tail(old, new):
        k = 0
        while k < min(len(old), len(new)) - 1 and old[-1 - k] == new[-1 - k]:
            k += 1
        return k

    def cut(pair, k):
        old, new = pair
        return old[: len(old) - k], new[: len(new) - k]

    strip = [common_tail(old, new) for old, new in full]
    while True:
        pairs = [cut(p, k) for p, k in zip(full, strip)]
        meanings, sources = defaultdict(set), defaultdict(set)
        for old, new in pairs:
            meanings[old].add(new)
            sources[new].add(old)
        changed = False
        for i, (old, new) in enumerate(pairs):
            prefix_only = old == new[: len(old)] or new == old[: len(new)]
            if (len(meanings[old]) > 1 or len(sources[new]) > 1 or prefix_only) and strip[i] > 0:
                strip[i] -= 1
                changed = True
        if not changed:
            break
    # Still ambiguous with nothing left to keep: no rule (the names stay as they are).
    return sorted(
        (".".join(old), ".".join(new))
        for old, new in set(pairs)
        if len(meanings[old]) == 1 and len(sources[new]) == 1
    )


def instantiate(cls, config):
    with init_empty_weights(include_buffers=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls._from_config(config)
    # Outside init_empty_weights: inside it, tying registers a fresh meta parameter
    # instead of sharing one, and no tie would be found.
    model.tie_weights()
    return model


def default_config(cls, model_type):
    """The model type's default config, or its text config where the class is the text
    half of a composite model (Llama 4's and Qwen 3.5's causal LMs take the
    `text_config`; their top-level config has no vocabulary)."""
    config = AutoConfig.for_model(model_type)
    try:
        instantiate(cls, config)
        return config
    except Exception as first:
        try:
            text = config.get_text_config()
            if text is config:
                raise first
            instantiate(cls, text)
            return text
        except Exception:
            # The top-level config's error says more than the text config's.
            raise first from None


def describe(cls, model_type):
    config = default_config(cls, model_type)
    model = instantiate(cls, config)
    order, keys = walk(model)
    tied = ties(model, keys)
    renamed = renames(model)
    tied_words = getattr(config, "tie_word_embeddings", None)
    conditional = set()
    if tied_words is not None:
        flipped = copy.deepcopy(config)
        flipped.tie_word_embeddings = not tied_words
        flipped_model = instantiate(cls, flipped)
        other = ties(flipped_model, walk(flipped_model)[1])
        with_words, without = (tied, other) if tied_words else (other, tied)
        conditional = with_words - without
        tied = with_words
    keep = keep_in_fp32(model)
    return order, sorted(tied), conditional, renamed, keep, empty_modules(model), persistent_buffers(model)


def empty_modules(model):
    """Modules that hold no parameter and no persistent buffer (`rotary_emb`, `act_fn`,
    dropouts): transformers' `hf_device_map` may name them, and a map key for one is
    no typo. The topmost of each such subtree, every index collapsed to `*`."""
    found = set()

    def holds_tensors(module):
        return any(True for _ in module.parameters()) or bool(module.state_dict())

    def visit(module, prefix):
        for name, child in module.named_children():
            full = f"{prefix}.{name}" if prefix else name
            if holds_tensors(child):
                visit(child, full)
            else:
                found.add(collapse(full))

    visit(model, "")
    return sorted(found)


def keep_in_fp32(model):
    """The model's `_keep_in_fp32_modules` and `_keep_in_fp32_modules_strict`, as
    transformers gathers them from every sub-model at post_init: (kept when loaded in
    float16, kept when loaded in float16 or bfloat16)."""
    lists = []
    for attribute in ("_keep_in_fp32_modules", "_keep_in_fp32_modules_strict"):
        names = sorted(getattr(model, attribute, None) or [])
        for n in names:
            if not KEEP_PATTERN.match(n):
                raise ValueError(f"{attribute} entry {n!r} is a pattern devmap cannot match")
        lists.append(names)
    return tuple(lists)


def persistent_buffers(model):
    """The buffers a checkpoint holds (DeepSeek's `e_score_correction_bias`), every
    index collapsed to `*`: accelerate does not offload them with their module
    (`offload_buffers=False`), it moves them to the main device."""
    saved = set(model.state_dict())
    return sorted({collapse(n) for n, _ in model.named_buffers() if n in saved})


def render_block(order, tied, conditional, renamed=(), keep=((), ()), empty=(), buffers=()):
    """The walk as an indented tree. A key first met late (layer 3's experts, when layers
    0-2 are dense and share the collapsed `layers.*.mlp`) goes under its own parent,
    after that parent's earlier children: siblings keep the order they were met in."""
    tree = {}
    for name in order:
        node = tree
        for part in name.split("."):
            node = node.setdefault(part, {})
    lines = []

    def emit(node, prefix, depth):
        for part, children in node.items():
            name = f"{prefix}.{part}" if prefix else part
            no_split, bare, parameterless = order.get(name, (False, False, False))
            lines.append(" " * depth + part + (" !" if no_split else "") + (" ~" if bare else "")
                         + (" 0" if parameterless else ""))
            emit(children, name, depth + 1)

    emit(tree, "", 0)
    for group in tied:
        lines.append("tie " + " ".join(group) + (" ?" if group in conditional else ""))
    for saved, runtime in renamed:
        lines.append(f"rename {saved} {runtime}")
    fp16_only, strict = keep
    if fp16_only:
        lines.append("fp32 " + " ".join(fp16_only))
    if strict:
        lines.append("fp32-strict " + " ".join(strict))
    if empty:
        lines.append("empty " + " ".join(empty))
    if buffers:
        lines.append("buffers " + " ".join(buffers))
    return "\n".join(lines)


class TooSlow(Exception):
    pass


def too_slow(signum, frame):
    raise TooSlow("took over 60 s on the meta device")


def wanted_classes():
    """(class name, model type) for every architecture the table describes, by name."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    # Several model types can share a class (a legacy type loaded as Llama): describe it
    # with its own model type's config (LlamaConfig for LlamaForCausalLM), whose
    # conversions are the class's own, else the first.
    def own(model_type, name):
        config = CONFIG_MAPPING_NAMES.get(model_type, "")
        return name.startswith(config.removesuffix("Config")) if config else False

    classes = {}
    for mapping in MAPPINGS:
        for model_type, names in getattr(modeling_auto, mapping).items():
            for name in names if isinstance(names, (list, tuple)) else [names]:
                if name not in classes or (own(model_type, name) and not own(classes[name], name)):
                    classes[name] = model_type
    return sorted(classes.items())


def write_table(out, classes, body_of, seconds, heading, left_out):
    """Describes each (class name, model type) with `body_of(cls, model_type)` (at most
    `seconds` each) and writes the table: the two `heading` lines, a count, then one
    block per distinct body naming every class that has it. A class that cannot be
    described is left out and named on stderr."""
    signal.signal(signal.SIGALRM, too_slow)
    blocks = {}
    failed = []
    for name, model_type in classes:
        cls = getattr(transformers, name, None)
        if cls is None:
            failed.append((name, "not importable"))
            continue
        print(name, "...", file=sys.stderr, flush=True)
        signal.alarm(seconds)
        try:
            body = body_of(cls, model_type)
        except Exception as e:  # a default config that cannot instantiate: left out
            failed.append((name, f"{type(e).__name__}: {str(e)[:80]}"))
            continue
        finally:
            signal.alarm(0)
        blocks.setdefault(body, []).append(name)
        print(name, "ok", file=sys.stderr)
    with open(out, "w") as f:
        f.write(f"# transformers {transformers.__version__}, torch {torch.__version__}: {heading[0]}\n")
        f.write(f"# {heading[1]}\n")
        f.write(f"# {sum(len(v) for v in blocks.values())} architectures; {len(failed)} left out ({left_out})\n")
        for body, names in sorted(blocks.items(), key=lambda kv: kv[1][0]):
            f.write("= " + " ".join(names) + "\n" + body + "\n")
    for name, why in failed:
        print(f"left out {name}: {why}", file=sys.stderr)


def main(out):
    write_table(
        out,
        wanted_classes(),
        lambda cls, model_type: render_block(*describe(cls, model_type)),
        60,
        ("accelerate's walk order,", "no-split modules and ties per architecture (generated by scripts/gen_arch_table.py)"),
        "no default config",
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "crates/devmap-core/src/model/arch_table.txt")
