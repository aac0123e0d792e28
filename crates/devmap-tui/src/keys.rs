//! Every key binding, in one place: key events become [`Action`]s here and nowhere
//! else, and the help overlay and status line are drawn from the same table.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseEvent, MouseEventKind};

use super::app::{Action, Mode};

/// What the help overlay lists: (keys, what they do).
pub const HELP: &[(&str, &str)] = &[
    ("↑/↓  j/k", "move"),
    ("PgUp/PgDn", "move a page"),
    ("g / G", "top / bottom"),
    ("→/l/Enter", "expand"),
    ("←/h", "collapse, or go to parent"),
    ("/", "search names; n / N next / previous match"),
    ("t", "jump to the tie partner"),
    (
        "d",
        "pick the selected module's device from a list, with budgets",
    ),
    ("D", "move the selected module to the next device at once"),
    ("u / Ctrl-R", "undo / redo a device-map edit"),
    (
        "p",
        "plan: accelerate's device map for budgets you edit, with the diff",
    ),
    ("w", "export the edited device map as JSON"),
    ("s", "save dialog: shard size, output folder, preview"),
    ("v", "verify a finished save: compare it with its source"),
    ("+  -", "open every module; back to the top level"),
    (
        "o",
        "sort siblings by size, params, name, or back to module order",
    ),
    (
        "f",
        "filter the tree: name text, dev:cpu, dtype:bf16, src:offload, tied (Esc clears)",
    ),
    (
        "z",
        "zoom: the focused panel takes the screen (z again gives it back)",
    ),
    ("!", "every warning, in full"),
    ("?", "this help"),
    ("click", "select a row; again opens or closes it"),
    (
        "Tab  S-Tab",
        "focus the next (previous) panel: tree, Details, Devices; ↑↓ scroll it",
    ),
    (
        "q  Ctrl-C",
        "quit (asks if a save runs or edits are not exported)",
    ),
];

/// The browse hints in the order they show, each with its rank: a narrow status line
/// keeps the best-ranked ones that fit (1 first), so `q quit`, `? help` and `s save`
/// stay at 80 columns.
pub const BROWSE_HINTS: &[(&str, u8)] = &[
    ("↑↓ move", 4),
    ("→← open/close", 11),
    ("/ search", 5),
    ("t tie", 9),
    ("d device", 6),
    ("u undo", 10),
    ("p plan", 7),
    ("w export", 8),
    ("s save", 3),
    ("! warnings", 12),
    ("? help", 2),
    ("q quit", 1),
];

/// The browse hint line that fits `width` columns.
pub fn browse_hint(width: usize) -> String {
    let mut by_rank: Vec<&(&str, u8)> = BROWSE_HINTS.iter().collect();
    by_rank.sort_by_key(|(_, rank)| *rank);
    let mut keep: Vec<&str> = Vec::new();
    let mut used = 0;
    for (hint, _) in by_rank {
        let cost = hint.chars().count() + if keep.is_empty() { 0 } else { 2 };
        if used + cost > width {
            break;
        }
        used += cost;
        keep.push(hint);
    }
    BROWSE_HINTS
        .iter()
        .map(|(hint, _)| *hint)
        .filter(|h| keep.contains(h))
        .collect::<Vec<_>>()
        .join("  ")
}

/// A mode's hint in `width` columns: whole `key what` items from the start, the ones
/// that do not fit left out (never a phrase cut in two).
pub fn hint_in(mode: &Mode, width: usize) -> String {
    let mut kept = String::new();
    for item in hint(mode).split("  ") {
        let cost = item.chars().count() + if kept.is_empty() { 0 } else { 2 };
        if kept.chars().count() + cost > width {
            break;
        }
        if !kept.is_empty() {
            kept.push_str("  ");
        }
        kept.push_str(item);
    }
    kept
}

/// The short hint on the status line for each mode.
pub fn hint(mode: &Mode) -> &'static str {
    match mode {
        Mode::Browse => {
            "↑↓ move  →← open/close  / search  t tie  d device  u undo  p plan  w export  s save  ? help  q quit"
        }
        Mode::Search(_) => "type to search  Enter keep  Esc cancel",
        Mode::Filter(_) => {
            "name text, dev:cpu, dtype:bf16, src:offload, tied  Enter keep  Esc clear"
        }
        Mode::SaveDialog(_) => {
            "Tab field  ←→ preset/cursor  ^W ^U delete  ^O overwrite  Enter start  Esc close"
        }
        Mode::Export(_) => "Enter write  Ctrl-U clear  Esc cancel",
        Mode::Help => "↑↓ scroll  Esc or ? close",
        Mode::Warnings => "Esc or ! close",
        Mode::Confirm(_) => "y yes  n no",
        Mode::Plan(_) => "edit budgets (N=size,cpu=size)  Enter plan  Ctrl-U clear  Esc cancel",
        Mode::PlanPreview(_) => "Enter apply  Esc discard  ↑↓ PgUp/PgDn scroll",
        Mode::DevicePicker(_) => "↑↓ choose  Enter move here  Esc cancel",
    }
}

pub fn key_action(mode: &Mode, key: KeyEvent) -> Option<Action> {
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && key.code == KeyCode::Char('c') {
        return Some(Action::Quit);
    }
    match mode {
        Mode::Browse => browse(key),
        Mode::Export(_) if key.code == KeyCode::Tab => Some(Action::NextField),
        // The one-line text prompts: search, the export path, the plan's budgets.
        Mode::Search(_) | Mode::Filter(_) | Mode::Export(_) | Mode::Plan(_) => {
            text_keys(key).or(match key.code {
                KeyCode::Enter => Some(Action::Submit),
                KeyCode::Esc => Some(Action::Close),
                KeyCode::Left => Some(Action::CursorLeft),
                KeyCode::Right => Some(Action::CursorRight),
                KeyCode::Char(c) if !ctrl => Some(Action::Input(c)),
                _ => None,
            })
        }
        Mode::SaveDialog(_) => text_keys(key).or(match key.code {
            KeyCode::Enter => Some(Action::Submit),
            KeyCode::Esc => Some(Action::Close),
            KeyCode::Tab => Some(Action::NextField),
            KeyCode::BackTab => Some(Action::PrevField),
            // Presets in the size and dtype fields; the cursor in a path.
            KeyCode::Left => Some(Action::PrevPreset),
            KeyCode::Right => Some(Action::NextPreset),
            KeyCode::Char('o') if ctrl => Some(Action::ToggleOverwrite),
            KeyCode::Char(c) if !ctrl => Some(Action::Input(c)),
            _ => None,
        }),
        Mode::DevicePicker(_) => match key.code {
            KeyCode::Enter => Some(Action::Submit),
            KeyCode::Esc | KeyCode::Char('q' | 'd') => Some(Action::Close),
            KeyCode::Up | KeyCode::Char('k') => Some(Action::Up),
            KeyCode::Down | KeyCode::Char('j') | KeyCode::Tab => Some(Action::Down),
            _ => None,
        },
        Mode::PlanPreview(_) => match key.code {
            KeyCode::Enter => Some(Action::Submit),
            KeyCode::Esc | KeyCode::Char('q') => Some(Action::Close),
            KeyCode::Up | KeyCode::Char('k') => Some(Action::Up),
            KeyCode::Down | KeyCode::Char('j') => Some(Action::Down),
            KeyCode::PageUp => Some(Action::PageUp),
            KeyCode::PageDown => Some(Action::PageDown),
            _ => None,
        },
        Mode::Warnings | Mode::Help => match key.code {
            KeyCode::Esc | KeyCode::Char('!' | '?' | 'q') | KeyCode::Enter => Some(Action::Close),
            // Overlays taller than the screen scroll.
            KeyCode::Up | KeyCode::Char('k') => Some(Action::Up),
            KeyCode::Down | KeyCode::Char('j') => Some(Action::Down),
            KeyCode::PageUp => Some(Action::PageUp),
            KeyCode::PageDown => Some(Action::PageDown),
            _ => None,
        },
        Mode::Confirm(_) => match key.code {
            KeyCode::Char('y' | 'Y') | KeyCode::Enter => Some(Action::Yes),
            KeyCode::Char('n' | 'N') | KeyCode::Esc => Some(Action::No),
            _ => None,
        },
    }
}

/// The editing keys every text field shares: Backspace, Ctrl-U (delete to the start),
/// Ctrl-W (delete the last path part), Home/End.
fn text_keys(key: KeyEvent) -> Option<Action> {
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    match key.code {
        KeyCode::Backspace => Some(Action::Backspace),
        KeyCode::Char('u') if ctrl => Some(Action::ClearField),
        KeyCode::Char('w') if ctrl => Some(Action::DeleteWord),
        KeyCode::Home => Some(Action::CursorHome),
        KeyCode::End => Some(Action::CursorEnd),
        _ => None,
    }
}

fn browse(key: KeyEvent) -> Option<Action> {
    if key.modifiers.contains(KeyModifiers::CONTROL) {
        return match key.code {
            KeyCode::Char('r') => Some(Action::Redo),
            _ => None,
        };
    }
    Some(match key.code {
        KeyCode::Up | KeyCode::Char('k') => Action::Up,
        KeyCode::Down | KeyCode::Char('j') => Action::Down,
        KeyCode::PageUp => Action::PageUp,
        KeyCode::PageDown => Action::PageDown,
        KeyCode::Home | KeyCode::Char('g') => Action::Top,
        KeyCode::End | KeyCode::Char('G') => Action::Bottom,
        KeyCode::Right | KeyCode::Char('l') | KeyCode::Enter => Action::Expand,
        KeyCode::Left | KeyCode::Char('h') => Action::Collapse,
        KeyCode::Char('/') => Action::StartSearch,
        KeyCode::Tab => Action::NextField,
        KeyCode::BackTab => Action::PrevField,
        KeyCode::Char('n') => Action::NextMatch,
        KeyCode::Char('N') => Action::PrevMatch,
        KeyCode::Char('t') => Action::JumpTie,
        KeyCode::Char('d') => Action::PickDevice,
        KeyCode::Char('D') => Action::CycleDevice,
        KeyCode::Char('u') => Action::Undo,
        KeyCode::Char('w') => Action::StartExport,
        KeyCode::Char('p') => Action::StartPlan,
        KeyCode::Char('s') => Action::OpenSave,
        KeyCode::Char('v') => Action::Verify,
        KeyCode::Char('?') => Action::Help,
        KeyCode::Char('z') => Action::Zoom,
        KeyCode::Char('f') => Action::StartFilter,
        KeyCode::Char('o') => Action::CycleSort,
        KeyCode::Char('+') => Action::ExpandAll,
        KeyCode::Char('-') => Action::CollapseAll,
        KeyCode::Char('!') => Action::ShowWarnings,
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Esc => Action::Close,
        _ => return None,
    })
}

pub fn mouse_action(mouse: MouseEvent) -> Option<Action> {
    match mouse.kind {
        MouseEventKind::ScrollUp | MouseEventKind::ScrollDown => Some(Action::Wheel {
            column: mouse.column,
            row: mouse.row,
            down: mouse.kind == MouseEventKind::ScrollDown,
        }),
        MouseEventKind::Down(ratatui::crossterm::event::MouseButton::Left) => Some(Action::Click {
            column: mouse.column,
            row: mouse.row,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_narrow_status_line_keeps_quit_help_and_save() {
        for width in [80, 60, 40, 30] {
            let line = browse_hint(width);
            assert!(line.chars().count() <= width, "{width}: {line}");
            for must in ["q quit", "? help", "s save"] {
                assert!(line.contains(must), "{width}: {line}");
            }
        }
        // Wide enough: every hint, in order.
        let all: Vec<&str> = BROWSE_HINTS.iter().map(|(h, _)| *h).collect();
        assert_eq!(browse_hint(200), all.join("  "));
    }
}
