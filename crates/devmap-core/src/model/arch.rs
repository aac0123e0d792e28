//! What transformers' own classes say about an architecture, taken from transformers by
//! `scripts/gen_arch_table.py` and embedded: the order accelerate walks the model in,
//! which modules are never split, and which parameters are tied. A checkpoint records
//! none of these (headers and indexes are sorted by name), and hand-written family
//! rules kept missing families (T5's encoder before its decoder, OPT's final norm
//! defined before its layers, BERT's head tied to its embeddings).
//!
//! Names in the table are runtime names with the indices of a list of one class
//! collapsed to `*` (`model.layers.*.self_attn`). Architectures not in the table fall back to the
//! heuristics in `plan::order` and `load::ties`.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::table::{Blocks, Parsed, index};

/// The generated table (see the script for its format).
const TABLE: &str = include_str!("arch_table.txt");

/// One architecture's facts: a tree of name components (`*` for a collapsed index), in
/// accelerate's walk order, so a planner walking a model's tree steps through it one
/// component at a time without building a name.
#[derive(Debug)]
pub struct Arch {
    nodes: Vec<Entry>,
    pub ties: Vec<Tie>,
    /// How checkpoint names become runtime names on load (see [`Arch::runtime_name`]).
    renames: Vec<Rename>,
    /// `_keep_in_fp32_modules`: kept in float32 when the model loads in float16.
    pub keep_fp32: Vec<String>,
    /// `_keep_in_fp32_modules_strict`: kept in float32 when it loads in float16 or
    /// bfloat16.
    pub keep_fp32_strict: Vec<String>,
    /// Modules with no parameter and no persistent buffer (`model.rotary_emb`,
    /// `model.layers.*.mlp.act_fn`), every index `*`.
    empty: std::collections::HashSet<String>,
    /// Persistent buffers (a checkpoint holds them; accelerate does not offload them
    /// with their module), every index `*`.
    buffers: Vec<String>,
}

/// A name starting with `checkpoint` is loaded under `runtime` instead (components; `*`
/// stands for an index, the same one on both sides).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rename {
    checkpoint: Vec<Box<str>>,
    runtime: Vec<Box<str>>,
}

/// A point in an architecture's tree (see [`Arch::step`]).
pub type Cursor = u32;

/// One entry; its cursor is its place in accelerate's walk (entries are made in the
/// table's order, the root first).
#[derive(Debug, Default)]
struct Entry {
    children: HashMap<Box<str>, Cursor>,
    /// Of a `_no_split_modules` class.
    no_split: bool,
    /// Has a child module that holds no parameter (`act_fn`): accelerate splits it even
    /// when its parameters are its own.
    bare_children: bool,
    /// Holds no parameter itself (a dropout, a rotary embedding): the walk meets it all
    /// the same.
    parameterless: bool,
}

impl Default for Arch {
    fn default() -> Arch {
        Arch {
            nodes: vec![Entry::default()],
            ties: Vec::new(),
            renames: Vec::new(),
            keep_fp32: Vec::new(),
            keep_fp32_strict: Vec::new(),
            empty: std::collections::HashSet::new(),
            buffers: Vec::new(),
        }
    }
}

/// Parameters that are one tensor in the loaded model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tie {
    /// Dotted runtime names (`*` for an index), in the table's order.
    pub members: Vec<String>,
    /// The tie holds only when the config's `tie_word_embeddings` is true.
    pub needs_tied_word_embeddings: bool,
}

fn table() -> &'static Blocks {
    static INDEX: OnceLock<Blocks> = OnceLock::new();
    INDEX.get_or_init(|| index(TABLE))
}

/// Parses one block (see the script for the format).
fn parse_block(body: &str) -> Arch {
    let mut arch = Arch::default();
    // The cursor of the entry at each depth of the current line.
    let mut path: Vec<Cursor> = Vec::new();
    for line in body.lines().filter(|l| !l.is_empty()) {
        if let Some(rule) = line.strip_prefix("rename ") {
            if let Some((checkpoint, runtime)) = rule.split_once(' ') {
                let parts = |p: &str| p.split('.').map(Box::from).collect::<Vec<Box<str>>>();
                arch.renames.push(Rename {
                    checkpoint: parts(checkpoint),
                    runtime: parts(runtime),
                });
            }
            continue;
        }
        if let Some(names) = line.strip_prefix("buffers ") {
            arch.buffers = names.split(' ').map(str::to_owned).collect();
            continue;
        }
        if let Some(names) = line.strip_prefix("empty ") {
            arch.empty = names.split(' ').map(str::to_owned).collect();
            continue;
        }
        if let Some(names) = line.strip_prefix("fp32-strict ") {
            arch.keep_fp32_strict = names.split(' ').map(str::to_owned).collect();
            continue;
        }
        if let Some(names) = line.strip_prefix("fp32 ") {
            arch.keep_fp32 = names.split(' ').map(str::to_owned).collect();
            continue;
        }
        if let Some(tie) = line.strip_prefix("tie ") {
            let (members, needs) = match tie.strip_suffix(" ?") {
                Some(m) => (m, true),
                None => (tie, false),
            };
            arch.ties.push(Tie {
                members: members.split(' ').map(str::to_owned).collect(),
                needs_tied_word_embeddings: needs,
            });
            continue;
        }
        let depth = line.len() - line.trim_start_matches(' ').len();
        let entry = &line[depth..];
        let (entry, parameterless) = match entry.strip_suffix(" 0") {
            Some(c) => (c, true),
            None => (entry, false),
        };
        let (entry, bare) = match entry.strip_suffix(" ~") {
            Some(c) => (c, true),
            None => (entry, false),
        };
        let (component, no_split) = match entry.strip_suffix(" !") {
            Some(c) => (c, true),
            None => (entry, false),
        };
        path.truncate(depth);
        let parent = path.last().copied().unwrap_or(Arch::ROOT);
        let next = arch.nodes.len() as Cursor;
        let at = *arch.nodes[parent as usize]
            .children
            .entry(component.into())
            .or_insert(next);
        if at == next {
            arch.nodes.push(Entry::default());
        }
        let e = &mut arch.nodes[at as usize];
        e.no_split |= no_split;
        e.bare_children |= bare;
        e.parameterless |= parameterless;
        path.push(at);
    }
    arch
}

impl Arch {
    /// The entry of `_keep_in_fp32_modules(_strict)` that keeps the loaded parameter
    /// `name` in float32 when the model is loaded in `dtype`, as transformers 5 decides
    /// it: non-strict entries for float16 only, strict ones for float16 and bfloat16;
    /// an entry keeps every parameter whose loaded name it matches anywhere, read as
    /// the regular expression transformers makes of it (`.` any character, `*` any
    /// run; no component boundary).
    pub fn kept_in_fp32(&self, name: &str, dtype: crate::types::DType) -> Option<&str> {
        use crate::types::DType;
        let strict_applies = matches!(dtype, DType::F16 | DType::BF16);
        let loose_applies = dtype == DType::F16;
        let strict = self.keep_fp32_strict.iter().filter(|_| strict_applies);
        let loose = self.keep_fp32.iter().filter(|_| loose_applies);
        loose
            .chain(strict)
            .find(|pattern| search(pattern.as_bytes(), name.as_bytes()))
            .map(String::as_str)
    }

    /// Whether a device-map key names a module that holds no parameter and no
    /// persistent buffer (or one inside it), under its loaded or checkpoint name.
    pub fn is_empty_module(&self, key: &str) -> bool {
        if self.empty.is_empty() {
            return false;
        }
        fn collapsed(name: &str) -> Vec<&str> {
            name.split('.')
                .map(|c| {
                    if !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()) {
                        "*"
                    } else {
                        c
                    }
                })
                .collect()
        }
        let inside_empty = |name: &str| {
            let parts = collapsed(name);
            (1..=parts.len()).any(|n| self.empty.contains(&parts[..n].join(".")))
        };
        inside_empty(key) || self.runtime_name(key).is_some_and(|r| inside_empty(&r))
    }

    /// Whether a tensor (checkpoint or loaded name) is a persistent buffer: accelerate
    /// keeps it on the main device when its module is offloaded.
    pub fn is_persistent_buffer(&self, name: &str) -> bool {
        if self.buffers.is_empty() {
            return false;
        }
        let hit = |n: &str| self.buffers.iter().any(|p| super::options::matches(p, n));
        hit(name) || self.runtime_name(name).is_some_and(|r| hit(&r))
    }
}

/// Whether `pattern` (`.` any byte, `*` any run, anything else itself) matches
/// somewhere in `text`: Python's `re.search` for the patterns the table holds (the
/// generator refuses any other regular-expression syntax).
fn search(pattern: &[u8], text: &[u8]) -> bool {
    (0..=text.len()).any(|start| matches_at(pattern, &text[start..]))
}

/// Whether `pattern` matches a prefix of `text`.
fn matches_at(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => true,
        Some((b'*', rest)) => (0..=text.len()).any(|skip| matches_at(rest, &text[skip..])),
        Some((&p, rest)) => text
            .split_first()
            .is_some_and(|(&t, tail)| (p == b'.' || p == t) && matches_at(rest, tail)),
    }
}

/// The facts for the first of `architectures` (config.json's list) that the table has.
pub fn lookup(architectures: &[String]) -> Option<&'static Arch> {
    static PARSED: Parsed<Arch> = Parsed::new();
    let t = table();
    let block = t.find(architectures)?;
    Some(PARSED.get(block, || parse_block(t.bodies[block])))
}

/// How the loaded model names a checkpoint tensor, when transformers 5 renames or fuses
/// it on load and the architecture says so: `(runtime name, what part of it)`, e.g.
/// (`model.layers.1.mlp.experts.gate_up_proj`, `expert 3, gate rows`). Device maps
/// written from a loaded model use these names.
pub fn loaded_as(architectures: &[String], name: &str) -> Option<(String, String)> {
    lookup(architectures)?.loaded_form(name)
}

/// Where the table comes from, for notes: `transformers 5.25.0, torch 2.15.0`.
pub fn source() -> &'static str {
    table().source
}

impl Arch {
    pub const ROOT: Cursor = 0;

    /// The entry for `component` under `at`. An all-digit component matches a collapsed
    /// index (`*`, a list of one class) or, in a list of several classes (T5's
    /// `layer`), itself. Runtime names: a checkpoint's own names go through
    /// [`Arch::runtime_name`] first (the planner walks `plan::view`'s renamed tree).
    pub fn step(&self, at: Cursor, component: &str) -> Option<Cursor> {
        let children = &self.nodes.get(at as usize)?.children;
        if !component.is_empty() && component.bytes().all(|b| b.is_ascii_digit()) {
            return children
                .get("*")
                .or_else(|| children.get(component))
                .copied();
        }
        children.get(component).copied()
    }

    /// The entry for a dotted name, in its runtime form or as the checkpoint has it.
    pub fn find(&self, name: &str) -> Option<Cursor> {
        self.walk(name)
            .or_else(|| self.walk(&self.runtime_name(name)?))
    }

    /// The entry for a name exactly as given (no renaming).
    fn walk(&self, name: &str) -> Option<Cursor> {
        name.split('.')
            .try_fold(Self::ROOT, |at, component| self.step(at, component))
    }

    /// [`loaded_as`] for this architecture: the loaded name of a checkpoint tensor, and
    /// what part of it the tensor is, when it differs.
    pub fn loaded_form(&self, name: &str) -> Option<(String, String)> {
        if let Some(piece) = crate::model::names::expert_piece(name) {
            let fused = self.loaded_or_same(&piece.fused);
            if self.position(&fused).is_some() {
                let part = ["gate rows", "up rows", "all"][usize::from(piece.part.min(2))];
                return Some((fused, format!("expert {}, {part}", piece.expert)));
            }
        }
        let renamed = self.loaded_name(name)?;
        Some((renamed, "renamed on load".to_owned()))
    }

    /// The name the loaded model has for a checkpoint name, when it differs: renamed
    /// by the rules, unless the name already is one the model has (a checkpoint saved
    /// in the runtime layout is not renamed twice). The renamed name need not be in
    /// the table: a sub-model's layout depends on its config (Llava's CLIP tower).
    pub fn loaded_name(&self, checkpoint: &str) -> Option<String> {
        if self.walk(checkpoint).is_some() {
            return None;
        }
        self.runtime_name(checkpoint)
    }

    /// Place in accelerate's walk: entries are numbered in walk order.
    pub fn position_at(&self, at: Cursor) -> u32 {
        at
    }

    pub fn no_split_at(&self, at: Cursor) -> bool {
        self.nodes[at as usize].no_split
    }

    pub fn bare_children_at(&self, at: Cursor) -> bool {
        self.nodes[at as usize].bare_children
    }

    /// The children of `at` that hold no parameter, with their cursors (their place in
    /// the walk); a collapsed list member (`*`) is left out.
    pub fn parameterless_children(&self, at: Cursor) -> Vec<(&str, Cursor)> {
        let mut out: Vec<(&str, Cursor)> = self.nodes[at as usize]
            .children
            .iter()
            .filter(|(name, c)| &***name != "*" && self.nodes[**c as usize].parameterless)
            .map(|(name, c)| (&**name, *c))
            .collect();
        out.sort_by_key(|(_, c)| *c);
        out
    }

    /// The name the loaded model has for a checkpoint tensor or module, where
    /// transformers 5 renames it on load (Llava's `language_model.model.layers.3` is
    /// `model.language_model.layers.3`; GPT-NeoX's `embed_out` is `lm_head`). `None`:
    /// the same name. The longest matching rule wins.
    pub fn runtime_name(&self, checkpoint: &str) -> Option<String> {
        rename(&self.renames, checkpoint, |r| (&r.checkpoint, &r.runtime))
    }

    /// [`Arch::loaded_name`], or `name` itself when it is not renamed.
    pub fn loaded_or_same(&self, name: &str) -> String {
        self.loaded_name(name).unwrap_or_else(|| name.to_owned())
    }

    /// The other way: the checkpoint name of a runtime name.
    pub fn checkpoint_name(&self, runtime: &str) -> Option<String> {
        rename(&self.renames, runtime, |r| (&r.runtime, &r.checkpoint))
    }

    /// The place of a name in accelerate's walk, if the architecture has it.
    pub fn position(&self, name: &str) -> Option<u32> {
        self.find(name).map(|at| self.position_at(at))
    }
}

/// Applies the longest rule whose `from` side (by `sides`) starts `name`; `*` matches
/// an index, which the `to` side's `*` takes over, in order.
fn rename(
    rules: &[Rename],
    name: &str,
    sides: impl Fn(&Rename) -> (&Vec<Box<str>>, &Vec<Box<str>>),
) -> Option<String> {
    let parts: Vec<&str> = name.split('.').collect();
    let (from, to) = rules
        .iter()
        .map(&sides)
        .filter(|(from, _)| {
            from.len() <= parts.len()
                && from.iter().zip(&parts).all(|(f, p)| {
                    &**f == *p
                        || (&**f == "*" && !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                })
        })
        .max_by_key(|(from, _)| from.len())?;
    let mut indices = from
        .iter()
        .zip(&parts)
        .filter(|(f, _)| &***f == "*")
        .map(|(_, p)| *p);
    let mut out: Vec<&str> = to
        .iter()
        .map(|t| {
            if &**t == "*" {
                indices.next().unwrap_or("*")
            } else {
                t
            }
        })
        .collect();
    out.extend_from_slice(&parts[from.len()..]);
    let renamed = out.join(".");
    (renamed != name).then_some(renamed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_split(a: &Arch, name: &str) -> bool {
        a.find(name).is_some_and(|at| a.no_split_at(at))
    }

    fn bare(a: &Arch, name: &str) -> bool {
        a.find(name).is_some_and(|at| a.bare_children_at(at))
    }

    #[test]
    fn the_embedded_table_parses_and_knows_the_common_families() {
        for arch in [
            "LlamaForCausalLM",
            "Qwen2ForCausalLM",
            "T5ForConditionalGeneration",
            "BertForMaskedLM",
            "OPTForCausalLM",
        ] {
            assert!(lookup(&[arch.to_owned()]).is_some(), "{arch}");
        }
        assert!(source().starts_with("transformers 5."), "{}", source());
        // DeepSeek-V3's first layers are dense, the rest MoE, under one collapsed
        // `layers.*.mlp`: the experts met late still nest under `mlp`.
        let deepseek = lookup(&["DeepseekV3ForCausalLM".to_owned()]).expect("deepseek");
        assert!(
            deepseek
                .find("model.layers.7.mlp.experts.gate_up_proj")
                .is_some()
        );
        assert!(
            deepseek
                .find("model.layers.7.post_attention_layernorm.experts")
                .is_none()
        );
        assert!(
            deepseek.position("model.layers.7.mlp.experts")
                < deepseek.position("model.layers.7.input_layernorm")
        );
    }

    #[test]
    fn blocks_nest_by_indent_and_mark_no_split_and_ties() {
        let t = index(
            "# transformers 9.9: test\n= AForX BForX\nmodel\n embed\n  weight\n layers\n  * !\n   proj\n    weight\n   experts ~\n    fused\nhead\n weight\ntie head.weight model.embed.weight ?\n= CForX\nhead\n",
        );
        let a = parse_block(t.bodies[t.by_name["BForX"]]);
        assert_eq!(t.source, "transformers 9.9");
        assert!(a.position("model.embed.weight") < a.position("model.layers.3.proj"));
        assert!(a.position("model.layers.12.proj.weight") < a.position("head"));
        assert!(no_split(&a, "model.layers.7"));
        assert!(!no_split(&a, "model.layers"));
        assert!(bare(&a, "model.layers.2.experts"));
        assert!(!bare(&a, "model.layers.2.proj"));
        assert!(a.position("model.layers.2.experts.fused") > a.position("model.layers.2.proj"));
        assert_eq!(a.position("model.missing"), None);
        assert_eq!(
            a.ties,
            vec![Tie {
                members: vec!["head.weight".into(), "model.embed.weight".into()],
                needs_tied_word_embeddings: true
            }]
        );
        let c = parse_block(t.bodies[t.by_name["CForX"]]);
        assert_eq!(c.position("head"), Some(1), "after the root");
    }

    #[test]
    fn keep_in_fp32_follows_transformers_dtype_rule_and_regex_search() {
        use crate::types::DType;
        let arch = parse_block(
            "model\n layers\n  * !\n   mlp\n    gate\n     weight\nfp32 wo\nfp32-strict mlp.gate.weight e_score*bias\nempty model.rotary_emb model.layers.*.mlp.act_fn\n",
        );
        let gate = "model.layers.3.mlp.gate.weight";
        // Strict entries for float16 and bfloat16; the others for float16 only.
        assert_eq!(
            arch.kept_in_fp32(gate, DType::BF16),
            Some("mlp.gate.weight")
        );
        assert_eq!(arch.kept_in_fp32(gate, DType::F16), Some("mlp.gate.weight"));
        assert_eq!(arch.kept_in_fp32(gate, DType::F32), None);
        let wo = "encoder.block.0.layer.1.DenseReluDense.wo.weight";
        assert_eq!(arch.kept_in_fp32(wo, DType::F16), Some("wo"));
        assert_eq!(arch.kept_in_fp32(wo, DType::BF16), None);
        // A search anywhere, `.` any character and `*` any run, as Python's re.search
        // of the pattern transformers builds.
        assert_eq!(
            arch.kept_in_fp32("x.word_embeddings", DType::F16),
            Some("wo")
        );
        assert_eq!(
            arch.kept_in_fp32("a.mlpXgate_weight", DType::BF16),
            Some("mlp.gate.weight")
        );
        assert_eq!(
            arch.kept_in_fp32("layers.1.mlp.gate.e_score_correction_bias", DType::BF16),
            Some("e_score*bias")
        );
        assert_eq!(arch.kept_in_fp32("model.norm.weight", DType::F16), None);
        // Modules without tensors, under any index and below.
        assert!(arch.is_empty_module("model.rotary_emb"));
        assert!(arch.is_empty_module("model.layers.17.mlp.act_fn"));
        assert!(!arch.is_empty_module("model.layers.17.mlp"));
        assert!(!arch.is_empty_module("model.rotary"));
    }

    #[test]
    fn rename_rules_map_checkpoint_names_to_runtime_names_and_back() {
        let t = index(
            "# transformers 9.9: test\n= V\nmodel\n language_model\n  layers\n   * !\n    mlp\n     w\nlm_head\n weight\nrename language_model.model model.language_model\nrename language_model.lm_head lm_head\nrename model.layers.*.moe model.layers.*.mlp\n",
        );
        let a = parse_block(t.bodies[0]);
        assert_eq!(
            a.runtime_name("language_model.model.layers.3.mlp.w")
                .as_deref(),
            Some("model.language_model.layers.3.mlp.w")
        );
        assert_eq!(
            a.runtime_name("language_model.lm_head.weight").as_deref(),
            Some("lm_head.weight")
        );
        assert_eq!(
            a.runtime_name("model.layers.12.moe.gate.weight").as_deref(),
            Some("model.layers.12.mlp.gate.weight"),
            "an index carries over"
        );
        assert_eq!(a.runtime_name("model.layers.x.moe.gate"), None);
        assert_eq!(a.runtime_name("lm_head.weight"), None);
        assert_eq!(
            a.checkpoint_name("model.language_model.layers.3.mlp.w")
                .as_deref(),
            Some("language_model.model.layers.3.mlp.w")
        );
        // The real table: Gemma 3's checkpoint layout, GPT-NeoX's head.
        let gemma3 = lookup(&["Gemma3ForConditionalGeneration".to_owned()]).expect("gemma3");
        assert_eq!(
            gemma3
                .runtime_name("language_model.model.layers.7.mlp.up_proj.weight")
                .as_deref(),
            Some("model.language_model.layers.7.mlp.up_proj.weight")
        );
        let neox = lookup(&["GPTNeoXForCausalLM".to_owned()]).expect("neox");
        assert_eq!(
            neox.runtime_name("embed_out.weight").as_deref(),
            Some("lm_head.weight")
        );
    }

    #[test]
    fn a_list_of_several_classes_keeps_its_indices() {
        // T5-like: in every block, layer 0 is attention, layer 1 the MLP, each with
        // its own norm after it.
        let t = index(
            "# transformers 9.9: test\n= T\nblock\n * !\n  layer\n   0\n    attn\n    norm\n   1\n    mlp\n    norm\n",
        );
        let a = parse_block(t.bodies[0]);
        let at = |n: &str| a.position(n).unwrap_or(u32::MAX);
        assert!(at("block.3.layer.0.attn") < at("block.3.layer.0.norm"));
        assert!(at("block.3.layer.0.norm") < at("block.3.layer.1.mlp"));
        assert!(at("block.3.layer.1.mlp") < at("block.3.layer.1.norm"));
        assert!(no_split(&a, "block.5"));
        assert!(!no_split(&a, "block.5.layer.1"));
    }
}
