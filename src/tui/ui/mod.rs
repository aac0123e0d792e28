//! Drawing: a pure function of `&App`. Nothing here does I/O or changes state.

mod details;
mod dialogs;
mod panels;
pub mod theme;
mod tree;

use ratatui::Frame;
use ratatui::layout::{Constraint, Direction, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};

use super::app::{App, Mode, Tone};
use super::keys;
use theme::Theme;

/// Below this the screen shows a message instead of a squeezed layout.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 16;

/// Where everything goes on a screen of a given size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Areas {
    pub title: Rect,
    pub tree: Rect,
    pub details: Rect,
    pub progress: Option<Rect>,
    pub devices: Rect,
    pub memory: Rect,
    pub status: Rect,
    /// Tree rows that fit (inside the border, below the header).
    pub tree_rows: usize,
}

pub fn layout_for(width: u16, height: u16) -> Areas {
    areas(Rect::new(0, 0, width, height), false)
}

fn areas(area: Rect, with_progress: bool) -> Areas {
    let bottom = if area.height >= 30 { 8 } else { 6 };
    let progress = if with_progress { 6 } else { 0 };
    let rows = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(1),
            Constraint::Min(5),
            Constraint::Length(progress),
            Constraint::Length(bottom),
            Constraint::Length(1),
        ])
        .split(area);
    let middle = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(62), Constraint::Percentage(38)])
        .split(rows[1]);
    let lower = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(55), Constraint::Percentage(45)])
        .split(rows[3]);
    Areas {
        title: rows[0],
        tree: middle[0],
        details: middle[1],
        progress: with_progress.then_some(rows[2]),
        devices: lower[0],
        memory: lower[1],
        status: rows[4],
        tree_rows: middle[0].height.saturating_sub(3) as usize,
    }
}

/// The layout the app is drawn with (the progress panel takes room while a save is
/// shown).
pub fn app_areas(app: &App, area: Rect) -> Areas {
    areas(area, app.save.is_some())
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
        Mode::Export(d) => dialogs::export(d, frame, area, theme),
        Mode::Help => dialogs::help(frame, area, theme),
        Mode::Confirm(c) => dialogs::confirm(c, frame, area, theme),
        Mode::Plan(d) => dialogs::plan(d, frame, area, theme),
        Mode::PlanResult(lines) => dialogs::plan_result(lines, frame, area, theme),
        Mode::Browse | Mode::Search(_) => {}
    }
}

fn draw_title(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let root = &app.tree.nodes[0];
    let name = app.ckpt.dir.file_name().map_or_else(
        || app.ckpt.dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let mut spans = vec![
        Span::styled(" devmap ", theme.title()),
        Span::raw(format!(
            "· {name} · {} tensors · {} · {} params",
            root.tensors,
            crate::human_bytes(root.bytes),
            crate::inspect::human_count(root.params)
        )),
    ];
    if app.map_edited {
        spans.push(Span::styled("  [map edited]", theme.warn()));
    }
    if !app.warnings.is_empty() {
        spans.push(Span::styled(
            format!("  ! {} warning(s)", app.warnings.len()),
            theme.warn(),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn draw_status(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let line = match (&app.mode, &app.message) {
        (Mode::Search(q), _) => Line::from(vec![
            Span::styled("/", theme.title()),
            Span::raw(q.clone()),
            Span::styled("▏", theme.dim()),
            Span::styled(
                format!(
                    "   {} match(es)   {}",
                    app.matches.len(),
                    keys::hint(&app.mode)
                ),
                theme.dim(),
            ),
        ]),
        (Mode::Browse, Some(m)) => {
            let style = match m.tone {
                Tone::Info => ratatui::style::Style::default(),
                Tone::Good => theme.good(),
                Tone::Bad => theme.bad(),
            };
            Line::from(vec![Span::styled(m.text.clone(), style)])
        }
        (mode, _) => Line::from(Span::styled(keys::hint(mode), theme.dim())),
    };
    frame.render_widget(Paragraph::new(line), area);
}

/// A bordered block with a title.
fn panel(title: &str) -> Block<'_> {
    Block::default()
        .borders(Borders::ALL)
        .title(format!(" {title} "))
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
