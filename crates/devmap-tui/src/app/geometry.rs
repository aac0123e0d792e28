//! What the App's panels need room for, and where they are: the save panel's and the
//! Devices panel's lines, each device's total, the zoomed layout, the rows edited.

use super::{App, Focus};
use devmap_core::model::tree::ModuleTree;
use devmap_core::model::tree::NodeId;
use devmap_core::types::placement::Placement;

impl App {
    /// Lines the save panel would like: the heading, the overall bar and one per shard
    /// (or the outcome lines); 0 when there is no save to show.
    pub fn progress_rows(&self) -> usize {
        self.save.as_ref().map_or(0, |s| 2 + s.shards.len().max(2))
    }

    /// Lines the Devices panel shows: one per device.
    pub fn device_rows(&self) -> usize {
        self.device_totals().len()
    }

    /// Bytes per device, for every device that holds weights now or did when the model
    /// opened (a device emptied by edits keeps its row, at 0 B: rows never jump).
    pub fn device_totals(&self) -> Vec<(Placement, u64)> {
        let mut totals: std::collections::BTreeMap<Placement, u64> =
            self.opened_devices.iter().map(|&p| (p, 0)).collect();
        for &(p, bytes) in &self.tree.nodes[ModuleTree::ROOT].split {
            totals.insert(p, bytes);
        }
        totals.into_iter().collect()
    }

    /// Where the panels are on `screen`, with the zoom (`z`) applied.
    pub fn layout(&self, screen: ratatui::layout::Rect) -> crate::layout::Areas {
        use crate::layout::Zoomed;
        let zoomed = self.zoomed.then_some(match self.focus {
            Focus::Tree => Zoomed::Tree,
            Focus::Details => Zoomed::Details,
            Focus::Devices => Zoomed::Devices,
        });
        crate::layout::areas_zoomed(screen, self.progress_rows(), self.device_rows(), zoomed)
    }

    /// Marks the rows whose tensors moved since the model opened (and the modules
    /// above them).
    pub(super) fn mark_edited_rows(&mut self) {
        let tensors = self.ckpt.tensors();
        let moved = |t: usize| self.opened_placements.get(t) != Some(&tensors[t].placement);
        let edited = self.tree.marked_with_ancestors(moved);
        // No move: no list at all (the usual case after an undo back to the start).
        self.edited_nodes = if edited.contains(&true) {
            edited
        } else {
            Vec::new()
        };
    }

    /// Whether row `id` holds tensors moved since the model opened.
    pub fn row_edited(&self, id: NodeId) -> bool {
        self.edited_nodes.get(id).copied().unwrap_or(false)
    }

    pub(super) fn tree_height(&self) -> usize {
        let screen = ratatui::layout::Rect::new(0, 0, self.size.0, self.size.1);
        self.layout(screen).tree_rows
    }
}
