"""Writes crates/devmap-core/src/model/expect_table.txt: for each language, seq2seq, vision-language and
speech architecture of crates/devmap-core/src/model/arch_table.txt,
the tensors a checkpoint of it holds and their shapes as functions of config.json,
taken from transformers itself. `devmap verify` checks a checkpoint against it: what
transformers' loader would report MISSING, UNEXPECTED or MISMATCHED, found before
anyone loads it.

How: instantiate the class on the `meta` device from its default config, take the
state dict `save_pretrained` writes (tied copies removed, the weight conversions
reverted: per-expert MoE weights, legacy prefixes), and again with each integer of the
config doubled alone. A dimension that doubles (halves, quadruples) when an attribute
doubles holds that attribute (to the power 1, -1, 2); what is left is a constant. The
fit is then checked once more with every fitted attribute doubled together. A
dimension that does not fit (a sum like fused q/k/v, a per-layer list, a constant
over 16 that is more likely an attribute the fit missed) is written `?`: verify then
only checks that the members of a list agree with each other.

Numbered components are lists (`model.layers.3`): each list has a count (an
expression like the dimensions) and one or more variants, the distinct forms its
members take (DeepSeek's dense and MoE layers, T5's first block with its relative
attention bias). A variant met only at index 0 is pinned there; in a list whose count
is a constant, every variant is pinned to its indices. Members a default config leaves
out (DeepSeek's dense first layers, at `first_k_dense_replace: 0`) come from a second
base config with such zero attributes set to 1, fitted the same way; their variants
are never pinned.

The runtime form (the names and fused experts the loaded model holds, which
transformers also loads) is written too where it differs. (The non-persistent buffers
are in their own table, written by scripts/gen_buffer_table.py with this script's fit.)

    python scripts/gen_expect_table.py [OUT]

Format: `#` header lines; blocks opened by `= ARCH [ARCH...]`; then `default PATH
VALUE` for each config attribute an expression uses (its value when config.json
leaves it out, as transformers' diff-only config.json does for defaults; `?` when the
config class computes it from others then), `alias KEY PATH` for each other name the
config class accepts for such an attribute (its `attribute_map`: Qwen3-MoE's
config.json says `num_experts` for `num_local_experts`), `default
tie_word_embeddings true|false` when a tie depends on it; `ignore-missing PATTERN...`
and `ignore-unexpected PATTERN...` (the class's `_keys_to_ignore_on_load_*`, which
transformers does not report: `^`/`$` anchor, `*` any run, `?` any character, searched
anywhere in a name); then `form saved` and
optionally `form runtime`, each followed by its tree, one space of indent per level:
`NAME [D,D,...]` a tensor (` tied` when it is a tied copy transformers does not save,
` tied?` when that holds only while `tie_word_embeddings` is true, ` optional` when
only some configs have it), `list PATH COUNT`
a list, `variant [@I,I...]` one form of its members. A dimension or count is `?` or a
product like `2*num_attention_heads*head_dim/3` of integers and attribute paths.
"""

import copy
import sys
import warnings
from fractions import Fraction

import torch
import transformers
from transformers.core_model_loading import revert_weight_conversion
from transformers.modeling_utils import remove_tied_weights_from_state_dict

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gen_arch_table import MAPPINGS, TooSlow, collapse, default_config, instantiate, wanted_classes, write_table  # noqa: E402

# Constant factors above this are more likely an attribute the fit missed.
MAX_CONSTANT = 16
# A list whose length no attribute changed is a fixed few (T5's `layer`), or a count
# the fit missed: beyond this it is `?`.
MAX_COUNT = 4


def flat_ints(d, prefix=""):
    """Every positive integer attribute of a config dict, sub-configs included, by
    dotted path; ids (token ids and the like) and booleans left out."""
    out = {}
    for k, v in d.items():
        path = f"{prefix}{k}"
        if not isinstance(k, str):
            continue
        if isinstance(v, dict):
            out.update(flat_ints(v, path + "."))
        elif isinstance(v, int) and not isinstance(v, bool) and v > 0:
            if k.endswith(("_id", "_ids", "_token", "_index")) or "token_id" in k or "seed" in k:
                continue
            out[path] = v
    return out


def other_value(value):
    """The value an attribute is changed to for the fit: halved where that keeps it a
    whole number of at least 2 (fewer layers and experts instantiate faster), else
    doubled."""
    return value // 2 if value >= 4 and value % 2 == 0 else value * 2


def with_value(config, path, value, resize=False, underived=()):
    """`config` with the attribute at `path` set to `value`; with `resize`, a list
    beside it as long as the old value (`layer_types` for `num_hidden_layers`) is cut
    or repeated to the new length, as the config would otherwise be refused. The
    `underived` attributes are left out, so the config class derives them again from
    the changed value (Llama's head_dim from hidden_size)."""
    d = copy.deepcopy(config.to_dict())
    for other in underived:
        if other != path:
            _pop(d, other)
    node = d
    parts = path.split(".")
    for p in parts[:-1]:
        node = node[p]
    old = node[parts[-1]]
    node[parts[-1]] = value
    if resize and isinstance(old, int) and not isinstance(old, bool) and old > 0 and value != old:
        for k, v in node.items():
            if isinstance(v, list) and len(v) == old:
                node[k] = (v * (value // old + 1))[:value]
    return type(config).from_dict(d)


# Integer attributes that, at 0, leave out a kind of layer (DeepSeek's
# `first_k_dense_replace`): set to 1 in a second base config so the table also holds
# the members they add.
STRUCTURAL = ("layer", "dense", "expert", "moe", "sparse")


def saved_state(model, revert=True):
    """({name: shape}, tied names) of what save_pretrained writes (revert) or of the
    loaded model's own names (not revert): the tied copies it leaves out are in both,
    named as the rest are."""
    full = model.state_dict()
    kept = remove_tied_weights_from_state_dict(dict(full), model)
    tied = {k: v for k, v in full.items() if k not in kept}
    if revert:
        kept = revert_weight_conversion(model, kept)
        tied = revert_weight_conversion(model, tied) if tied else {}
    shapes = {k: tuple(v.shape) for k, v in kept.items()}
    shapes.update({k: tuple(v.shape) for k, v in tied.items()})
    return shapes, set(tied)


def buffer_state(model):
    """({runtime name: shape}, no ties) of the model's non-persistent buffers: never in
    a checkpoint, but accelerate counts them in their module's size when it plans a
    device map (rotary `inv_freq`, BERT-family `position_ids`)."""
    shapes = {}
    for module_name, module in model.named_modules():
        for name in sorted(module._non_persistent_buffers_set):
            b = module._buffers.get(name)
            if b is not None:
                shapes[f"{module_name}.{name}" if module_name else name] = tuple(b.shape)
    return shapes, set()


def buffer_dtypes(model):
    """{name with indices as `*`: safetensors dtype name} of the non-persistent buffers."""
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
             torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
             torch.uint8: "U8", torch.bool: "BOOL"}
    out = {}
    for module_name, module in model.named_modules():
        for name in sorted(module._non_persistent_buffers_set):
            b = module._buffers.get(name)
            if b is not None:
                full = f"{module_name}.{name}" if module_name else name
                out[collapse(full)] = names.get(b.dtype, "?")
    return out


def state_of(model, form):
    """The {name: shape} and tied names of one form: `saved` (what save_pretrained
    writes), `runtime` (the loaded model's names) or `buffers`."""
    if form == "buffers":
        return buffer_state(model)
    return saved_state(model, form == "saved")


def split_list(name):
    parts = name.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[:i]), int(p), ".".join(parts[i + 1 :])
    return None


def build(shapes):
    """A tree: {"keys": {name: shape}, "lists": {path: {index: tree}}}."""
    keys, members = {}, {}
    for name, shape in shapes.items():
        s = split_list(name)
        if s is None:
            keys[name] = shape
        else:
            path, i, rest = s
            members.setdefault(path, {}).setdefault(i, {})[rest] = shape
    lists = {path: {i: build(m) for i, m in sorted(ms.items())} for path, ms in members.items()}
    return {"keys": keys, "lists": lists}


def signature(tree):
    """What a member is, ignoring its sizes and nested counts."""
    names = set(tree["keys"])
    for path, ms in tree["lists"].items():
        for m in ms.values():
            names |= {f"{path}.*.{n}" for n in signature(m)}
    return frozenset(names)


def slots(tree, at=()):
    """{slot: value} for every tensor dimension and list count, a slot naming the path
    through lists and variants; several members of one variant give one slot several
    values (a set)."""
    out = {}
    for name, shape in tree["keys"].items():
        for d, v in enumerate(shape):
            out.setdefault(at + (("key", name, d),), set()).add(v)
    for path, ms in tree["lists"].items():
        out.setdefault(at + (("count", path),), set()).add(len(ms))
        for m in ms.values():
            for slot, vals in slots(m, at + (("member", path, signature(m)),)).items():
                out.setdefault(slot, set()).update(vals)
    return out


def fit(base, changed, together):
    """{slot: expression} from the slots of the default config (`base`), of each
    attribute changed alone (`changed`: {path: (value, new value, slots)}), and of
    every fitted attribute changed at once (`together`: (set of paths, slots) or
    None)."""
    exprs = {}
    for slot, vals in base.items():
        if len(vals) != 1:
            exprs[slot] = None
            continue
        v0 = next(iter(vals))
        powers = {}
        ok = v0 > 0
        for path, (value, new, other) in changed.items():
            got = other.get(slot)
            if not ok:
                break
            if got is None or len(got) != 1:
                continue
            r = Fraction(next(iter(got)), v0)
            step = Fraction(new, value)
            power = next((p for p in (0, 1, -1, 2, -2) if step**p == r), None)
            if power is None:
                ok = False
            elif power:
                powers[path] = (value, new, power)
        if not ok:
            exprs[slot] = None
            continue
        constant = Fraction(v0)
        for value, _, power in powers.values():
            constant /= Fraction(value) ** power
        limit = MAX_COUNT if slot[-1][0] == "count" else MAX_CONSTANT
        if constant.numerator > limit or constant.denominator > MAX_CONSTANT:
            exprs[slot] = None
            continue
        if together is not None:
            paths, values = together
            got = values.get(slot)
            if got is not None and len(got) == 1:
                predicted = Fraction(v0)
                for path, (value, new, p) in powers.items():
                    if path in paths:
                        predicted *= Fraction(new, value) ** p
                if next(iter(got)) != predicted:
                    exprs[slot] = None
                    continue
        exprs[slot] = (constant, {path: p for path, (_, _, p) in powers.items()})
    return exprs


def render_expr(e):
    if e is None:
        return "?"
    constant, powers = e
    up = [str(constant.numerator)] if constant.numerator != 1 or not powers else []
    down = [str(constant.denominator)] if constant.denominator != 1 else []
    for path, p in sorted(powers.items()):
        (up if p > 0 else down).extend([path] * abs(p))
    text = "*".join(up) if up else "1"
    return text + "".join("/" + d for d in down)


def variants_of(ms):
    """{signature: (a member, its indices)} of one list's members."""
    out = {}
    for i, m in ms.items():
        out.setdefault(signature(m), (m, []))[1].append(i)
    return out


def render(tree, exprs, tied, conditional, extra=None, at=(), prefix="", depth=0, dtypes=None):
    """`tree` as table lines; `extra` is the same form under the second base config:
    its lists' variants that `tree` lacks are added, never pinned (where they sit
    depends on the config), and a variant pinned to index 0 stays pinned only if it
    is there too. `dtypes` (the buffers form): each tensor's dtype is its mark."""
    lines = []
    pad = " " * depth
    for name, shape in tree["keys"].items():
        dims = ",".join(render_expr(exprs.get(at + (("key", name, d),))) for d in range(len(shape)))
        full = prefix + name
        mark = " tied?" if full in conditional else " tied" if full in tied else ""
        if dtypes is not None:
            mark = " " + dtypes.get(collapse(full), "?")
        lines.append(f"{pad}{name} [{dims}]{mark}")
    for path, ms in tree["lists"].items():
        count = exprs.get(at + (("count", path),))
        lines.append(f"{pad}list {path} {render_expr(count)}")
        variants = variants_of(ms)
        other = variants_of(extra["lists"].get(path, {})) if extra is not None else {}
        constant_count = count is not None and not count[1]
        members = [(sig, m, indices, True) for sig, (m, indices) in variants.items()]
        members += [(sig, m, indices, False) for sig, (m, indices) in other.items() if sig not in variants]
        for sig, m, indices, own in members:
            first_only = indices == [0] and len(ms) > 1 and (sig not in other or other[sig][1] == [0])
            pinned = own and (constant_count or first_only)
            lines.append(pad + " variant" + (" @" + ",".join(map(str, indices)) if pinned else ""))
            member_prefix = f"{prefix}{path}.{indices[0]}."
            nested_extra = other[sig][0] if own and sig in other else None
            lines += render(m, exprs, tied, conditional, nested_extra, at + (("member", path, sig),), member_prefix, depth + 2, dtypes)
    return lines


def attributes_used(exprs):
    return sorted({p for e in exprs.values() if e is not None for p in e[1]})


def fitted(cls, config, states):
    """For a base config and its forms' `states` ({form: saved_state}): per form,
    (tree, {slot: expression}, optional top-level tensors) fitted by changing each
    integer attribute alone, then all the fitted ones together."""
    form_names = list(states)
    bases = {form: build(state[0]) for form, state in states.items()}
    changed = {form: {} for form in form_names}
    optional = {form: {} for form in form_names}
    for path, value in flat_ints(config.to_dict()).items():
        m = None
        # Halved (or doubled) alone first; with same-length lists resized, which a layer
        # count needs (`layer_types`) and a head count must not get (32 heads, 32
        # layers); then the other way.
        for new, resize in [(other_value(value), False), (other_value(value), True), (value * 2, False), (value * 2, True)]:
            if new == value:
                continue
            try:
                m = instantiate(cls, with_value(config, path, new, resize))
                break
            except TooSlow:
                raise
            except Exception:
                continue
        if m is None:
            continue
        for form in form_names:
            try:
                tree = build(state_of(m, form)[0])
                changed[form][path] = (value, new, slots(tree))
                # Top-level tensors only some configs have (OPT's project_in when the
                # embedding is narrower than the model): allowed, never required.
                for name, shape in tree["keys"].items():
                    if name not in bases[form]["keys"]:
                        optional[form][name] = len(shape)
            except Exception:
                pass
    out = {}
    for form in form_names:
        base = slots(bases[form])
        first = fit(base, changed[form], None)
        paths = set(attributes_used(first))
        together = None
        if paths:
            try:
                c = config
                for p in paths:
                    c = with_value(c, p, other_value(_get(c.to_dict(), p)))
                m = instantiate(cls, c)
                together = (paths, slots(build(state_of(m, form)[0])))
            except TooSlow:
                raise
            except Exception:
                together = None
        out[form] = (bases[form], fit(base, changed[form], together), optional[form])
    return out


def describe(cls, model_type):
    config = default_config(cls, model_type)
    model = instantiate(cls, config)
    forms = {form: state_of(model, form) for form in ("saved", "runtime")}
    conditional = set()
    tie_words = getattr(config, "tie_word_embeddings", None)
    if isinstance(tie_words, bool):
        flipped_config = copy.deepcopy(config)
        flipped_config.tie_word_embeddings = not tie_words
        _, flipped_tied = saved_state(instantiate(cls, flipped_config))
        with_words, without = (forms["saved"][1], flipped_tied) if tie_words else (flipped_tied, forms["saved"][1])
        conditional = with_words - without
    names = list(forms)
    main = fitted(cls, config, forms)
    second = None
    zeros = [p for p, v in flat_zero_ints(config.to_dict()).items() if any(w in p.rsplit(".", 1)[-1] for w in STRUCTURAL)]
    if zeros:
        bumped = config
        try:
            for p in zeros:
                bumped = with_value(bumped, p, 1)
            bumped_model = instantiate(cls, bumped)
            second = fitted(cls, bumped, {form: state_of(bumped_model, form) for form in names})
        except TooSlow:
            raise
        except Exception:
            second = None
    rendered, used = {}, set()
    for form in names:
        tree, exprs, optional = main[form]
        extra = None
        if second is not None:
            extra, extra_exprs, _ = second[form]
            exprs = {**extra_exprs, **exprs}
        tied = forms[form][1]
        rendered[form] = render(tree, exprs, tied | conditional, conditional, extra)
        rendered[form] += [f"{name} [{','.join('?' * rank)}] optional" for name, rank in sorted(optional.items())]
        used |= set(attributes_used(exprs))
    values = config.to_dict()
    lines = [f"default {p} {'?' if derived(config, p, used) else _get(values, p)}" for p in sorted(used)]
    if conditional:
        lines.append(f"default tie_word_embeddings {'true' if tie_words else 'false'}")
    lines += alias_lines(type(config), used)
    for attribute, word in (("_keys_to_ignore_on_load_missing", "missing"), ("_keys_to_ignore_on_load_unexpected", "unexpected")):
        patterns = ignored(model, attribute)
        if patterns:
            lines.append(f"ignore-{word} " + " ".join(patterns))
    lines.append("form saved")
    lines += rendered["saved"]
    if rendered["runtime"] != rendered["saved"]:
        lines.append("form runtime")
        lines += rendered["runtime"]
    return "\n".join(lines)


def alias_lines(config_class, used):
    """`alias KEY PATH` for each name config.json may give a used attribute under."""
    aliases = getattr(config_class, "attribute_map", None) or {}
    return [f"alias {key} {path}" for key, path in sorted(aliases.items()) if path in used and key != path]


def add_aliases(table):
    """The table at `table` with each block's alias lines put after its defaults: the
    lines a whole run writes, without refitting every architecture."""
    out, block, used = [], None, set()

    def close():
        if block is not None:
            at = max((i for i, l in enumerate(block) if l.startswith("default ")), default=0)
            arch = block[0].split()[1]
            config_class = getattr(getattr(transformers, arch, None), "config_class", None)
            extra = alias_lines(config_class, used) if config_class is not None else []
            block[at + 1:at + 1] = [l for l in extra if l not in block]
            out.extend(block)

    for line in open(table).read().splitlines():
        if line.startswith("= "):
            close()
            block, used = [line], set()
        elif block is None:
            out.append(line)
        else:
            block.append(line)
            if line.startswith("default "):
                used.add(line.split()[1])
    close()
    with open(table, "w") as f:
        f.write("\n".join(out) + "\n")


def glob_of(r):
    """A `_keys_to_ignore_on_load_*` regular expression, its groups expanded, as the
    table's pattern (searched anywhere in a name, as `re.search` does: `^` and `$`
    anchor, `*` any run, `?` any character, the rest literal), or None when it uses more
    of the syntax."""
    g, i = "", 0
    while i < len(r):
        if r.startswith("\\.", i):
            g, i = g + ".", i + 2
        elif r.startswith("\\d+", i):
            g, i = g + "*", i + 3
        elif r.startswith(".*", i):
            g, i = g + "*", i + 2
        elif r[i] == ".":
            g, i = g + "?", i + 1
        elif (r[i] == "^" and i == 0) or (r[i] == "$" and i == len(r) - 1):
            g, i = g + r[i], i + 1
        elif r[i].isalnum() or r[i] in "_-/":
            g, i = g + r[i], i + 1
        else:
            return None
    return g


def expand(regex, limit=64):
    """`regex` without groups and character classes: one regex per alternative
    (`(?:a|b)` gives two, an optional `(x)?` gives one with and one without, `[qkv]`
    three), or None past `limit` alternatives."""
    out, todo = [], [regex]
    while todo:
        r = todo.pop()
        i = next((k for k, c in enumerate(r) if c in "([" and (k == 0 or r[k - 1] != "\\")), None)
        if i is None:
            out.append(r)
        elif r[i] == "[":
            j = r.index("]", i)
            todo += [r[:i] + c + r[j + 1:] for c in r[i + 1:j]]
        else:
            depth, j = 0, i
            while True:
                if r[j] == "(" and (j == 0 or r[j - 1] != "\\"):
                    depth += 1
                elif r[j] == ")" and r[j - 1] != "\\":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            inner = r[i + 1:j]
            if inner.startswith("?:"):
                inner = inner[2:]
            optional = r[j + 1:j + 2] == "?"
            rest = r[j + 2:] if optional else r[j + 1:]
            parts, depth, start = [], 0, 0
            for k, c in enumerate(inner):
                if c in "([":
                    depth += 1
                elif c in ")]":
                    depth -= 1
                elif c == "|" and depth == 0:
                    parts.append(inner[start:k])
                    start = k + 1
            parts.append(inner[start:])
            if optional:
                parts.append("")
            todo += [r[:i] + p + rest for p in parts]
        if len(out) + len(todo) > limit:
            return None
    return out


def ignored(model, attribute):
    """The model's `_keys_to_ignore_on_load_missing` or `_unexpected` as patterns."""
    patterns = []
    for regex in sorted(getattr(model, attribute, None) or []):
        alternatives = expand(regex)
        globs = [glob_of(a) for a in alternatives] if alternatives is not None else [None]
        if None in globs:
            print(f"  {attribute} entry {regex!r} left out: more regex than devmap matches", file=sys.stderr)
            continue
        patterns += globs
    return patterns


def derived(config, path, others):
    """Whether the config class computes `path` from other attributes when config.json
    leaves it out (Llama's `head_dim`: hidden_size / num_attention_heads; a sub-config's
    attribute its own class defaults otherwise): its default is then no default, and
    the table says `?`. Tried with each other attribute changed alone, as changes
    together can cancel out."""
    parts = path.split(".")

    def without(change=None):
        d = copy.deepcopy(config.to_dict())
        node = d
        for p in parts[:-1]:
            node = node[p]
        default = node.pop(parts[-1])
        if change is not None:
            o = d
            for p in change.split(".")[:-1]:
                o = o[p]
            key = change.split(".")[-1]
            o[key] = other_value(o[key])
        return _get(type(config).from_dict(d).to_dict(), path) != default

    def changed_alone(other):
        try:
            return without(other)
        except Exception:  # a change the config refuses says nothing
            return False

    try:
        return without() or any(changed_alone(o) for o in others if o != path)
    except Exception:
        return True


def flat_zero_ints(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_zero_ints(v, f"{prefix}{k}."))
        elif isinstance(v, int) and not isinstance(v, bool) and v == 0:
            out[f"{prefix}{k}"] = v
    return out


def _pop(d, path):
    parts = path.split(".")
    for p in parts[:-1]:
        d = d.get(p, {})
    if isinstance(d, dict):
        d.pop(parts[-1], None)


def _get(d, path):
    for p in path.split("."):
        d = d[p]
    return d


def saved_from_classes(only):
    """(class name, model type) of the classes big checkpoints are saved from
    (language, seq2seq, vision-language and speech models; classification heads and bare
    models are left to the other checks), those in `only` if it names any."""
    from transformers.models.auto import modeling_auto

    saved_from = {
        n
        for mapping in MAPPINGS[:5]
        for names in getattr(modeling_auto, mapping).values()
        for n in (names if isinstance(names, (list, tuple)) else [names])
    }
    return [(n, t) for n, t in wanted_classes() if n in saved_from and (not only or n in only)]


def main(out):
    write_table(
        out,
        saved_from_classes(set(sys.argv[2:])),
        describe,
        300,
        ("the tensors a checkpoint holds", "and their shapes per architecture (generated by scripts/gen_expect_table.py)"),
        f"a default config transformers {transformers.__version__} cannot instantiate",
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--add-aliases"]:
        # An existing table brought up to the alias lines (same transformers).
        add_aliases(sys.argv[2] if len(sys.argv) > 2 else "crates/devmap-core/src/model/expect_table.txt")
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "crates/devmap-core/src/model/expect_table.txt")
