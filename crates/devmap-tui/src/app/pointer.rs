//! The pointer and the clipboard: the mouse wheel, clicks in the tree, and pasted
//! text, turned into the App's own moves.

use super::{Action, App, Effect, Field, Mode, Tone};

impl App {
    /// A paste goes into the open text field as one edit (line breaks and other
    /// control characters dropped, so a pasted line never submits); outside a field it
    /// is ignored, with a word why.
    pub(super) fn paste(&mut self, text: &str) -> Vec<Effect> {
        let clean: String = text.chars().filter(|c| !c.is_control()).collect();
        let in_field = match &self.mode {
            Mode::Search(_) | Mode::Filter(_) | Mode::Export(_) | Mode::Plan(_) => true,
            Mode::SaveDialog(d) => d.field != Field::Dtype,
            _ => false,
        };
        if !in_field {
            self.say(
                "paste ignored: open a text field first (/ search, s save, w export, p plan)",
                Tone::Info,
            );
            return Vec::new();
        }
        if clean.is_empty() {
            return Vec::new();
        }
        self.handle_in_mode(Action::Paste(clean))
    }

    /// The wheel over Details or Devices scrolls that panel; anywhere else it moves the
    /// tree's selection, three rows a notch.
    pub(super) fn wheel(&mut self, column: u16, row: u16, down: bool) {
        let screen = ratatui::layout::Rect::new(0, 0, self.size.0, self.size.1);
        let areas = self.layout(screen);
        let at = ratatui::layout::Position::new(column, row);
        let notch = |v: u16| {
            if down {
                v.saturating_add(3)
            } else {
                v.saturating_sub(3)
            }
        };
        if areas.details.contains(at) {
            self.details_scroll = notch(self.details_scroll);
        } else if areas.devices.contains(at) {
            self.devices_scroll = notch(self.devices_scroll);
        } else {
            let before = self.rows.selected;
            self.rows.move_by(if down { 3 } else { -3 });
            if self.rows.selected != before {
                self.details_scroll = 0;
            }
        }
    }

    /// A click in the tree: the row under it is selected; clicking the selected row
    /// opens or closes it.
    pub(super) fn click(&mut self, column: u16, row: u16) {
        let screen = ratatui::layout::Rect::new(0, 0, self.size.0, self.size.1);
        let tree = self.layout(screen).tree;
        // Inside the border, below the header line.
        let first = tree.y + 2;
        if column <= tree.x
            || column + 1 >= tree.x + tree.width
            || row < first
            || row + 1 >= tree.y + tree.height
        {
            return;
        }
        let index = self.rows.offset + usize::from(row - first);
        let Some(&id) = self.rows.visible().get(index) else {
            return;
        };
        if index == self.rows.selected {
            if self.rows.has_children(id) {
                let open = self.rows.is_expanded(id);
                self.rows.set_expanded(id, !open);
            }
        } else {
            self.rows.selected = index;
        }
    }
}
