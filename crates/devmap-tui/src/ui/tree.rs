//! The module tree panel: only the visible slice of rows is built each frame.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::bar;
use super::theme::Theme;
use crate::app::App;
use devmap_core::inspect::human_count;
use devmap_core::model::tree::Node;

const SIZE_W: usize = 10;
const SHARE_W: usize = 6;
const PARAMS_W: usize = 7;
const BADGE_W: usize = 9;
/// Columns a name gets before the share and params columns give way.
const NAME_MIN: usize = 24;
/// Columns a mixed module's split note gets before them: a two-device note whole
/// (` cpu 33% disk 67%`); a longer one shares what the columns leave, cut with `…`
/// (Details shows it whole).
const NOTE_MIN: usize = 17;

pub fn draw(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let block = super::focusable(
        "Modules",
        app.focus == crate::app::Focus::Tree,
        "Tab next",
        theme,
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let width = inner.width as usize;
    let height = inner.height.saturating_sub(1) as usize;
    let start = app.rows.offset;
    let visible = app.rows.visible();
    let shown = || visible.iter().skip(start).take(height);
    // Columns give way by priority, as dua's do: the share bar first, then the
    // parameter count; the name, size and device always stay (see below).
    let always = SIZE_W + 1 + BADGE_W + 1 + 1;
    let longest_name = shown()
        .map(|&id| {
            let node = &app.tree.nodes[id];
            2 * node.depth as usize + node.name.chars().count()
        })
        .max()
        .unwrap_or(8);
    let note_w = shown()
        .map(|&id| split_note(&app.tree.nodes[id]).chars().count())
        .max()
        .unwrap_or(0);
    let name_need = longest_name.clamp(8, 44);
    // Room is handed out by priority: the name its minimum, then the split note of a
    // mixed module (what a user debugging a map reads) up to a two-device note, then
    // the rest of the name, then the parameter count, then the rest of the note, then
    // the share bar; what is left goes to the note's column. A note as wide as three
    // devices on one row no longer drops the params column of every row.
    let name_min = name_need.min(NAME_MIN);
    let mut left = width.saturating_sub(always + name_min);
    let mut note_fit = note_w.min(NOTE_MIN).min(left);
    left -= note_fit;
    let name_extra = (name_need - name_min).min(left);
    left -= name_extra;
    let params = left > PARAMS_W;
    if params {
        left -= PARAMS_W + 1;
    }
    let note_rest = (note_w - note_fit).min(left);
    note_fit += note_rest;
    left -= note_rest;
    // The share bar only beside the parameter count: it gives way first.
    let share = params && left > SHARE_W;
    if share {
        left -= SHARE_W + 1;
    }
    let name_w = (name_min + name_extra)
        .min(width.saturating_sub(always))
        .max(8);
    let note_room = note_fit + left;
    let mut lines = Vec::with_capacity(inner.height as usize);
    let mut header = format!("{:<name_w$} {:>SIZE_W$} ", "name", "size");
    if share {
        header.push_str(&format!("{:<SHARE_W$} ", "share"));
    }
    if params {
        header.push_str(&format!("{:>PARAMS_W$} ", "params"));
    }
    header.push_str(&format!("{:<BADGE_W$}", "device"));
    lines.push(Line::from(Span::styled(header, theme.dim())));
    let total = app.tree.nodes[0].bytes().max(1) as f64;
    for (i, &id) in visible.iter().enumerate().skip(start).take(height) {
        let node = &app.tree.nodes[id];
        let marker = if !app.rows.has_children(id) {
            "  "
        } else if app.rows.filtered() || app.rows.is_expanded(id) {
            "▾ "
        } else {
            "▸ "
        };
        let indent = "  ".repeat((node.depth as usize).saturating_sub(1));
        let mut label = format!("{indent}{marker}{}", devmap_core::text::escaped(&node.name));
        if label.chars().count() > name_w {
            label = label
                .chars()
                .take(name_w.saturating_sub(1))
                .collect::<String>()
                + "…";
        }
        let (mut badge, badge_style) = badge(node, theme);
        // `*`: moved since the model opened (by `d`, a plan, an undo of one).
        if app.row_edited(id) {
            badge.push('*');
        }
        // One marker column: ⇄ a tied tensor, + one a LoRA adapter changes on save.
        let changed = node
            .tensor()
            .is_some_and(|t| app.ckpt.changed_by_adapter(t));
        let tie = if node
            .tensor()
            .is_some_and(|t| app.ckpt.tie_group(t).is_some())
        {
            "⇄"
        } else if changed {
            "+"
        } else {
            " "
        };
        let plain = ratatui::style::Style::default();
        let name_style = if app.matches.binary_search(&id).is_ok() {
            theme.matched()
        } else {
            plain
        };
        let mut spans = vec![
            Span::styled(format!("{label:<name_w$}"), name_style),
            Span::raw(" "),
            Span::raw(format!(
                "{:>SIZE_W$} ",
                devmap_core::human_bytes(node.bytes())
            )),
        ];
        if share {
            spans.push(Span::styled(
                format!("{} ", bar(node.bytes() as f64 / total, SHARE_W)),
                theme.gauge(),
            ));
        }
        if params {
            spans.push(Span::raw(format!(
                "{:>PARAMS_W$} ",
                human_count(node.params)
            )));
        }
        spans.extend([
            Span::styled(format!("{badge:<BADGE_W$}"), badge_style),
            Span::styled(tie, theme.tie()),
            Span::styled(fit_note(split_note(node), note_room), theme.dim()),
        ]);
        let line = if i == app.rows.selected {
            // The selection bar runs the whole row: reversed video on every cell,
            // coloured ones included (the line's style is the base each span patches),
            // padded to the panel's width.
            let used: usize = spans.iter().map(|s| s.content.chars().count()).sum();
            spans.push(Span::raw(" ".repeat(width.saturating_sub(used))));
            Line::from(spans).style(theme.selected())
        } else {
            Line::from(spans)
        };
        lines.push(line);
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

fn badge(node: &Node, theme: Theme) -> (String, ratatui::style::Style) {
    match node.single_placement() {
        Some(p) => (p.to_string(), theme.device(p)),
        None if node.split.is_empty() => ("-".into(), theme.dim()),
        None => ("mixed".into(), theme.mixed()),
    }
}

/// The split note in `room` columns: the devices that fit whole, then `…` for the
/// rest (never a figure cut in two), or nothing where not even one fits.
fn fit_note(note: String, room: usize) -> String {
    if note.chars().count() <= room {
        return note;
    }
    // Entries are ` device NN%`: keep whole ones while they and the `…` fit.
    let mut kept = String::new();
    for entry in note.split_inclusive('%') {
        if kept.chars().count() + entry.chars().count() + 2 > room {
            break;
        }
        kept.push_str(entry);
    }
    if kept.is_empty() {
        String::new()
    } else {
        kept + " …"
    }
}

/// ` gpu:0 40% cpu 60%` for a module on several devices, empty otherwise.
fn split_note(node: &Node) -> String {
    if node.split.len() < 2 {
        return String::new();
    }
    let total = node.bytes().max(1) as f64;
    node.split
        .iter()
        .map(|(p, b)| format!(" {p} {:.0}%", *b as f64 * 100.0 / total))
        .collect()
}
