//! Dotted parameter names: component-wise "module order".
//!
//! Checkpoints carry no module-definition order (headers and indexes are sorted by
//! name), so devmap orders names component by component, comparing all-digit
//! components as numbers: `layers.2` sorts before `layers.10`, and `h.9.attn` before
//! `h.10.attn`.

use std::cmp::Ordering;

/// Names of output heads that transformers ties to the input embedding.
pub const HEAD_NAMES: [&str; 2] = ["lm_head.weight", "embed_out.weight"];
/// Name endings of input embeddings, most common first.
pub const EMBEDDING_SUFFIXES: [&str; 5] = [
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight",
    "embed_in.weight",
    "shared.weight",
];

/// Modules transformers 5 renames between checkpoint and run time, as
/// `(checkpoint, runtime)` components (from its `conversion_mapping.py`): Mixtral's
/// `block_sparse_moe` is `mlp`. Device maps written from a loaded model and fused
/// offload entries use the runtime name.
pub const MODULE_RENAMES: [(&str, &str); 1] = [("block_sparse_moe", "mlp")];

/// `name` with the first renamed module ([`MODULE_RENAMES`]) in its runtime form.
pub fn runtime_name(name: &str) -> Option<String> {
    MODULE_RENAMES.iter().find_map(|(checkpoint, runtime)| {
        let from = format!(".{checkpoint}.");
        name.contains(&from)
            .then(|| name.replacen(&from, &format!(".{runtime}."), 1))
    })
}

/// How one model family names the pieces of a fused expert layer in its checkpoint
/// (transformers 5's `conversion_mapping.py`; see `load::experts`).
pub struct ExpertTemplate {
    /// Whether the layer's module has a runtime name of its own ([`MODULE_RENAMES`]:
    /// Mixtral's `block_sparse_moe` is `mlp`).
    pub renamed: bool,
    pub gate: &'static str,
    pub up: &'static str,
    pub down: &'static str,
}

/// `qwen2_moe` (and the model types that reuse it, e.g. `qwen3_moe`), `mixtral`,
/// `lfm2_moe` (Mixtral's piece names under a module that keeps its name), then
/// `dots3_note_vision_encoder` (`fc1` gate, `fc3` up, `fc2` down).
pub const EXPERT_TEMPLATES: [ExpertTemplate; 4] = [
    ExpertTemplate {
        renamed: false,
        gate: "gate_proj",
        up: "up_proj",
        down: "down_proj",
    },
    ExpertTemplate {
        renamed: true,
        gate: "w1",
        up: "w3",
        down: "w2",
    },
    ExpertTemplate {
        renamed: false,
        gate: "w1",
        up: "w3",
        down: "w2",
    },
    ExpertTemplate {
        renamed: false,
        gate: "fc1",
        up: "fc3",
        down: "fc2",
    },
];

/// Which piece of a fused expert parameter a per-expert checkpoint tensor is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertPiece {
    /// The fused runtime parameter: `P.experts.gate_up_proj` or `P.experts.down_proj`.
    pub fused: String,
    pub expert: u64,
    /// 0 gate, 1 up (the halves of `gate_up_proj`, in that order), 2 down.
    pub part: u8,
}

/// `P.experts.{e}.gate_proj.weight` (or Mixtral's `block_sparse_moe…w1.weight`) as a
/// piece of the fused parameter transformers 5 loads it into. Only the name is read:
/// whether a model is loaded fused is the architecture's to say (`model::arch`).
pub fn expert_piece(name: &str) -> Option<ExpertPiece> {
    let rest = name.strip_suffix(".weight")?;
    let (rest, part_name) = rest.rsplit_once('.')?;
    let (rest, expert) = rest.rsplit_once('.')?;
    let expert: u64 = expert.parse().ok()?;
    let prefix = rest.strip_suffix(".experts")?;
    EXPERT_TEMPLATES.iter().find_map(|t| {
        let part = [t.gate, t.up, t.down]
            .iter()
            .position(|p| *p == part_name)?;
        let runtime_prefix = if t.renamed {
            MODULE_RENAMES.iter().find_map(|(checkpoint, runtime)| {
                prefix
                    .strip_suffix(&format!(".{checkpoint}"))
                    .map(|base| format!("{base}.{runtime}"))
            })?
        } else {
            prefix.to_owned()
        };
        let fused = if part == 2 {
            "down_proj"
        } else {
            "gate_up_proj"
        };
        Some(ExpertPiece {
            fused: format!("{runtime_prefix}.experts.{fused}"),
            expert,
            part: part as u8,
        })
    })
}

/// The input embedding among `names`: a name ending as an embedding does
/// ([`EMBEDDING_SUFFIXES`], the commoner ending first, then the shorter name), never a
/// head. The tensor a tied head shares.
pub fn input_embedding<'a>(names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    names
        .filter(|n| EMBEDDING_SUFFIXES.iter().any(|s| n.ends_with(s)) && !HEAD_NAMES.contains(n))
        .min_by_key(|n| {
            (
                EMBEDDING_SUFFIXES.iter().position(|s| n.ends_with(s)),
                n.len(),
            )
        })
}

/// Compares two dotted names in module order.
pub fn module_order(a: &str, b: &str) -> Ordering {
    // Whole components the two share compare equal: start at the component where they
    // first differ (neighbours in a sorted list share most of their name, and the
    // loader compares hundreds of thousands of them).
    let same = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    if same == a.len() && same == b.len() {
        return Ordering::Equal;
    }
    let start = a.as_bytes()[..same]
        .iter()
        .rposition(|&c| c == b'.')
        .map_or(0, |dot| dot + 1);
    let mut left = a[start..].split('.');
    let mut right = b[start..].split('.');
    loop {
        match (left.next(), right.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => match compare_component(x, y) {
                Ordering::Equal => {}
                other => return other,
            },
        }
    }
}

/// A precomputed sort key for [`module_order`]: sorting 100,000 names with cached keys
/// splits each name once instead of once per comparison.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OrderKey<'a>(Vec<Component<'a>>);

/// Numbered components sort before named ones, numbers by value, then by text.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Component<'a> {
    Index(u128, &'a str),
    Name(&'a str),
}

pub fn order_key(name: &str) -> OrderKey<'_> {
    OrderKey(
        name.split('.')
            .map(|c| match as_index(c) {
                Some(i) => Component::Index(i, c),
                None => Component::Name(c),
            })
            .collect(),
    )
}

fn compare_component(x: &str, y: &str) -> Ordering {
    match (as_index(x), as_index(y)) {
        (Some(i), Some(j)) => i.cmp(&j).then_with(|| x.cmp(y)),
        // Numbered children (layers) come before named siblings at the same level.
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => x.cmp(y),
    }
}

/// A component made only of ASCII digits, read as a number (`"007"` is 7).
fn as_index(component: &str) -> Option<u128> {
    if component.is_empty() || !component.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    component.parse().ok()
}

/// True when `prefix` is `name` itself or a whole-component prefix of it:
/// `model.layers.1` covers `model.layers.1.mlp.weight` but not `model.layers.10.mlp`.
/// The empty prefix covers everything.
pub fn covers(prefix: &str, name: &str) -> bool {
    prefix.is_empty()
        || name == prefix
        || (name.len() > prefix.len()
            && name.starts_with(prefix)
            && name.as_bytes()[prefix.len()] == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The comparison component by component from the first, as module order is
    /// defined; `module_order` skips the components two names share.
    fn order_from_the_start(a: &str, b: &str) -> Ordering {
        let mut left = a.split('.');
        let mut right = b.split('.');
        loop {
            match (left.next(), right.next()) {
                (None, None) => return Ordering::Equal,
                (None, Some(_)) => return Ordering::Less,
                (Some(_), None) => return Ordering::Greater,
                (Some(x), Some(y)) => match compare_component(x, y) {
                    Ordering::Equal => {}
                    other => return other,
                },
            }
        }
    }

    #[test]
    fn skipping_the_shared_components_changes_no_comparison() {
        let names = [
            "",
            "a",
            "a.b",
            "a.bc",
            "a.b.c",
            "a.b.",
            "a..b",
            "a.1",
            "a.10",
            "a.10.x",
            "a.9",
            "a.9.x",
            "a.09",
            "a.1x",
            "a.x1",
            "model.layers.1.mlp",
            "model.layers.10.mlp",
            "model.layers.1",
            "model.layers.1.mlp.experts.2.w",
            "model.layers.1.mlp.experts.10.w",
            "model.layers.1.mlp.experts.2",
            "model.layers.1.mlpx",
            "model.norm",
            ".a",
            "a.",
        ];
        for a in names {
            for b in names {
                assert_eq!(
                    module_order(a, b),
                    order_from_the_start(a, b),
                    "`{a}` vs `{b}`"
                );
            }
        }
    }

    #[test]
    fn numeric_components_compare_as_numbers() {
        let mut names = vec![
            "model.layers.10.mlp.weight",
            "model.layers.2.mlp.weight",
            "model.layers.2.attn.weight",
            "lm_head.weight",
            "model.norm.weight",
            "model.embed_tokens.weight",
            "model.layers.1.mlp.weight",
        ];
        names.sort_by(|a, b| module_order(a, b));
        assert_eq!(
            names,
            vec![
                "lm_head.weight",
                "model.embed_tokens.weight",
                "model.layers.1.mlp.weight",
                "model.layers.2.attn.weight",
                "model.layers.2.mlp.weight",
                "model.layers.10.mlp.weight",
                "model.norm.weight",
            ]
        );
    }

    #[test]
    fn cached_keys_agree_with_the_comparator() {
        let names = [
            "a.10.b", "a.2.b", "a.b", "a", "a.01", "a.1", "b.0", "a.2", "a.2.a",
        ];
        for x in names {
            for y in names {
                assert_eq!(
                    order_key(x).cmp(&order_key(y)),
                    module_order(x, y),
                    "{x} vs {y}"
                );
            }
        }
    }

    #[test]
    fn parent_before_child_and_total_order() {
        assert_eq!(module_order("a.b", "a.b.c"), Ordering::Less);
        assert_eq!(module_order("a.01", "a.1"), Ordering::Less);
        assert_eq!(module_order("a.1", "a.1"), Ordering::Equal);
    }

    #[test]
    fn prefix_traps() {
        assert!(covers("model.layers.1", "model.layers.1.mlp.weight"));
        assert!(covers("model.layers.1", "model.layers.1"));
        assert!(!covers("model.layers.1", "model.layers.10.mlp.weight"));
        assert!(!covers("model.layers.1", "model.layers.1x.weight"));
        assert!(!covers("lm_head.weight", "lm_head"));
        assert!(covers("", "anything.at.all"));
    }
}
