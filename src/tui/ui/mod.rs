//! Drawing: a pure function of `&App`. Nothing here does I/O or changes state.

mod details;
mod dialogs;
mod panels;
pub mod theme;
mod tree;

pub use super::layout::{MIN_HEIGHT, MIN_WIDTH};

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};

use super::app::{App, Mode, Tone};
use super::keys;
use super::layout::{Areas, areas};
use theme::Theme;

/// The layout the app is drawn with (the progress panel takes room while a save is
/// shown).
pub fn app_areas(app: &App, area: Rect) -> Areas {
    areas(area, app.progress_rows(), app.device_rows())
}

pub fn draw(app: &App, frame: &mut Frame<'_>) {
    let area = frame.area();
    let theme = Theme { color: app.color };
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let text = format!(
            "devmap needs at least {MIN_WIDTH}×{MIN_HEIGHT}; this terminal is {}×{}. Enlarge it, or press q to quit.",
            area.width, area.height
        );
        frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: true }), area);
        return;
    }
    let a = app_areas(app, area);
    draw_title(app, frame, a.title, theme);
    tree::draw(app, frame, a.tree, theme);
    details::draw(app, frame, a.details, theme);
    if let Some(p) = a.progress {
        panels::progress(app, frame, p, theme);
    }
    panels::devices(app, frame, a.devices, theme);
    panels::memory(app, frame, a.memory, theme);
    draw_status(app, frame, a.status, theme);
    match &app.mode {
        Mode::SaveDialog(d) => dialogs::save(app, d, frame, area, theme),
        Mode::Export(d) => dialogs::export(d, app.cursor, frame, area, theme),
        Mode::Help => dialogs::help(frame, area, theme),
        Mode::Warnings => dialogs::warnings(app, frame, area, theme),
        Mode::Confirm(c) => dialogs::confirm(c, frame, area, theme),
        Mode::Plan(d) => dialogs::plan(
            d,
            app.cursor,
            app.busy
                .as_ref()
                .map(|b| format!("{} {}…", spinner(app.clock), b.what)),
            frame,
            area,
            theme,
        ),
        Mode::PlanResult(lines) => {
            dialogs::plan_result(lines, app.result_scroll, frame, area, theme);
        }
        Mode::Browse | Mode::Search(_) => {}
    }
}

fn draw_title(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let root = &app.tree.nodes[0];
    let name = match &app.ckpt.remote {
        Some(remote) => crate::text::escaped(&remote.name).into_owned(),
        None => app.ckpt.dir.file_name().map_or_else(
            || crate::text::path(&app.ckpt.dir),
            |n| crate::text::escaped(&n.to_string_lossy()).into_owned(),
        ),
    };
    let mut spans = vec![
        Span::styled(" devmap ", theme.title()),
        Span::raw(format!(
            "· {name} · {} · {} · {} params",
            crate::text::count(root.tensors, "tensor", "tensors"),
            crate::human_bytes(root.bytes),
            crate::inspect::human_count(root.params)
        )),
    ];
    if app.map_edited() {
        spans.push(Span::styled("  [map edited]", theme.warn()));
    }
    if !app.warnings.is_empty() {
        spans.push(Span::styled(
            format!(
                "  ! {}",
                crate::text::count(app.warnings.len(), "warning", "warnings")
            ),
            theme.warn(),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn draw_status(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    // Work the map waits for is said first, so it shows at any width; the key hints
    // fit in what is left.
    let busy = app
        .busy
        .as_ref()
        .map(|b| format!("{} {}… ", spinner(app.clock), b.what));
    let hint_width =
        usize::from(area.width).saturating_sub(busy.as_ref().map_or(0, |b| b.chars().count()));
    let line = match (&app.mode, &app.message) {
        (Mode::Search(q), _) => Line::from(vec![
            Span::styled("/", theme.title()),
            Span::raw(with_cursor(q, app.cursor)),
            Span::styled(
                match app.match_position() {
                    Some((at, of)) => format!("   {at}/{of}   {}", keys::hint(&app.mode)),
                    None => format!(
                        "   {}   {}",
                        crate::text::count(app.matches.len(), "match", "matches"),
                        keys::hint(&app.mode)
                    ),
                },
                theme.dim(),
            ),
        ]),
        (Mode::Browse, Some(m)) => {
            let style = match m.tone {
                Tone::Info => ratatui::style::Style::default(),
                Tone::Good => theme.good(),
                Tone::Bad => theme.bad(),
            };
            Line::from(vec![Span::styled(
                crate::text::escaped(&m.text).into_owned(),
                style,
            )])
        }
        (Mode::Browse, None) => {
            Line::from(Span::styled(keys::browse_hint(hint_width), theme.dim()))
        }
        (mode, _) => Line::from(Span::styled(keys::hint(mode), theme.dim())),
    };
    let line = match busy {
        Some(busy) => {
            let mut spans = vec![Span::styled(busy, theme.warn())];
            spans.extend(line.spans);
            Line::from(spans)
        }
        None => line,
    };
    frame.render_widget(Paragraph::new(line), area);
}

/// One frame of a braille spinner, turning ten times a second with the app's clock.
pub fn spinner(clock: std::time::Duration) -> &'static str {
    const SPINNER: [&str; 8] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧"];
    SPINNER[(clock.as_millis() / 100) as usize % SPINNER.len()]
}

/// A bordered block with a title.
fn panel(title: &str) -> Block<'_> {
    Block::default()
        .borders(Borders::ALL)
        .title(format!(" {title} "))
}

/// A panel that can take the focus: when it has it, its border is thick, bold and (in
/// colour) cyan, and its title is marked `▶` and says how to move, as gitui and btop
/// mark theirs; without colour the thick border and the marker still show it.
fn focusable(title: &str, focused: bool, hint: &str, theme: Theme) -> Block<'static> {
    let block = Block::default().borders(Borders::ALL);
    if focused {
        let mut style =
            ratatui::style::Style::default().add_modifier(ratatui::style::Modifier::BOLD);
        if theme.color {
            style = style.fg(ratatui::style::Color::Cyan);
        }
        block
            .border_type(ratatui::widgets::BorderType::Thick)
            .border_style(style)
            .title(format!(" ▶ {title} · {hint} "))
    } else {
        block.title(format!(" {title} "))
    }
}

/// `[||||||    ]` of `width` cells filled to `fraction`.
fn bar(fraction: f64, width: usize) -> String {
    let filled = ((fraction.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("{}{}", "█".repeat(filled), "░".repeat(width - filled))
}

/// A centered rectangle of at most `w`×`h`.
fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width.saturating_sub(2));
    let h = h.min(area.height.saturating_sub(2));
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}

/// A text field's value with the cursor mark (`▏`) where the cursor is (`None`: the end).
pub fn with_cursor(text: &str, cursor: Option<usize>) -> String {
    match cursor {
        Some(at) if at < text.chars().count() => {
            let mut out: String = text.chars().take(at).collect();
            out.push('▏');
            out.extend(text.chars().skip(at));
            out
        }
        _ => format!("{text}▏"),
    }
}

/// About how many rows `lines` take wrapped to `width` (each line's width over the
/// panel's, rounded up; word wrapping can take a little more), for clamping a scroll.
fn wrapped_rows(lines: &[Line<'_>], width: u16) -> u16 {
    let width = usize::from(width.max(1));
    let rows: usize = lines.iter().map(|l| l.width().max(1).div_ceil(width)).sum();
    u16::try_from(rows).unwrap_or(u16::MAX)
}

/// The screen while a model opens: its name, a spinner and the time so far.
pub fn loading(frame: &mut Frame<'_>, what: &str, elapsed: std::time::Duration, status: &str) {
    let area = frame.area();
    let text = vec![
        Line::from(Span::styled(
            " devmap ",
            ratatui::style::Style::default().add_modifier(ratatui::style::Modifier::BOLD),
        )),
        Line::from(""),
        Line::from(format!(
            " {} opening {} … {:.1} s",
            spinner(elapsed),
            crate::text::escaped(what),
            elapsed.as_secs_f64()
        )),
        Line::from(" reading every header, placing every tensor; q quits"),
    ];
    let mut text = text;
    if !status.is_empty() {
        text.push(Line::from(format!(" {}", crate::text::escaped(status))));
    }
    frame.render_widget(Paragraph::new(text), area);
}
