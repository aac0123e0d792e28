//! Popups over the main screen: the save dialog with its live preview, the export
//! path, confirmations, and the help overlay.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph, Wrap};

use super::theme::Theme;
use super::{centered, panel};
use crate::app::{
    App, Confirm, ExportDialog, Field, PlanDialog, SHARD_PRESETS, SaveDialog, dtype_label,
};
use crate::keys;
use devmap_core::human_bytes;

pub fn save(app: &App, d: &SaveDialog, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    // Only the size and output fields are typed (the dtype field is chosen).
    let field = |label: &str, value: &str, active: bool, cursor_field: bool| {
        let style = if active {
            theme.selected()
        } else {
            ratatui::style::Style::default()
        };
        Line::from(vec![
            Span::styled(format!("{label:<13}"), theme.dim()),
            Span::styled(
                if active && cursor_field {
                    super::with_cursor(value, app.cursor)
                } else if active {
                    format!("{value}▏")
                } else {
                    value.to_owned()
                },
                style,
            ),
        ])
    };
    let p = &d.preview;
    // The preview below is for the values before the last edit until the new one lands.
    let checking = (d.preview_due.is_some() || d.preview_pending.is_some())
        .then(|| format!("{} checking…", super::spinner(app.clock)));
    let mut lines = vec![
        field("shard size", &d.size, d.field == Field::ShardSize, true),
        Line::from(Span::styled(
            format!("{:13}presets: {}  (←/→)", "", SHARD_PRESETS.join(" ")),
            theme.dim(),
        )),
        field("output", &d.out, d.field == Field::Output, true),
        field(
            "dtype",
            &format!(
                "{}  (←/→: auto keep bfloat16 float16 float32)",
                dtype_label(d.dtype)
            ),
            d.field == Field::Dtype,
            false,
        ),
        Line::from(""),
    ];
    if let Some(checking) = checking {
        lines.push(Line::from(Span::styled(checking, theme.dim())));
    }
    if p.plan.is_some() {
        let sizes = summarize_sizes(&p.shard_sizes);
        lines.push(Line::from(format!(
            "{} → {} ({sizes}), {} to write",
            devmap_core::text::count(p.tensors, "tensor", "tensors"),
            devmap_core::text::count(p.shard_sizes.len(), "shard", "shards"),
            human_bytes(p.bytes)
        )));
        lines.push(Line::from(match p.cast_to {
            Some(to) => format!("floating-point tensors written as {}", to.torch_name()),
            None => "every tensor written in its stored dtype".to_owned(),
        }));
        if let Some((name, bytes)) = &p.largest {
            lines.push(Line::from(format!(
                "largest tensor: {name} ({})",
                human_bytes(*bytes)
            )));
        }
        if let Some((adapters, merged)) = &p.lora {
            lines.push(Line::from(Span::styled(
                format!(
                    "LoRA: {} merged into {} as the save streams",
                    adapters.join(" + "),
                    devmap_core::text::count(*merged, "tensor", "tensors")
                ),
                theme.good(),
            )));
        }
        for (dropped, kept, evidence) in &p.ties_once {
            lines.push(Line::from(Span::styled(
                format!("tied ({evidence}): {dropped} written once, as {kept}"),
                theme.tie(),
            )));
        }
        lines.push(Line::from(format!(
            "memory: about {} ({}; no shard is held in RAM)",
            human_bytes(p.memory),
            p.memory_parts
        )));
        if d.overwrites() {
            lines.push(Line::from(Span::styled(
                "overwrite: on for this folder (earlier weight files in it are replaced)",
                theme.warn(),
            )));
        }
    }
    for w in &p.warnings {
        lines.push(Line::from(Span::styled(
            format!("warning: {w}"),
            theme.warn(),
        )));
    }
    for e in &p.errors {
        lines.push(Line::from(Span::styled(
            format!("cannot start: {e}"),
            theme.bad(),
        )));
    }
    if p.offer_overwrite {
        lines.push(Line::from(Span::styled(
            "Ctrl-O overwrites the folder's weight files",
            theme.warn(),
        )));
    }
    if app.save_running() {
        lines.push(Line::from(Span::styled(
            "a save is already running",
            theme.bad(),
        )));
    }
    lines.push(Line::from(""));
    lines.push(Line::from(Span::styled(keys::hint(&app.mode), theme.dim())));
    let inner = popup(
        frame,
        area,
        84,
        lines.len() as u16 + 2,
        "Save as sharded safetensors",
    );
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

/// `3 × 4.66 GiB + 1.20 GiB`-style summary of shard sizes.
fn summarize_sizes(sizes: &[u64]) -> String {
    match sizes {
        [] => "nothing".into(),
        [one] => human_bytes(*one),
        [.., last] => {
            let max = sizes.iter().copied().max().unwrap_or(0);
            format!("largest {}, last {}", human_bytes(max), human_bytes(*last))
        }
    }
}

/// Clears a centered `w`×`h` box over the screen, frames it with `title`, and
/// returns the space inside.
fn popup(frame: &mut Frame<'_>, area: Rect, w: u16, h: u16, title: &str) -> Rect {
    let rect = centered(area, w, h);
    frame.render_widget(Clear, rect);
    let block = panel(title);
    let inner = block.inner(rect);
    frame.render_widget(block, rect);
    inner
}

pub fn export(
    d: &ExportDialog,
    cursor: Option<usize>,
    frame: &mut Frame<'_>,
    area: Rect,
    theme: Theme,
) {
    let inner = popup(frame, area, 80, 7, "Export device map (hf_device_map JSON)");
    let mut lines = vec![Line::from(vec![
        Span::styled("path ", theme.dim()),
        Span::styled(super::with_cursor(&d.path, cursor), theme.selected()),
    ])];
    if let Some(e) = &d.error {
        lines.push(Line::from(Span::styled(e.clone(), theme.bad())));
    }
    lines.push(Line::from(Span::styled(
        "Enter write  Ctrl-U clear  Esc cancel",
        theme.dim(),
    )));
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

pub fn confirm(c: &Confirm, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let text = match c {
        Confirm::QuitDuringSave => "A save is running. Cancel it and quit? (y/n)".to_owned(),
        Confirm::QuitUnexported => {
            "The edited device map is not exported (w). Quit and lose the edits? (y/n)".to_owned()
        }
        Confirm::CancelSave => {
            "Cancel the running save? Nothing it wrote is kept. (y/n)".to_owned()
        }
        Confirm::OverwriteExport(p) => format!("{} exists. Overwrite it? (y/n)", p.display()),
    };
    let inner = popup(frame, area, 64, 5, "Confirm");
    frame.render_widget(
        Paragraph::new(Line::from(Span::styled(text, theme.warn()))).wrap(Wrap { trim: true }),
        inner,
    );
}

pub fn help(scroll: u16, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    const WIDTH: u16 = 66;
    const KEY: usize = 12;
    // Descriptions wrap at word boundaries under their key, never cut.
    // The popup is at most the screen less a cell each side, its text less its border.
    let text_width = usize::from(WIDTH.min(area.width.saturating_sub(2)).saturating_sub(2))
        .saturating_sub(KEY)
        .max(10);
    let mut lines: Vec<Line> = Vec::new();
    for (k, what) in keys::HELP {
        for (i, row) in wrap_words(what, text_width).into_iter().enumerate() {
            let key = if i == 0 {
                format!("{k:<KEY$}")
            } else {
                " ".repeat(KEY)
            };
            lines.push(Line::from(vec![
                Span::styled(key, theme.title()),
                Span::raw(row),
            ]));
        }
    }
    lines.push(Line::from(Span::styled(
        "mouse wheel scrolls · Esc closes",
        theme.dim(),
    )));
    let inner = popup(frame, area, WIDTH, lines.len() as u16 + 2, "Keys");
    scrolled(lines, scroll, inner, frame, theme);
}

/// `lines` in `area` from line `scroll` on (clamped so the last line can be reached
/// and no further); when they do not all fit, the last row says where the rest is.
fn scrolled(lines: Vec<Line<'_>>, scroll: u16, area: Rect, frame: &mut Frame<'_>, theme: Theme) {
    let rows = usize::from(area.height);
    if lines.len() <= rows || rows < 2 {
        frame.render_widget(Paragraph::new(lines), area);
        return;
    }
    let shown = rows - 1;
    let top = usize::from(scroll).min(lines.len() - shown);
    let below = lines.len() - top - shown;
    let mut visible: Vec<Line> = lines.into_iter().skip(top).take(shown).collect();
    let at = match (top, below) {
        (0, n) => format!("↓ {n} more (↑↓ scroll)"),
        (n, 0) => format!("↑ {n} above"),
        (a, b) => format!("↑ {a} above · ↓ {b} more"),
    };
    visible.push(Line::from(Span::styled(at, theme.dim())));
    frame.render_widget(Paragraph::new(visible), area);
}

/// Every warning, wrapped to the popup; those that do not fit are counted.
pub fn warnings(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let width = area.width.saturating_sub(4).min(110);
    let text_width = usize::from(width.saturating_sub(4)).max(10);
    // Every warning, wrapped; a list taller than the screen scrolls (↑↓, PgUp/PgDn).
    let mut lines: Vec<Line> = Vec::new();
    for w in &app.warnings {
        for (i, row) in wrap_words(&w.to_string(), text_width)
            .into_iter()
            .enumerate()
        {
            let mark = if i == 0 { "! " } else { "  " };
            lines.push(Line::from(vec![
                Span::styled(mark, theme.warn()),
                Span::raw(row),
            ]));
        }
    }
    if app.warnings.is_empty() {
        lines.push(Line::from("no warnings"));
    }
    let title = format!("Warnings ({})", app.warnings.len());
    let inner = popup(frame, area, width, lines.len() as u16 + 2, &title);
    scrolled(lines, app.overlay_scroll, inner, frame, theme);
}

/// `text` in rows of at most `width` characters, broken between words (a word longer
/// than a row gets a row of its own).
fn wrap_words(text: &str, width: usize) -> Vec<String> {
    let mut rows: Vec<String> = Vec::new();
    let mut row = String::new();
    for word in text.split(' ') {
        let needed = row.chars().count() + usize::from(!row.is_empty()) + word.chars().count();
        if !row.is_empty() && needed > width {
            rows.push(std::mem::take(&mut row));
        }
        if !row.is_empty() {
            row.push(' ');
        }
        row.push_str(word);
    }
    rows.push(row);
    rows
}

pub fn plan(
    d: &PlanDialog,
    cursor: Option<usize>,
    busy: Option<String>,
    frame: &mut Frame<'_>,
    area: Rect,
    theme: Theme,
) {
    let inner = popup(
        frame,
        area,
        84,
        8,
        "Plan a device map (accelerate's infer_auto_device_map)",
    );
    let mut lines = vec![
        Line::from(vec![
            Span::styled("budgets ", theme.dim()),
            Span::styled(super::with_cursor(&d.budgets, cursor), theme.selected()),
        ]),
        Line::from(Span::styled(
            "GPU index, mps or cpu = size (5GB = 5·10^9, 5GiB = 5·2^30); disk takes the rest",
            theme.dim(),
        )),
    ];
    if let Some(e) = &d.error {
        lines.push(Line::from(Span::styled(e.clone(), theme.bad())));
    }
    if let Some(busy) = busy {
        lines.push(Line::from(Span::styled(busy, theme.warn())));
    }
    lines.push(Line::from(Span::styled(
        "Enter plan  Ctrl-U clear  Esc cancel",
        theme.dim(),
    )));
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

pub fn plan_preview(text: &[String], scroll: u16, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let inner = popup(
        frame,
        area,
        96,
        text.len() as u16 + 2,
        "Planned map (not applied: Enter applies, Esc discards)",
    );
    let lines: Vec<Line> = text
        .iter()
        .enumerate()
        .map(|(i, l)| {
            if i == 0 {
                Line::from(Span::styled(l.clone(), theme.title()))
            } else if l.starts_with('·') {
                Line::from(Span::styled(l.clone(), theme.dim()))
            } else {
                Line::from(l.clone())
            }
        })
        .collect();
    let total = super::wrapped_rows(&lines, inner.width);
    let paragraph = Paragraph::new(lines).wrap(Wrap { trim: false });
    let scroll = scroll.min(total.saturating_sub(inner.height));
    frame.render_widget(paragraph.scroll((scroll, 0)), inner);
}

/// `d`: the devices, each with what it holds now → with the module, against its budget.
pub fn device_picker(
    app: &App,
    picker: &crate::app::DevicePicker,
    frame: &mut Frame<'_>,
    area: Rect,
    theme: Theme,
) {
    let name = app.tree.full_name(picker.node);
    let bytes = app.tree.nodes[picker.node].bytes();
    let title = format!(
        "Move {} ({}) to",
        if name.is_empty() {
            "the whole model"
        } else {
            name.as_str()
        },
        devmap_core::human_bytes(bytes)
    );
    let inner = popup(
        frame,
        area,
        72,
        picker.choices.len() as u16 + 4,
        &devmap_core::text::escaped(&title),
    );
    let mut lines = vec![Line::from(Span::styled(
        format!(
            "  {:<9} {:>11}   {:>11}   budget",
            "device", "holds now", "with it"
        ),
        theme.dim(),
    ))];
    for (i, c) in picker.choices.iter().enumerate() {
        let over = c.budget.is_some_and(|b| c.after > b);
        let budget = match c.budget {
            Some(b) if over => format!("OVER {}", devmap_core::human_bytes(b)),
            Some(b) => format!(
                "≤ {} ({} left)",
                devmap_core::human_bytes(b),
                devmap_core::human_bytes(b - c.after)
            ),
            None => "unknown".to_owned(),
        };
        let mark = if i == picker.selected { "▶ " } else { "  " };
        let here = if c.current { " (here)" } else { "" };
        let row = Line::from(vec![
            Span::raw(mark),
            Span::styled(
                format!("{:<9}", c.device.to_string()),
                theme.device(c.device),
            ),
            Span::raw(format!(
                " {:>11} → {:>11}   ",
                devmap_core::human_bytes(c.holds),
                devmap_core::human_bytes(c.after)
            )),
            Span::styled(budget, if over { theme.bad() } else { theme.dim() }),
            Span::styled(here, theme.dim()),
        ]);
        lines.push(if i == picker.selected {
            row.style(theme.selected())
        } else {
            row
        });
    }
    lines.push(Line::from(Span::styled(
        "↑↓ choose  Enter move here  Esc cancel",
        theme.dim(),
    )));
    frame.render_widget(Paragraph::new(lines), inner);
}
