//! The module tree: an arena built from dotted tensor names, in module order.
//!
//! Nodes are numbered in pre-order (a parent before its children, siblings in module
//! order), so a flat walk of the arena is the fully expanded tree.

use super::checkpoint::{Checkpoint, TensorId};
use std::collections::HashMap;
use std::sync::Arc;

use crate::types::placement::Placement;

pub type NodeId = usize;

/// Bytes per device, sorted by device: inline for a node on one device (most nodes).
pub type Split = smallvec::SmallVec<[(Placement, u64); 1]>;

/// Levels of modules the tree shows; deeper components of a name are kept together in
/// one leaf (named with their dots). Real models are a few levels deep; a hostile name
/// of four million dots would otherwise cost four million nodes.
pub const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The last name component (`"up_proj"`); empty for the root. Shared between
    /// nodes of the same name (`weight`, `bias`, `w17`): one allocation per distinct
    /// component, not one per node; short ones that do not repeat sit inline.
    pub name: Name,
    /// The parent's id; [`NONE`] for the root (see [`Node::parent`]). 32 bits: a tree
    /// of a million tensors is two million nodes, and every map edit copies it.
    parent: u32,
    /// The next child of the same parent; [`NONE`] for the last. A node's first child
    /// is the node after it (pre-order), so these links are the whole child list at
    /// 4 bytes a node (see [`ModuleTree::children`]).
    next_sibling: u32,
    /// The tensor whose full name ends at this node; [`NONE`] for none (see
    /// [`Node::tensor`]).
    tensor: u32,
    pub depth: u16,
    pub params: u64,
    pub tensors: u32,
    /// Bytes per device under this node, sorted by device (one device inline).
    pub split: Split,
    /// Whether a tied tensor is at or under this node.
    pub has_tie: bool,
}

/// No node, no tensor.
const NONE: u32 = u32::MAX;

/// A node's name: shared with every node of the same name, or, for a short name that
/// rarely repeats (the index in `t.123456.w`), held inline with no allocation.
#[derive(Clone)]
pub enum Name {
    /// A thin pointer (`Arc<String>`, not the fat `Arc<str>`), so a name is 16 bytes:
    /// two million of them in a million-tensor tree.
    Shared(Arc<String>),
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
}

/// The longest name held inline.
const INLINE: usize = 14;

impl Name {
    /// Inline when `text` fits, shared otherwise.
    fn new(text: &str) -> Name {
        match u8::try_from(text.len()) {
            Ok(len) if text.len() <= INLINE => {
                let mut bytes = [0u8; INLINE];
                bytes[..text.len()].copy_from_slice(text.as_bytes());
                Name::Inline { len, bytes }
            }
            _ => Name::Shared(Arc::new(text.to_owned())),
        }
    }
}

impl std::ops::Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Name::Shared(s) => s,
            // Copied from a `&str` whole: the first `len` bytes are UTF-8.
            Name::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
        }
    }
}

/// The same text, however it is held.
impl PartialEq for Name {
    fn eq(&self, other: &Name) -> bool {
        **self == **other
    }
}

impl Eq for Name {}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self
    }
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

impl Node {
    /// Bytes under this node: the sum of its split (so not kept twice).
    pub fn bytes(&self) -> u64 {
        self.split.iter().map(|(_, b)| b).sum()
    }

    /// The parent; `None` for the root.
    pub fn parent(&self) -> Option<NodeId> {
        (self.parent != NONE).then_some(self.parent as NodeId)
    }

    /// The tensor whose full name ends at this node, if one does.
    pub fn tensor(&self) -> Option<TensorId> {
        (self.tensor != NONE).then_some(self.tensor as TensorId)
    }

    /// The device, when everything under this node is on one.
    pub fn single_placement(&self) -> Option<Placement> {
        if let [(p, _)] = self.split.as_slice() {
            Some(*p)
        } else {
            None
        }
    }
}

/// The children of a node ([`ModuleTree::children`]), following the sibling links.
pub struct Children<'t> {
    tree: &'t ModuleTree,
    next: Option<NodeId>,
}

impl Iterator for Children<'_> {
    type Item = NodeId;

    fn next(&mut self) -> Option<NodeId> {
        let at = self.next?;
        let link = self.tree.nodes[at].next_sibling;
        self.next = (link != NONE).then_some(link as NodeId);
        Some(at)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModuleTree {
    pub nodes: Vec<Node>,
    /// The node of each tensor, by tensor id ([`ModuleTree::node_of`]), as 32 bits.
    tensor_node: Vec<u32>,
    /// `(scales' node, weight's node)` for the scales of each quantized weight, sorted:
    /// few, so kept apart from the two million nodes of a million-tensor tree.
    folded: Vec<(u32, u32)>,
}

impl ModuleTree {
    pub const ROOT: NodeId = 0;

    pub fn build(ckpt: &Checkpoint) -> ModuleTree {
        // The node count first (the same walk, nothing stored), so the arena is
        // allocated once at its size: growing it by doubling would briefly hold the
        // old and the new copy, a third more at the peak of a million-tensor tree.
        let mut count = 1;
        let mut previous: Vec<&str> = Vec::new();
        for tensor in ckpt.tensors() {
            let mut depth = 0;
            for component in components(&tensor.name) {
                if depth < previous.len() && previous[depth] == component {
                    depth += 1;
                    continue;
                }
                previous.truncate(depth);
                previous.push(component);
                depth += 1;
                count += 1;
            }
            previous.truncate(depth);
        }
        let mut nodes = Vec::with_capacity(count);
        nodes.push(Node {
            name: Name::new(""),
            parent: NONE,
            next_sibling: NONE,
            tensor: NONE,
            depth: 0,
            params: 0,
            tensors: 0,
            split: Split::new(),
            has_tie: false,
        });
        // Tensors are in module order, so names that share their first k components
        // are contiguous: a stack of the current path replaces a (parent, name) map.
        let mut tensor_node = Vec::with_capacity(ckpt.tensors().len());
        let mut path: Vec<(&str, NodeId)> = Vec::new();
        let mut interned: HashMap<&str, Arc<String>> = HashMap::new();
        for (id, tensor) in ckpt.tensors().iter().enumerate() {
            let mut depth = 0;
            for component in components(&tensor.name) {
                if depth < path.len() && path[depth].0 == component {
                    depth += 1;
                    continue;
                }
                let c = nodes.len();
                // The node this one diverges from is its parent's last child so far.
                if let Some(&(_, previous)) = path.get(depth) {
                    nodes[previous].next_sibling = c as u32;
                }
                path.truncate(depth);
                let parent = path.last().map_or(Self::ROOT, |&(_, n)| n);
                // Short names (`weight`, `q_proj`, layer numbers) sit inline. Longer
                // ones repeat (`post_attention_layernorm`): one allocation per
                // distinct name. Large indices rarely repeat, and remembering each
                // would cost more than it saves.
                let large_index =
                    component.len() >= 5 && component.bytes().all(|b| b.is_ascii_digit());
                let name = if component.len() <= INLINE || large_index {
                    Name::new(component)
                } else {
                    Name::Shared(Arc::clone(
                        interned
                            .entry(component)
                            .or_insert_with(|| Arc::new(component.to_owned())),
                    ))
                };
                nodes.push(Node {
                    name,
                    parent: parent as u32,
                    next_sibling: NONE,
                    tensor: NONE,
                    // At most MAX_DEPTH: the components iterator stops there.
                    depth: (depth + 1) as u16,
                    params: 0,
                    tensors: 0,
                    split: Split::new(),
                    has_tie: false,
                });
                path.push((component, c));
                depth += 1;
            }
            path.truncate(depth);
            let at = path.last().map_or(Self::ROOT, |&(_, n)| n);
            nodes[at].tensor = id as u32;
            tensor_node.push(at as u32);
        }
        // A quantized weight's scales are part of it: their node folds into the
        // weight's (a sibling before it in pre-order, so the weight's totals are made
        // after the scales' are added to them).
        let mut folded = Vec::new();
        if ckpt.config.quantization.is_some() {
            for (id, &node) in tensor_node.iter().enumerate() {
                let node = node as NodeId;
                // Only names a scale can have are looked at (a checkpoint of 90,000
                // tensors has a few thousand).
                let name: &str = &ckpt.tensors()[id].name;
                if !["_scale_inv", "_scale", "_scales"]
                    .iter()
                    .any(|s| name.ends_with(s))
                {
                    continue;
                }
                if let Some(crate::model::quantized::QuantizedPart::Scales { of }) =
                    crate::model::quantized::quantized_part(ckpt, id)
                    && let Some(weight) = ckpt.index_of(&of)
                    && (tensor_node[weight] as NodeId) < node
                {
                    folded.push((node as u32, tensor_node[weight]));
                }
            }
        }
        folded.sort_unstable();
        let mut tree = ModuleTree {
            nodes,
            tensor_node,
            folded,
        };
        tree.recompute(ckpt);
        tree
    }

    /// The children of node `id`, in module order.
    pub fn children(&self, id: NodeId) -> Children<'_> {
        let first = self
            .nodes
            .get(id + 1)
            .filter(|n| n.parent() == Some(id))
            .map(|_| id + 1);
        Children {
            tree: self,
            next: first,
        }
    }

    /// The child of node `id` when it has exactly one.
    pub fn only_child(&self, id: NodeId) -> Option<NodeId> {
        let mut children = self.children(id);
        let first = children.next()?;
        children.next().is_none().then_some(first)
    }

    /// The nodes of the tensors `marked` accepts, and every module above them, as one
    /// flag per node (the inspector's filter and its edited-row marks).
    pub fn marked_with_ancestors(&self, mut marked: impl FnMut(TensorId) -> bool) -> Vec<bool> {
        let mut flags = vec![false; self.len()];
        for t in 0..self.tensor_node.len() {
            if marked(t) {
                flags[self.node_of(t)] = true;
            }
        }
        // Pre-order: children come after their parent, so a walk backwards carries a
        // flag up to every module above it.
        for id in (1..flags.len()).rev() {
            if flags[id]
                && let Some(parent) = self.nodes[id].parent()
            {
                flags[parent] = true;
            }
        }
        flags
    }

    /// The node whose full name is tensor `id`'s.
    pub fn node_of(&self, id: TensorId) -> NodeId {
        self.tensor_node[id] as NodeId
    }

    /// The node of the quantized weight whose scales node `id` holds: its row shows
    /// them, and their bytes are counted there.
    pub fn folded_into(&self, id: NodeId) -> Option<NodeId> {
        let at = self
            .folded
            .binary_search_by_key(&id, |&(n, _)| n as NodeId)
            .ok()?;
        Some(self.folded[at].1 as NodeId)
    }

    /// Recomputes sizes and device splits (after the device map changed).
    pub fn recompute(&mut self, ckpt: &Checkpoint) {
        for n in &mut self.nodes {
            n.params = 0;
            n.tensors = 0;
            n.split.clear();
            n.has_tie = false;
        }
        // Pre-order numbering: walking backwards visits children before parents.
        for id in (0..self.nodes.len()).rev() {
            if let Some(t) = self.nodes[id].tensor() {
                let tensor = &ckpt.tensors()[t];
                let into = self.folded_into(id).unwrap_or(id);
                let n = &mut self.nodes[into];
                n.params += super::quantized::values_of(ckpt, t);
                n.tensors += 1;
                add_split(&mut n.split, tensor.placement, tensor.held_bytes());
                n.has_tie |= ckpt.tie_group(t).is_some();
            }
            if let Some(parent) = self.nodes[id].parent() {
                // A parent comes before its children in pre-order, so the two can be
                // borrowed apart without copying the child's split.
                let (before, from_child) = self.nodes.split_at_mut(id);
                let (p, child) = (&mut before[parent], &from_child[0]);
                p.params += child.params;
                p.tensors += child.tensors;
                p.has_tie |= child.has_tie;
                for &(placement, bytes) in &child.split {
                    add_split(&mut p.split, placement, bytes);
                }
            }
        }
        self.count_ties_once(ckpt);
    }

    /// A tied copy on the device of a partner is one tensor in memory (accelerate
    /// counts it once): each module shows what its own tensors hold, and the modules
    /// holding both names count it once, from the first module that holds both up.
    fn count_ties_once(&mut self, ckpt: &Checkpoint) {
        for group in &ckpt.ties {
            for &t in &group.members {
                let Some(partner) = ckpt.counted_with(t) else {
                    continue;
                };
                let tensor = &ckpt.tensors()[t];
                let (bytes, params) = (tensor.held_bytes(), super::quantized::values_of(ckpt, t));
                let top = self.common_ancestor(self.node_of(t), self.node_of(partner));
                let mut at = Some(top);
                while let Some(n) = at {
                    let node = &mut self.nodes[n];
                    node.params = node.params.saturating_sub(params);
                    if let Ok(i) = node
                        .split
                        .binary_search_by_key(&tensor.placement, |(p, _)| *p)
                    {
                        node.split[i].1 = node.split[i].1.saturating_sub(bytes);
                        if node.split[i].1 == 0 {
                            node.split.remove(i);
                        }
                    }
                    at = node.parent();
                }
            }
        }
    }

    /// The deepest node that is `a` or holds it and is `b` or holds it.
    fn common_ancestor(&self, mut a: NodeId, mut b: NodeId) -> NodeId {
        while a != b {
            if self.nodes[a].depth >= self.nodes[b].depth {
                match self.nodes[a].parent() {
                    Some(p) => a = p,
                    None => return a,
                }
            } else {
                match self.nodes[b].parent() {
                    Some(p) => b = p,
                    None => return b,
                }
            }
        }
        a
    }

    /// The dotted name of a node (`model.layers.0.mlp`).
    pub fn full_name(&self, id: NodeId) -> String {
        let mut parts = Vec::new();
        let mut at = Some(id);
        while let Some(n) = at {
            if n != Self::ROOT {
                parts.push(&*self.nodes[n].name);
            }
            at = self.nodes[n].parent();
        }
        parts.reverse();
        parts.join(".")
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.len() <= 1
    }
}

fn add_split(split: &mut Split, placement: Placement, bytes: u64) {
    match split.binary_search_by_key(&placement, |(p, _)| *p) {
        Ok(i) => split[i].1 += bytes,
        Err(i) => split.insert(i, (placement, bytes)),
    }
}

/// The components of `name` as the tree nests them: split at dots, the last one
/// holding everything past [`MAX_DEPTH`] levels.
fn components(name: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(name);
    let mut level = 0;
    std::iter::from_fn(move || {
        let current = rest?;
        level += 1;
        if level == MAX_DEPTH {
            rest = None;
            return Some(current);
        }
        if let Some((head, tail)) = current.split_once('.') {
            rest = Some(tail);
            Some(head)
        } else {
            rest = None;
            Some(current)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_nest_up_to_the_depth_limit_and_keep_the_rest_whole() {
        let shallow: Vec<&str> = components("model.layers.0.weight").collect();
        assert_eq!(shallow, ["model", "layers", "0", "weight"]);
        let deep = (0..100)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(".");
        let parts: Vec<&str> = components(&deep).collect();
        assert_eq!(parts.len(), MAX_DEPTH);
        assert_eq!(parts[MAX_DEPTH - 2], (MAX_DEPTH - 2).to_string());
        // Joined back with dots, the components are the name.
        assert_eq!(parts.join("."), deep);
        let dots = ".".repeat(1000);
        assert_eq!(components(&dots).count(), MAX_DEPTH);
        assert_eq!(components(&dots).collect::<Vec<_>>().join("."), dots);
        assert_eq!(components("").collect::<Vec<_>>(), [""]);
    }
}
#[cfg(test)]
mod size {
    /// A million-tensor tree is two million nodes, copied on every map edit: a field
    /// added carelessly costs 16 MB there (docs/performance.md, "Hostile metadata").
    #[test]
    fn a_node_stays_within_72_bytes() {
        assert!(std::mem::size_of::<super::Node>() <= 72);
        assert_eq!(std::mem::size_of::<super::Name>(), 16);
    }
}
