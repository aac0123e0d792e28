//! Search by name: matches as you type, n / N to step through them.

use super::{Action, App, Mode, Tone, edit_text, is_edit};

impl App {
    pub(super) fn search_input(&mut self, action: Action) {
        let Mode::Search(query) = &mut self.mode else {
            return;
        };
        match action {
            ref edit if is_edit(edit) => self.cursor = edit_text(query, self.cursor, edit),
            Action::Submit => {
                let q = std::mem::take(query);
                self.mode = Mode::Browse;
                self.search_origin = None;
                if !q.is_empty() {
                    self.last_search = q;
                }
                let n = self.matches.len();
                if n > 0 {
                    self.say(
                        format!(
                            "{} for `{}`: n / N to step",
                            devmap_core::text::count(n, "match", "matches"),
                            self.last_search
                        ),
                        Tone::Info,
                    );
                } else if !self.last_search.is_empty() {
                    self.say(
                        format!("no name contains `{}`", self.last_search),
                        Tone::Bad,
                    );
                }
                return;
            }
            Action::Close => {
                self.mode = Mode::Browse;
                if let Some(rows) = self.search_origin.take() {
                    self.rows = rows;
                }
                return;
            }
            _ => return,
        }
        let q = query.clone();
        self.find_matches(&q);
        if let Some(&first) = self
            .matches
            .iter()
            .find(|&&m| Some(m) >= self.selected())
            .or(self.matches.first())
        {
            self.rows.reveal(&self.tree, first);
        }
    }

    /// Nodes whose dotted name contains `query` (case-insensitive), in tree order. A
    /// match inside a name selects the module that ends with the matched part
    /// (`layers.5.mlp` selects `model.layers.5.mlp`).
    pub(super) fn find_matches(&mut self, query: &str) {
        self.matches.clear();
        if query.is_empty() {
            return;
        }
        let needle = query.as_bytes();
        for (id, t) in self.ckpt.tensors().iter().enumerate() {
            let name = t.name.as_ref();
            // ASCII case-insensitive, without allocating per name: 100k names are
            // searched on every keystroke.
            let Some(at) = name
                .as_bytes()
                .windows(needle.len())
                .position(|w| w.eq_ignore_ascii_case(needle))
            else {
                continue;
            };
            let end = at + needle.len();
            // Components after the one the match ends in.
            let below = name[end..].matches('.').count();
            let mut node = self.tree.node_of(id);
            for _ in 0..below {
                node = self.tree.nodes[node].parent().unwrap_or(node);
            }
            // A quantized weight's scales are found as the weight, whose row shows them.
            self.matches
                .push(self.tree.folded_into(node).unwrap_or(node));
        }
        self.matches.sort_unstable();
        self.matches.dedup();
    }

    pub(super) fn step_match(&mut self, dir: isize) {
        if self.matches.is_empty() {
            if !self.last_search.is_empty() {
                let q = self.last_search.clone();
                self.find_matches(&q);
            }
            if self.matches.is_empty() {
                // `n` after a search that found nothing repeats it, and says so.
                let said = if self.last_search.is_empty() {
                    "no search yet: press / to search".to_owned()
                } else {
                    format!("still no name contains `{}`", self.last_search)
                };
                self.say(said, Tone::Info);
                return;
            }
        }
        let current = self.selected().unwrap_or(0);
        let next = if dir > 0 {
            self.matches
                .iter()
                .find(|&&m| m > current)
                .or(self.matches.first())
        } else {
            self.matches
                .iter()
                .rev()
                .find(|&&m| m < current)
                .or(self.matches.last())
        };
        if let Some(&n) = next {
            self.rows.reveal(&self.tree, n);
        }
        if let Some((at, of)) = self.match_position() {
            let q = self.last_search.clone();
            self.say(format!("match {at}/{of} for `{q}`"), Tone::Info);
        }
    }

    /// Which match is selected, counted from 1, and how many there are.
    pub fn match_position(&self) -> Option<(usize, usize)> {
        let selected = self.selected()?;
        let at = self.matches.binary_search(&selected).ok()?;
        Some((at + 1, self.matches.len()))
    }
}
