//! The module tree as accelerate walks it: children in definition order, parameters
//! before submodules, tied parameters counted once, and which modules are never split.
//!
//! A checkpoint records no definition order (headers and indexes are sorted by name).
//! For an architecture in devmap's table (`model::arch`, generated from transformers'
//! classes) the order, the no-split modules and the modules with parameter-less
//! children are transformers' own. Otherwise, and for names the table lacks, children
//! are ordered by role, the way Hugging Face models define them: embeddings, then the
//! repeated blocks, then other modules by name, then the final norm, then output heads;
//! inside a block (split only when the user lifts the no-split rule) attention comes
//! before the MLP.

use std::collections::{HashMap, HashSet};

use crate::model::arch::{Arch, Cursor};
use crate::model::checkpoint::{Checkpoint, Tensor};
use crate::model::tree::{ModuleTree, NodeId};
use crate::types::DType;

#[derive(Debug, Clone, PartialEq)]
pub struct PlanNode {
    pub name: String,
    pub is_param: bool,
    /// Bytes, counting each tie group once (where the walk meets it first).
    pub size: u64,
    /// Parameters first, then submodules, in definition order.
    pub children: Vec<usize>,
    pub no_split: bool,
    /// A non-persistent buffer (`inv_freq`): counted in its module's size, not walked
    /// on its own, except at the root (accelerate's walk meets the model's own buffers
    /// last, after its children).
    pub is_buffer: bool,
    /// The module has child modules without parameters (`act_fn`), which the tree
    /// leaves out: accelerate still treats it as having submodules (it can be split
    /// into its parameters, and is not a "layer" of its own).
    pub bare_children: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlanTree {
    pub nodes: Vec<PlanNode>,
    by_name: HashMap<String, usize>,
    /// Whether the architecture table ordered it (else the name heuristics did).
    pub from_table: bool,
}

const EMBEDDINGS: [&str; 6] = [
    "wte",
    "wpe",
    "word_embeddings",
    "position_embeddings",
    "token_type_embeddings",
    "shared",
];
const FINAL_NORMS: [&str; 6] = [
    "norm",
    "ln_f",
    "final_layernorm",
    "norm_f",
    "final_layer_norm",
    "ln_out",
];
const HEADS: [&str; 6] = [
    "lm_head",
    "embed_out",
    "output",
    "score",
    "classifier",
    "head",
];
const BLOCK_CONTAINERS: [&str; 5] = ["layers", "h", "blocks", "layer", "block"];

/// Names in the order each model family defines them, at every level that can be
/// split: the block's members, and the projections inside attention and MLP. The
/// family comes from `config.json`'s `architectures`; Llama's order (shared by Mistral,
/// Qwen2 and most decoders since) is the default. Checked against accelerate in
/// tests/python/accelerate_plan.py.
const LLAMA_ORDER: &[&str] = &[
    "embed_tokens",
    "self_attn",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "mlp",
    "gate_proj",
    "up_proj",
    "down_proj",
    "input_layernorm",
    "post_attention_layernorm",
];
const GPT2_ORDER: &[&str] = &[
    "wte", "wpe", "ln_1", "attn", "c_attn", "ln_2", "mlp", "c_fc", "c_proj",
];
const GPT_NEOX_ORDER: &[&str] = &[
    "embed_in",
    "input_layernorm",
    "post_attention_layernorm",
    "attention",
    "query_key_value",
    "dense",
    "mlp",
    "dense_h_to_4h",
    "dense_4h_to_h",
];

/// The definition order for a model's architecture names.
pub fn family_order(architectures: &[String]) -> &'static [&'static str] {
    if architectures.iter().any(|a| a.starts_with("GPT2")) {
        GPT2_ORDER
    } else if architectures.iter().any(|a| a.starts_with("GPTNeoX")) {
        GPT_NEOX_ORDER
    } else {
        LLAMA_ORDER
    }
}

/// Where a child goes among its siblings: its role, then its place in the family's
/// definition order (names it does not list come last, by name).
fn rank(tree: &ModuleTree, id: NodeId, order: &[&str]) -> (u8, usize) {
    let name = tree.nodes[id].name.as_ref();
    let known = order.iter().position(|k| *k == name).unwrap_or(usize::MAX);
    (role(tree, id), known)
}

fn role(tree: &ModuleTree, id: NodeId) -> u8 {
    let node = &tree.nodes[id];
    let name = node.name.as_ref();
    let numbered = tree.children(id).next().is_some()
        && tree
            .children(id)
            .all(|c| tree.nodes[c].name.bytes().all(|b| b.is_ascii_digit()));
    if HEADS.contains(&name) {
        6
    } else if EMBEDDINGS.contains(&name) || (name.contains("embed") && name != "embed_out") {
        0
    } else if numbered {
        1
    } else if FINAL_NORMS.contains(&name) {
        5
    } else {
        4
    }
}

/// `*` matches one whole name component (`model.layers.*`), or any text inside one
/// (`*.experts.*`, `layers.1*`).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    let p: Vec<&str> = pattern.split('.').collect();
    let n: Vec<&str> = name.split('.').collect();
    p.len() == n.len() && p.iter().zip(&n).all(|(p, n)| glob(p, n))
}

fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            let Some(rest) = text.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len()).any(|i| rest.is_char_boundary(i) && glob(tail, &rest[i..]))
        }
    }
}

/// The default no-split rule: the repeated decoder block, `…layers.N`, `…h.N`,
/// `…blocks.N`.
fn is_repeated_block(tree: &ModuleTree, id: NodeId) -> bool {
    let node = &tree.nodes[id];
    node.tensor().is_none()
        && node.name.bytes().all(|b| b.is_ascii_digit())
        && node
            .parent()
            .is_some_and(|p| BLOCK_CONTAINERS.contains(&tree.nodes[p].name.as_ref()))
}

/// What [`PlanTree::build`] walks with, and what it has built so far.
struct Builder<'a> {
    tree: &'a ModuleTree,
    ckpt: &'a Checkpoint,
    buffers: &'a HashSet<std::sync::Arc<str>>,
    /// Buffers made in float32 whatever the load dtype.
    fixed: &'a HashSet<std::sync::Arc<str>>,
    /// The architecture whose keep-in-float32 rules apply.
    kept_fp32: Option<&'a Arch>,
    order: &'a [&'a str],
    dtype: Option<DType>,
    no_split: &'a [String],
    nodes: Vec<PlanNode>,
    by_name: HashMap<String, usize>,
    counted_ties: HashSet<usize>,
}

impl Builder<'_> {
    /// Adds node `id` and, depth-first in definition order, everything under it (so
    /// tie dedup meets members in the order `named_parameters` would). `arch` is the
    /// architecture and this node's entry in it (if it has one). Returns its index.
    fn visit(&mut self, arch: Option<(&Arch, Option<Cursor>)>, id: NodeId) -> usize {
        let tree = self.tree;
        let name = tree.full_name(id);
        let tensor = tree.nodes[id].tensor();
        let is_param = tensor.is_some();
        let is_buffer =
            tensor.is_some_and(|t| self.buffers.contains(&*self.ckpt.tensors()[t].name));
        let index = self.nodes.len();
        let split_rule = match (self.no_split, arch) {
            ([], Some((arch, Some(at)))) => arch.no_split_at(at),
            // A module the table does not know follows the heuristic.
            ([], Some((_, None)) | None) => is_repeated_block(tree, id),
            ([only], _) if only == "none" => false,
            (patterns, _) => patterns.iter().any(|p| pattern_matches(p, &name)),
        };
        let bare_children =
            !is_param && arch.is_some_and(|(a, at)| at.is_some_and(|at| a.bare_children_at(at)));
        self.nodes.push(PlanNode {
            name: name.clone(),
            is_param,
            size: 0,
            children: Vec::new(),
            no_split: split_rule && !is_param,
            is_buffer,
            bare_children,
        });
        self.by_name.insert(name, index);
        if let Some(t) = tree.nodes[id].tensor() {
            let first_of_group = match self.ckpt.tie_group(t) {
                Some(g) => self.counted_ties.insert(g.kept()),
                None => true,
            };
            self.nodes[index].size = if first_of_group {
                let tensor = &self.ckpt.tensors()[t];
                let kept = |dtype| {
                    self.kept_fp32
                        .is_some_and(|a| a.kept_in_fp32(&tensor.name, dtype).is_some())
                };
                let held = match self.dtype {
                    _ if self.fixed.contains(&*tensor.name) => Held::AsMade,
                    Some(dtype) if kept(dtype) => Held::Float32,
                    _ => Held::AsLoaded,
                };
                loaded_bytes(tensor, self.dtype, held)
            } else {
                0
            };
            return index;
        }
        let mut kids: Vec<NodeId> = tree.children(id).collect();
        // An architecture in the table: accelerate's own walk order, names it does not
        // have after. Otherwise parameters first (weight before bias), then modules by
        // role; the sort is stable, so module order breaks ties within a role.
        let step = |c: NodeId| -> Option<Cursor> {
            let (a, at) = arch?;
            a.step(at?, &tree.nodes[c].name)
        };
        let order = self.order;
        kids.sort_by_cached_key(|&c| {
            let n = &tree.nodes[c];
            let known = arch.zip(step(c)).map(|((a, _), at)| a.position_at(at));
            let heuristic = if n.tensor().is_some() {
                (0u8, (u8::from(&*n.name != "weight"), 0))
            } else {
                (1, rank(tree, c, order))
            };
            (known.unwrap_or(u32::MAX), heuristic)
        });
        let mut children = Vec::with_capacity(kids.len());
        let mut size = 0;
        for &c in &kids {
            let ci = self.visit(arch.map(|(a, _)| (a, step(c))), c);
            size += self.nodes[ci].size;
            children.push(ci);
        }
        // The modules without tensors the walk meets too (dropouts, activations), each
        // at its place among its siblings: transformers names them in the map where it
        // splits their parent.
        if let Some((a, Some(at))) = arch {
            let present: HashSet<&str> = kids.iter().map(|&c| &*tree.nodes[c].name).collect();
            let parent = self.nodes[index].name.clone();
            let empty: Vec<(String, Cursor)> = a
                .parameterless_children(at)
                .into_iter()
                .filter(|(component, _)| !present.contains(component))
                .map(|(component, cursor)| match parent.as_str() {
                    "" => (component.to_owned(), cursor),
                    _ => (format!("{parent}.{component}"), cursor),
                })
                .collect();
            if !empty.is_empty() {
                let mut placed: Vec<(u32, usize)> = kids
                    .iter()
                    .zip(&children)
                    .map(|(&c, &ci)| (step(c).map_or(u32::MAX, |at| a.position_at(at)), ci))
                    .collect();
                for (full, cursor) in empty {
                    let ei = self.nodes.len();
                    self.nodes.push(PlanNode {
                        name: full.clone(),
                        is_param: false,
                        size: 0,
                        children: Vec::new(),
                        no_split: false,
                        is_buffer: false,
                        bare_children: false,
                    });
                    self.by_name.insert(full, ei);
                    placed.push((a.position_at(cursor), ei));
                }
                placed.sort_by_key(|(position, _)| *position);
                children = placed.into_iter().map(|(_, ci)| ci).collect();
            }
        }
        self.nodes[index].children = children;
        self.nodes[index].size = size;
        index
    }
}

impl PlanTree {
    pub const ROOT: usize = 0;

    /// `dtype`: the type the model will be loaded as (`dtype=`), the size of its
    /// floating-point tensors but those held in float32 (see [`loaded_bytes`]).
    /// `buffers`: which of the tensors are non-persistent buffers, and `fixed` which of
    /// those keep the dtype they are made in (`plan::view`).
    pub fn build(
        ckpt: &Checkpoint,
        (buffers, fixed): (&HashSet<std::sync::Arc<str>>, &HashSet<std::sync::Arc<str>>),
        no_split: &[String],
        dtype: Option<DType>,
    ) -> PlanTree {
        let tree = ModuleTree::build(ckpt);
        let order = family_order(&ckpt.config.architectures);
        // The table's entry, if the checkpoint's names are the ones it describes (a
        // checkpoint under other top-level names falls back to the heuristics).
        let arch = crate::model::arch::lookup(&ckpt.config.architectures).filter(|a| {
            tree.children(ModuleTree::ROOT)
                .any(|c| a.step(Arch::ROOT, &tree.nodes[c].name).is_some())
        });
        let mut builder = Builder {
            tree: &tree,
            ckpt,
            buffers,
            fixed,
            kept_fp32: crate::model::arch::lookup(&ckpt.config.architectures),
            order,
            dtype,
            no_split,
            nodes: Vec::with_capacity(tree.len()),
            by_name: HashMap::with_capacity(tree.len()),
            counted_ties: HashSet::new(),
        };
        builder.visit(arch.map(|a| (a, Some(Arch::ROOT))), ModuleTree::ROOT);
        let Builder { nodes, by_name, .. } = builder;
        PlanTree {
            nodes,
            by_name,
            from_table: arch.is_some(),
        }
    }

    /// What accelerate walks `id` into when it splits it (or, for the root, starts
    /// with): its parameters and submodules in order; a split module's own buffers are
    /// dropped, the model's own come last.
    pub fn children_in_order(&self, id: usize) -> Vec<usize> {
        let kids = &self.nodes[id].children;
        let walked = kids.iter().copied().filter(|&c| !self.nodes[c].is_buffer);
        if id == Self::ROOT {
            let own = kids.iter().copied().filter(|&c| self.nodes[c].is_buffer);
            walked.chain(own).collect()
        } else {
            walked.collect()
        }
    }

    /// The size accelerate's `module_sizes` gives a name (0 for unknown names).
    pub fn size_of(&self, name: &str) -> u64 {
        self.by_name.get(name).map_or(0, |&i| self.nodes[i].size)
    }

    /// A module accelerate would split: it has submodules and is not no-split.
    pub fn splittable(&self, id: usize) -> bool {
        let n = &self.nodes[id];
        !n.is_param
            && !n.no_split
            && (n.bare_children || n.children.iter().any(|&c| !self.nodes[c].is_param))
    }

    /// What transformers' `get_balanced_memory` sizes its margin by: the larger of the
    /// largest no-split module and the largest sum of one module's own tensors (its
    /// parameters and buffers, not its submodules'), with a name for it.
    pub fn largest_unit(&self) -> (u64, String) {
        let mut best = (0u64, String::new());
        // The root's own tensors are no module's (transformers counts names with a
        // dot only).
        for n in self.nodes.iter().skip(1) {
            if n.is_param {
                continue;
            }
            let own: u64 = n
                .children
                .iter()
                .filter(|&&c| self.nodes[c].is_param)
                .map(|&c| self.nodes[c].size)
                .sum();
            let (size, what) = if n.no_split && n.size >= own {
                (n.size, "the largest no-split module")
            } else {
                (own, "the largest module's own tensors")
            };
            if size > best.0 {
                best = (size, format!("{what}, {}", n.name));
            }
        }
        best
    }

    /// accelerate's `get_max_layer_size`: the largest "layer" (a module without
    /// submodules, a no-split module, or a bare parameter) among `start` and below.
    pub fn max_layer(&self, start: impl Iterator<Item = usize>) -> (u64, Vec<String>) {
        let mut stack: Vec<usize> = start.collect();
        stack.reverse();
        let mut best = 0u64;
        let mut names = Vec::new();
        while let Some(id) = stack.pop() {
            let n = &self.nodes[id];
            let submodules: Vec<usize> = n
                .children
                .iter()
                .copied()
                .filter(|&c| !self.nodes[c].is_param)
                .collect();
            // A module whose only submodules hold no parameters is no layer: accelerate
            // looks at its (empty) submodules and never at its own parameters.
            if n.is_param || (submodules.is_empty() && !n.bare_children) || n.no_split {
                if n.size > best {
                    best = n.size;
                    names = vec![n.name.clone()];
                } else if n.size == best {
                    names.push(n.name.clone());
                }
            } else {
                for c in submodules.into_iter().rev() {
                    stack.push(c);
                }
            }
        }
        (best, names)
    }
}

/// How the loaded model holds a floating tensor, for [`loaded_bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// In the dtype the model is loaded in.
    AsLoaded,
    /// In float32: a module transformers keeps in float32 (`_keep_in_fp32_modules`).
    Float32,
    /// In the dtype it is made in, whatever the load dtype (rotary `inv_freq`).
    AsMade,
}

/// A tensor's size as transformers' `compute_module_sizes` counts it on the model it
/// builds to plan (`_get_device_map`, in `from_pretrained`): each tensor in the dtype
/// the model holds it in, `numel × element_size`. Loaded as `dtype`, a floating tensor
/// takes `dtype`'s size, larger or smaller than stored, unless [`Held`] says otherwise;
/// integers and booleans keep theirs (a boolean is one byte, torch's element size).
/// `None`: the model is loaded as stored.
pub fn loaded_bytes(t: &Tensor, dtype: Option<DType>, held: Held) -> u64 {
    let Some(target) = dtype.filter(|_| crate::save::cast::is_floating(t.dtype)) else {
        return t.bytes();
    };
    match held {
        Held::AsLoaded => t.numel().saturating_mul(target.size()),
        Held::Float32 => t.numel().saturating_mul(DType::F32.size()),
        Held::AsMade => t.bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(pattern_matches("model.layers.*", "model.layers.12"));
        assert!(!pattern_matches("model.layers.*", "model.layers.12.mlp"));
        assert!(pattern_matches("*.experts.*", "mlp.experts.3"));
        assert!(pattern_matches("layers.1*", "layers.17"));
        assert!(!pattern_matches("layers.1*", "layers.27"));
    }
}
