//! Text fields: the editing every field shares (cursor, Backspace, Ctrl-U, Ctrl-W,
//! paste) and Tab completion of paths.

use super::{Action, App, Tone};

/// The editing every text field shares, at the cursor (`None`: at the end, where a
/// field's cursor starts): type, Backspace, Ctrl-U (delete to the start), Ctrl-W
/// (delete the last path part or word), ←/→, Home/End. Returns the new cursor.
pub(super) fn edit_text(
    text: &mut String,
    cursor: Option<usize>,
    action: &Action,
) -> Option<usize> {
    let len = text.chars().count();
    let at = cursor.unwrap_or(len).min(len);
    let byte = |chars: usize| {
        text.char_indices()
            .nth(chars)
            .map_or(text.len(), |(b, _)| b)
    };
    let next = match action {
        Action::Input(c) => {
            let b = byte(at);
            text.insert(b, *c);
            at + 1
        }
        Action::Paste(pasted) => {
            let b = byte(at);
            text.insert_str(b, pasted);
            at + pasted.chars().count()
        }
        Action::Backspace if at > 0 => {
            let b = byte(at - 1);
            text.remove(b);
            at - 1
        }
        Action::ClearField => {
            let b = byte(at);
            text.replace_range(..b, "");
            0
        }
        Action::DeleteWord => {
            let chars: Vec<char> = text.chars().collect();
            let mut start = at;
            // Separators right before the cursor go with the word, as in a shell.
            while start > 0 && matches!(chars[start - 1], '/' | ' ') {
                start -= 1;
            }
            while start > 0 && !matches!(chars[start - 1], '/' | ' ') {
                start -= 1;
            }
            let (from, to) = (byte(start), byte(at));
            text.replace_range(from..to, "");
            start
        }
        Action::CursorLeft => at.saturating_sub(1),
        Action::CursorRight => (at + 1).min(len),
        Action::CursorHome => 0,
        Action::CursorEnd => len,
        _ => at,
    };
    let len = text.chars().count();
    (next < len).then_some(next)
}

/// What Tab does to a path typed in a field.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Completion {
    /// Completed as far as the entries agree (a single folder gets its `/`).
    Completed(String),
    /// Typed as far as several entries agree: these are the candidates (Tab stays).
    Ambiguous(Vec<String>),
    /// Nothing to complete: Tab moves on.
    Nothing,
}

/// Up to this many candidates are named in the status line.
const CANDIDATES_SHOWN: usize = 8;

impl App {
    /// Tab in a path field: completes it, or names the candidates in the status line
    /// and stays; `true` when the key was used (the field keeps the focus).
    pub(super) fn tab_complete(&mut self, text: &mut String) -> bool {
        match complete_path(self.probe.as_ref(), text) {
            Completion::Completed(done) => {
                *text = done;
                self.cursor = None;
                true
            }
            Completion::Ambiguous(names) => {
                let more = names.len().saturating_sub(CANDIDATES_SHOWN);
                let mut listed = names
                    .iter()
                    .take(CANDIDATES_SHOWN)
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join("  ");
                if more > 0 {
                    listed.push_str(&format!("  … {more} more"));
                }
                self.say(format!("Tab: {listed}"), Tone::Info);
                true
            }
            Completion::Nothing => false,
        }
    }
}

/// Tab completion of a path typed in `text`: the entries of its folder that start with
/// its last part, completed as far as they agree (a single folder gets its `/`); the
/// candidates when they agree no further than what is typed.
fn complete_path(probe: &dyn crate::probe::Probe, text: &str) -> Completion {
    let (dir, prefix) = match text.rfind('/') {
        Some(i) => (&text[..=i], &text[i + 1..]),
        None => ("", text),
    };
    let folder = if dir.is_empty() { "." } else { dir };
    let mut matches: Vec<(String, bool)> = probe
        .entries(std::path::Path::new(folder))
        .into_iter()
        .filter(|(name, _)| {
            name.starts_with(prefix) && (prefix.starts_with('.') || !name.starts_with('.'))
        })
        .collect();
    matches.sort();
    let Some(first) = matches.first() else {
        return Completion::Nothing;
    };
    let mut common = first.0.clone();
    for (name, _) in &matches[1..] {
        let same = common
            .chars()
            .zip(name.chars())
            .take_while(|(a, b)| a == b)
            .count();
        common = common.chars().take(same).collect();
    }
    if common == prefix {
        // A whole name typed, and nothing longer starts with it: Tab moves on.
        if matches.len() == 1 || matches.iter().all(|(n, _)| n == prefix) {
            return Completion::Nothing;
        }
        return Completion::Ambiguous(
            matches
                .iter()
                .map(|(n, dir)| if *dir { format!("{n}/") } else { n.clone() })
                .collect(),
        );
    }
    let mut completed = format!("{dir}{common}");
    if matches.len() == 1 && first.1 {
        completed.push('/');
    }
    Completion::Completed(completed)
}

/// Whether an action edits the active text field.
pub(super) fn is_edit(action: &Action) -> bool {
    matches!(
        action,
        Action::Input(_)
            | Action::Paste(_)
            | Action::Backspace
            | Action::ClearField
            | Action::DeleteWord
            | Action::CursorLeft
            | Action::CursorRight
            | Action::CursorHome
            | Action::CursorEnd
    )
}
