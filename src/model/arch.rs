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

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

/// The generated table (see the script for its format).
const TABLE: &str = include_str!("arch_table.txt");

/// One architecture's facts.
#[derive(Debug, Default)]
pub struct Arch {
    /// Each collapsed name's place in accelerate's walk.
    order: HashMap<String, u32>,
    no_split: HashSet<String>,
    /// Modules with a child module that holds no parameter (`act_fn`): accelerate
    /// splits them even when their parameters are their own.
    bare_children: HashSet<String>,
    pub ties: Vec<Tie>,
}

/// Parameters that are one tensor in the loaded model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tie {
    /// Dotted runtime names (`*` for an index), in the table's order.
    pub members: Vec<String>,
    /// The tie holds only when the config's `tie_word_embeddings` is true.
    pub needs_tied_word_embeddings: bool,
}

struct Table {
    archs: Vec<Arch>,
    by_name: HashMap<&'static str, usize>,
    /// The transformers version the table came from (its first line).
    source: &'static str,
}

fn table() -> &'static Table {
    static PARSED: OnceLock<Table> = OnceLock::new();
    PARSED.get_or_init(|| parse(TABLE))
}

fn parse(text: &'static str) -> Table {
    let mut archs: Vec<Arch> = Vec::new();
    let mut by_name = HashMap::new();
    let mut path: Vec<&str> = Vec::new();
    let source = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# "))
        .and_then(|l| l.split(':').next())
        .unwrap_or("transformers");
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        if let Some(names) = line.strip_prefix("= ") {
            for name in names.split(' ') {
                by_name.insert(name, archs.len());
            }
            archs.push(Arch::default());
            path.clear();
            continue;
        }
        let Some(arch) = archs.last_mut() else {
            continue;
        };
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
        let (entry, bare) = match entry.strip_suffix(" ~") {
            Some(c) => (c, true),
            None => (entry, false),
        };
        let (component, no_split) = match entry.strip_suffix(" !") {
            Some(c) => (c, true),
            None => (entry, false),
        };
        path.truncate(depth);
        path.push(component);
        let name = path.join(".");
        if no_split {
            arch.no_split.insert(name.clone());
        }
        if bare {
            arch.bare_children.insert(name.clone());
        }
        let at = u32::try_from(arch.order.len()).unwrap_or(u32::MAX);
        arch.order.entry(name).or_insert(at);
    }
    Table {
        archs,
        by_name,
        source,
    }
}

/// The facts for the first of `architectures` (config.json's list) that the table has.
pub fn lookup(architectures: &[String]) -> Option<&'static Arch> {
    let t = table();
    architectures
        .iter()
        .find_map(|a| t.by_name.get(a.as_str()))
        .map(|&i| &t.archs[i])
}

/// How the loaded model names a checkpoint tensor, when transformers 5 renames or fuses
/// it on load and the architecture says so: `(runtime name, what part of it)`, e.g.
/// (`model.layers.1.mlp.experts.gate_up_proj`, `expert 3, gate rows`). Device maps
/// written from a loaded model use these names.
pub fn loaded_as(architectures: &[String], name: &str) -> Option<(String, String)> {
    let arch = lookup(architectures)?;
    if let Some(piece) = crate::model::names::expert_piece(name)
        && arch.position(&piece.fused).is_some()
    {
        let part = ["gate rows", "up rows", "all"][usize::from(piece.part.min(2))];
        return Some((piece.fused, format!("expert {}, {part}", piece.expert)));
    }
    let renamed = crate::model::names::runtime_name(name)?;
    arch.position(&renamed)
        .is_some()
        .then(|| (renamed, "renamed module".to_owned()))
}

/// Where the table comes from, for notes: `transformers 5.24.0, torch 2.15.0`.
pub fn source() -> &'static str {
    table().source
}

/// The keys `name` may have in the table: every index collapsed first, then with one
/// index kept (the last first), and so on — a list of modules of several classes keeps
/// its indices in the table (T5's `layer.1` is cross-attention, `layer.2` the MLP).
fn keys(name: &str) -> impl Iterator<Item = String> + '_ {
    let parts: Vec<&str> = name.split('.').collect();
    let numbered: Vec<usize> = parts
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()))
        .map(|(i, _)| i)
        .collect();
    // Real names have a few indices; past eight, only the all-collapsed key is tried.
    let masks: Vec<u32> = if numbered.len() > 8 {
        vec![0]
    } else {
        let mut m: Vec<u32> = (0..1u32 << numbered.len()).collect();
        // Fewer kept indices first; among equals, the later ones kept first.
        m.sort_by_key(|&mask| (mask.count_ones(), std::cmp::Reverse(mask)));
        m
    };
    masks.into_iter().map(move |mask| {
        let mut key = parts.clone();
        for (bit, &at) in numbered.iter().enumerate() {
            if mask & (1 << bit) == 0 {
                key[at] = "*";
            }
        }
        key.join(".")
    })
}

impl Arch {
    /// The place of a (runtime, uncollapsed) name in accelerate's walk, if the
    /// architecture has it.
    pub fn position(&self, name: &str) -> Option<u32> {
        keys(name).find_map(|k| self.order.get(&k).copied())
    }

    /// Whether the module `name` is of a class in `_no_split_modules`.
    pub fn is_no_split(&self, name: &str) -> bool {
        self.key(name).is_some_and(|k| self.no_split.contains(&k))
    }

    /// Whether the module `name` has a child module without parameters.
    pub fn has_bare_children(&self, name: &str) -> bool {
        self.key(name)
            .is_some_and(|k| self.bare_children.contains(&k))
    }

    fn key(&self, name: &str) -> Option<String> {
        keys(name).find(|k| self.order.contains_key(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn blocks_nest_by_indent_and_mark_no_split_and_ties() {
        let t = parse(
            "# transformers 9.9: test\n= AForX BForX\nmodel\n embed\n  weight\n layers\n  * !\n   proj\n    weight\n   experts ~\n    fused\nhead\n weight\ntie head.weight model.embed.weight ?\n= CForX\nhead\n",
        );
        let a = &t.archs[t.by_name["BForX"]];
        assert_eq!(t.source, "transformers 9.9");
        assert!(a.position("model.embed.weight") < a.position("model.layers.3.proj"));
        assert!(a.position("model.layers.12.proj.weight") < a.position("head"));
        assert!(a.is_no_split("model.layers.7"));
        assert!(!a.is_no_split("model.layers"));
        assert!(a.has_bare_children("model.layers.2.experts"));
        assert!(!a.has_bare_children("model.layers.2.proj"));
        assert!(a.position("model.layers.2.experts.fused") > a.position("model.layers.2.proj"));
        assert_eq!(a.position("model.missing"), None);
        assert_eq!(
            a.ties,
            vec![Tie {
                members: vec!["head.weight".into(), "model.embed.weight".into()],
                needs_tied_word_embeddings: true
            }]
        );
        assert_eq!(t.archs[t.by_name["CForX"]].position("head"), Some(0));
    }

    #[test]
    fn a_list_of_several_classes_keeps_its_indices() {
        // T5-like: in every block, layer 0 is attention, layer 1 the MLP, each with
        // its own norm after it.
        let t = parse(
            "# transformers 9.9: test\n= T\nblock\n * !\n  layer\n   0\n    attn\n    norm\n   1\n    mlp\n    norm\n",
        );
        let a = &t.archs[0];
        let at = |n: &str| a.position(n).unwrap_or(u32::MAX);
        assert!(at("block.3.layer.0.attn") < at("block.3.layer.0.norm"));
        assert!(at("block.3.layer.0.norm") < at("block.3.layer.1.mlp"));
        assert!(at("block.3.layer.1.mlp") < at("block.3.layer.1.norm"));
        assert!(a.is_no_split("block.5"));
        assert!(!a.is_no_split("block.5.layer.1"));
    }
}
