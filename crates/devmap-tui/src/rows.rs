//! The module tree as the screen sees it: a flat list of visible nodes built from
//! expand flags. Expanding or collapsing rebuilds the list by walking the pre-order
//! arena and jumping over closed subtrees; drawing only touches the visible slice.

use devmap_core::model::tree::{ModuleTree, NodeId};

/// The order siblings are listed in (`o` steps through them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sort {
    /// As the checkpoint names them (module order): the model's own order.
    #[default]
    Module,
    /// Largest first.
    Size,
    /// Most parameters first.
    Params,
    /// By name.
    Name,
}

impl Sort {
    #[must_use]
    pub fn next(self) -> Sort {
        match self {
            Sort::Module => Sort::Size,
            Sort::Size => Sort::Params,
            Sort::Params => Sort::Name,
            Sort::Name => Sort::Module,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Sort::Module => "module order",
            Sort::Size => "size",
            Sort::Params => "params",
            Sort::Name => "name",
        }
    }
}

/// The tree walked with each node's children in a [`Sort`]'s order: nodes in that
/// order, and where each one's subtree ends (a subtree stays contiguous).
#[derive(Debug, Clone, PartialEq)]
struct SortedWalk {
    nodes: Vec<NodeId>,
    subtree_end: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TreeRows {
    expanded: Vec<bool>,
    /// Nodes never shown: a quantized weight's scales (its row shows them).
    hidden: Vec<bool>,
    /// A filter in place (`f`): only these nodes show, every one of them open.
    filter: Option<Vec<bool>>,
    sort: Sort,
    /// The walk for `sort` when it is not module order.
    sorted: Option<SortedWalk>,
    /// One past the last node of each node's subtree (pre-order numbering).
    subtree_end: Vec<NodeId>,
    visible: Vec<NodeId>,
    pub selected: usize,
    pub offset: usize,
}

impl TreeRows {
    /// Top-level modules visible, everything closed but the root's children's first
    /// level, like the text report.
    pub fn new(tree: &ModuleTree) -> TreeRows {
        let n = tree.len();
        let mut subtree_end = vec![0; n];
        for id in (0..n).rev() {
            subtree_end[id] = tree
                .children(id)
                .last()
                .map_or(id + 1, |last| subtree_end[last]);
        }
        let mut expanded = vec![false; n];
        expanded[ModuleTree::ROOT] = true;
        let hidden = (0..n).map(|id| tree.folded_into(id).is_some()).collect();
        let mut rows = TreeRows {
            expanded,
            hidden,
            filter: None,
            sort: Sort::Module,
            sorted: None,
            subtree_end,
            visible: Vec::new(),
            selected: 0,
            offset: 0,
        };
        rows.rebuild();
        rows
    }

    fn rebuild(&mut self) {
        self.visible.clear();
        if let Some(walk) = &self.sorted {
            let mut pos = 0;
            while pos < walk.nodes.len() {
                let id = walk.nodes[pos];
                let shown = match &self.filter {
                    Some(keep) => keep[id],
                    None => true,
                };
                if shown && !self.hidden[id] {
                    self.visible.push(id);
                }
                pos = if self.filter.is_some() || self.expanded[id] {
                    pos + 1
                } else {
                    walk.subtree_end[pos]
                };
            }
            self.selected = self.selected.min(self.visible.len().saturating_sub(1));
            return;
        }
        if let Some(keep) = &self.filter {
            // Filtered: what the filter keeps, open, in tree order.
            self.visible
                .extend((1..keep.len()).filter(|&id| keep[id] && !self.hidden[id]));
            self.selected = self.selected.min(self.visible.len().saturating_sub(1));
            return;
        }
        let mut id = 1;
        while id < self.expanded.len() {
            if !self.hidden[id] {
                self.visible.push(id);
            }
            id = if self.expanded[id] {
                id + 1
            } else {
                self.subtree_end[id]
            };
        }
        self.selected = self.selected.min(self.visible.len().saturating_sub(1));
    }

    pub fn visible(&self) -> &[NodeId] {
        &self.visible
    }

    pub fn selected_node(&self) -> Option<NodeId> {
        self.visible.get(self.selected).copied()
    }

    pub fn is_expanded(&self, id: NodeId) -> bool {
        self.expanded[id]
    }

    pub fn has_children(&self, id: NodeId) -> bool {
        self.subtree_end[id] > id + 1
    }

    pub fn set_expanded(&mut self, id: NodeId, open: bool) {
        if self.expanded[id] != open {
            let keep = self.selected_node();
            self.expanded[id] = open;
            self.rebuild();
            if let Some(k) = keep {
                self.select_node(k);
            }
        }
    }

    /// Shows only the nodes `keep` marks (`None`: the tree as its open flags say),
    /// keeping the selection where it still shows.
    pub fn set_filter(&mut self, keep: Option<Vec<bool>>) {
        let was = self.selected_node();
        self.filter = keep;
        self.rebuild();
        match was.and_then(|k| self.position(k)) {
            Some(i) => self.selected = i,
            None => self.selected = 0,
        }
        self.offset = self.offset.min(self.selected);
    }

    /// Whether a filter is in place.
    pub fn filtered(&self) -> bool {
        self.filter.is_some()
    }

    /// Every module open, the selection kept.
    pub fn expand_all(&mut self) {
        let keep = self.selected_node();
        self.expanded.iter_mut().for_each(|e| *e = true);
        self.rebuild();
        if let Some(k) = keep {
            self.select_node(k);
        }
    }

    /// Only the top level shown, as when the model opened with nothing open; the
    /// selection goes to the top-level module it was in.
    pub fn collapse_all(&mut self, tree: &ModuleTree) {
        let mut keep = self.selected_node();
        while let Some(k) = keep
            && let Some(parent) = tree.nodes[k].parent()
            && parent != ModuleTree::ROOT
        {
            keep = Some(parent);
        }
        self.expanded.iter_mut().for_each(|e| *e = false);
        self.expanded[ModuleTree::ROOT] = true;
        self.rebuild();
        if let Some(k) = keep {
            self.select_node(k);
        }
    }

    /// Opens every ancestor of `id` and selects it.
    pub fn reveal(&mut self, tree: &ModuleTree, id: NodeId) {
        let mut at = tree.nodes[id].parent();
        let mut changed = false;
        while let Some(p) = at {
            if !self.expanded[p] {
                self.expanded[p] = true;
                changed = true;
            }
            at = tree.nodes[p].parent();
        }
        if changed {
            self.rebuild();
        }
        self.select_node(id);
    }

    pub fn select_node(&mut self, id: NodeId) {
        if let Some(i) = self.position(id) {
            self.selected = i;
        }
    }

    /// Where node `id` is among the visible rows.
    fn position(&self, id: NodeId) -> Option<usize> {
        if self.sorted.is_some() {
            self.visible.iter().position(|&v| v == id)
        } else {
            // In module order `visible` is in pre-order, so ids are sorted.
            self.visible.binary_search(&id).ok()
        }
    }

    pub fn sort(&self) -> Sort {
        self.sort
    }

    /// Lists siblings in `sort`'s order, the selection kept.
    pub fn set_sort(&mut self, tree: &ModuleTree, sort: Sort) {
        let keep = self.selected_node();
        self.sort = sort;
        self.sorted = (sort != Sort::Module).then(|| sorted_walk(tree, sort));
        self.rebuild();
        if let Some(k) = keep {
            self.select_node(k);
        }
    }

    pub fn move_by(&mut self, delta: isize) {
        if self.visible.is_empty() {
            return;
        }
        let last = self.visible.len() as isize - 1;
        self.selected = (self.selected as isize + delta).clamp(0, last) as usize;
    }

    pub fn select_last(&mut self) {
        self.selected = self.visible.len().saturating_sub(1);
    }

    /// Keeps the selection inside a window of `height` rows.
    pub fn scroll_into_view(&mut self, height: usize) {
        let height = height.max(1);
        if self.selected < self.offset {
            self.offset = self.selected;
        } else if self.selected >= self.offset + height {
            self.offset = self.selected + 1 - height;
        }
        let max_offset = self.visible.len().saturating_sub(height);
        self.offset = self.offset.min(max_offset);
    }
}

/// The tree in pre-order with each node's children in `sort`'s order (ties in module
/// order), and where each subtree ends.
fn sorted_walk(tree: &ModuleTree, sort: Sort) -> SortedWalk {
    let mut nodes = Vec::with_capacity(tree.len());
    let mut subtree_end = vec![0; tree.len()];
    // (node, its position once pushed): children pushed in reverse so they pop in
    // order; a node's end is set when the walk leaves its subtree.
    let mut stack: Vec<(NodeId, bool)> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let mut children: Vec<NodeId> = tree.children(ModuleTree::ROOT).collect();
    order_children(tree, sort, &mut children);
    stack.extend(children.iter().rev().map(|&c| (c, false)));
    while let Some((id, leaving)) = stack.pop() {
        if leaving {
            if let Some(pos) = open.pop() {
                subtree_end[pos] = nodes.len();
            }
            continue;
        }
        open.push(nodes.len());
        nodes.push(id);
        stack.push((id, true));
        let mut children: Vec<NodeId> = tree.children(id).collect();
        order_children(tree, sort, &mut children);
        stack.extend(children.iter().rev().map(|&c| (c, false)));
    }
    subtree_end.truncate(nodes.len());
    SortedWalk { nodes, subtree_end }
}

fn order_children(tree: &ModuleTree, sort: Sort, children: &mut [NodeId]) {
    let node = |id: NodeId| &tree.nodes[id];
    match sort {
        Sort::Module => {}
        Sort::Size => children.sort_by_key(|&c| std::cmp::Reverse(node(c).bytes())),
        Sort::Params => children.sort_by_key(|&c| std::cmp::Reverse(node(c).params)),
        // Numbered siblings (layers) by their number, others by their name.
        Sort::Name => children.sort_by(|&left, &right| {
            let (left, right) = (&*node(left).name, &*node(right).name);
            match (left.parse::<u64>(), right.parse::<u64>()) {
                (Ok(x), Ok(y)) => x.cmp(&y),
                _ => left.cmp(right),
            }
        }),
    }
}
