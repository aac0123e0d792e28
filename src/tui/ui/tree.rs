//! The module tree panel: only the visible slice of rows is built each frame.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::theme::Theme;
use super::{bar, panel};
use crate::inspect::human_count;
use crate::model::tree::Node;
use crate::tui::app::App;

const SIZE_W: usize = 10;
const SHARE_W: usize = 6;
const PARAMS_W: usize = 7;
const BADGE_W: usize = 9;

pub fn draw(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let block = panel("Modules");
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let width = inner.width as usize;
    let fixed = SIZE_W + SHARE_W + PARAMS_W + BADGE_W + 6;
    // Names get what the columns leave, up to a point; the rest shows how a mixed
    // module is split.
    let name_w = width.saturating_sub(fixed).clamp(8, 44);
    let mut lines = Vec::with_capacity(inner.height as usize);
    lines.push(Line::from(Span::styled(
        format!(
            "{:<name_w$} {:>SIZE_W$} {:<SHARE_W$} {:>PARAMS_W$} {:<BADGE_W$}",
            "name", "size", "share", "params", "device"
        ),
        theme.dim(),
    )));
    let total = app.tree.nodes[0].bytes.max(1) as f64;
    let height = inner.height.saturating_sub(1) as usize;
    let start = app.rows.offset;
    let visible = app.rows.visible();
    for (i, &id) in visible.iter().enumerate().skip(start).take(height) {
        let node = &app.tree.nodes[id];
        let marker = if !app.rows.has_children(id) {
            "  "
        } else if app.rows.is_expanded(id) {
            "▾ "
        } else {
            "▸ "
        };
        let indent = "  ".repeat((node.depth as usize).saturating_sub(1));
        let mut label = format!("{indent}{marker}{}", crate::text::escaped(&node.name));
        if label.chars().count() > name_w {
            label = label
                .chars()
                .take(name_w.saturating_sub(1))
                .collect::<String>()
                + "…";
        }
        let (badge, badge_style) = badge(node, theme);
        // One marker column: ⇄ a tied tensor, + one a LoRA adapter changes on save.
        let changed = node.tensor.is_some_and(|t| {
            !app.ckpt.merges_of(t).is_empty()
                || matches!(
                    app.ckpt.tensors()[t].source,
                    crate::model::checkpoint::Source::Adapter(_)
                )
        });
        let tie = if node.tensor.is_some_and(|t| app.ckpt.tie_group(t).is_some()) {
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
            Span::raw(format!("{:>SIZE_W$} ", crate::human_bytes(node.bytes))),
            Span::styled(
                format!("{} ", bar(node.bytes as f64 / total, SHARE_W)),
                theme.gauge(),
            ),
            Span::raw(format!("{:>PARAMS_W$} ", human_count(node.params))),
            Span::styled(format!("{badge:<BADGE_W$}"), badge_style),
            Span::styled(tie, theme.tie()),
            Span::styled(split_note(node), theme.dim()),
        ];
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

/// ` gpu:0 40% cpu 60%` for a module on several devices, empty otherwise.
fn split_note(node: &Node) -> String {
    if node.split.len() < 2 {
        return String::new();
    }
    let total = node.bytes.max(1) as f64;
    node.split
        .iter()
        .map(|(p, b)| format!(" {p} {:.0}%", *b as f64 * 100.0 / total))
        .collect()
}
