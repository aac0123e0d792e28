//! Filter mode (`f`): the tree shows only the tensors that match, with the modules that
//! hold them, until the filter is cleared. A filter is words that must all hold:
//! text in the name (case-insensitive), `dev:cpu` (`dev:gpu` for any GPU), `dtype:bf16`,
//! `src:offload` (or `checkpoint`, `adapter`, `pieces`, `tied`, `none`), `tied`.

use super::{Action, App, Mode, Tone, edit_text, is_edit};
use devmap_core::model::checkpoint::{Checkpoint, Source, Tensor};

/// One word of a filter.
#[derive(Debug, Clone, PartialEq)]
enum Word {
    Name(String),
    Device(String),
    Dtype(String),
    Source(String),
    Tied,
}

fn words(query: &str) -> Vec<Word> {
    query
        .split_whitespace()
        .map(|w| {
            let lower = w.to_ascii_lowercase();
            if let Some(d) = lower.strip_prefix("dev:") {
                Word::Device(d.to_owned())
            } else if let Some(d) = lower.strip_prefix("dtype:") {
                Word::Dtype(d.to_owned())
            } else if let Some(s) = lower.strip_prefix("src:") {
                Word::Source(s.to_owned())
            } else if lower == "tied" {
                Word::Tied
            } else {
                Word::Name(lower)
            }
        })
        .collect()
}

fn source_kind(source: Source) -> &'static str {
    match source {
        Source::Offload(_) => "offload",
        Source::Checkpoint(_) => "checkpoint",
        Source::Adapter(_) => "adapter",
        Source::Pieces(_) => "pieces",
        Source::Tied(_) => "tied",
        Source::None => "none",
    }
}

fn holds(ckpt: &Checkpoint, id: usize, t: &Tensor, word: &Word) -> bool {
    match word {
        Word::Name(text) => t
            .name
            .as_bytes()
            .windows(text.len().max(1))
            .any(|w| w.eq_ignore_ascii_case(text.as_bytes())),
        Word::Device(d) => {
            let placement = t.placement.to_string();
            placement == *d || (d == "gpu" && placement.starts_with("gpu:"))
        }
        Word::Dtype(d) => {
            t.dtype.to_string().eq_ignore_ascii_case(d)
                || t.dtype.torch_name().eq_ignore_ascii_case(d)
        }
        Word::Source(s) => source_kind(t.source) == s,
        Word::Tied => ckpt.tie_group(id).is_some(),
    }
}

impl App {
    /// `f`: the filter prompt, holding the filter in place (or empty).
    pub(super) fn open_filter(&mut self) {
        self.mode = Mode::Filter(self.filter.clone().unwrap_or_default());
    }

    pub(super) fn filter_input(&mut self, action: Action) {
        let Mode::Filter(query) = &mut self.mode else {
            return;
        };
        match action {
            ref edit if is_edit(edit) => {
                self.cursor = edit_text(query, self.cursor, edit);
                let q = query.clone();
                self.apply_filter(&q);
            }
            Action::Submit => {
                let q = std::mem::take(query);
                self.mode = Mode::Browse;
                self.apply_filter(&q);
                if self.filter.is_some() {
                    let shown = self.rows.visible().len();
                    self.say(
                        format!(
                            "filter `{q}`: {} (f edits it, Esc clears it)",
                            devmap_core::text::count(shown, "row", "rows")
                        ),
                        if shown == 0 { Tone::Bad } else { Tone::Info },
                    );
                }
            }
            Action::Close => {
                self.mode = Mode::Browse;
                self.clear_filter();
            }
            _ => {}
        }
    }

    /// Shows only what `query` keeps (everything when it is empty).
    pub(super) fn apply_filter(&mut self, query: &str) {
        let words = words(query);
        if words.is_empty() {
            self.clear_filter();
            return;
        }
        let ckpt = &self.ckpt;
        let keep = self.tree.marked_with_ancestors(|id| {
            let t = &ckpt.tensors()[id];
            words.iter().all(|w| holds(ckpt, id, t, w))
        });
        self.rows.set_filter(Some(keep));
        self.filter = Some(query.to_owned());
    }

    pub(super) fn clear_filter(&mut self) {
        if self.filter.take().is_some() {
            self.rows.set_filter(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Word, words};

    #[test]
    fn filter_words() {
        assert_eq!(
            words("Layers.3 dev:CPU dtype:bf16 src:offload tied"),
            vec![
                Word::Name("layers.3".into()),
                Word::Device("cpu".into()),
                Word::Dtype("bf16".into()),
                Word::Source("offload".into()),
                Word::Tied,
            ]
        );
    }
}
