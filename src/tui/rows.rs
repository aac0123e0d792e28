//! The module tree as the screen sees it: a flat list of visible nodes built from
//! expand flags. Expanding or collapsing rebuilds the list by walking the pre-order
//! arena and jumping over closed subtrees; drawing only touches the visible slice.

use crate::model::tree::{ModuleTree, NodeId};

#[derive(Debug, Clone, PartialEq)]
pub struct TreeRows {
    expanded: Vec<bool>,
    /// Nodes never shown: a quantized weight's scales (its row shows them).
    hidden: Vec<bool>,
    /// A filter in place (`f`): only these nodes show, every one of them open.
    filter: Option<Vec<bool>>,
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
        match was {
            Some(k) if self.visible.binary_search(&k).is_ok() => self.select_node(k),
            _ => self.selected = 0,
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
        // `visible` is in pre-order, so node ids are sorted: binary search.
        if let Ok(i) = self.visible.binary_search(&id) {
            self.selected = i;
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
