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
use super::layout::Areas;
use theme::Theme;

/// The layout the app is drawn with (the progress panel takes room while a save is
/// shown).
pub fn app_areas(app: &App, area: Rect) -> Areas {
    app.layout(area)
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
    // A panel zoomed away or dropped on a narrow screen has no room: not drawn.
    let shown = |r: Rect| r.width > 2 && r.height > 2;
    if shown(a.tree) {
        tree::draw(app, frame, a.tree, theme);
    }
    if shown(a.details) {
        details::draw(app, frame, a.details, theme);
    }
    if let Some(p) = a.progress {
        panels::progress(app, frame, p, theme);
    }
    if shown(a.devices) {
        panels::devices(app, frame, a.devices, theme);
    }
    if shown(a.memory) {
        panels::memory(app, frame, a.memory, theme);
    }
    draw_status(app, frame, a.status, theme);
    match &app.mode {
        Mode::SaveDialog(d) => dialogs::save(app, d, frame, area, theme),
        Mode::Export(d) => dialogs::export(d, app.cursor, frame, area, theme),
        Mode::Help => dialogs::help(app.overlay_scroll, frame, area, theme),
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
        Mode::DevicePicker(picker) => dialogs::device_picker(app, picker, frame, area, theme),
        Mode::PlanPreview(preview) => {
            dialogs::plan_preview(&preview.lines, app.result_scroll, frame, area, theme);
        }
        Mode::Browse | Mode::Search(_) | Mode::Filter(_) => {}
    }
}

fn draw_title(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let root = &app.tree.nodes[0];
    let name = match (&app.ckpt.remote, &app.ckpt.title) {
        (Some(remote), _) => devmap_core::text::escaped(&remote.name).into_owned(),
        (None, Some(title)) => devmap_core::text::escaped(title).into_owned(),
        (None, None) => app.ckpt.dir.file_name().map_or_else(
            || devmap_core::text::path(&app.ckpt.dir),
            |n| devmap_core::text::escaped(&n.to_string_lossy()).into_owned(),
        ),
    };
    // The markers (edited, warnings) matter more than the counts: on a narrow
    // screen the params, then the tensor count, then the quantization go first, whole,
    // and only then is the name cut.
    let mut markers: Vec<Span> = Vec::new();
    if app.map_edited() && !app.map_unexported() {
        markers.push(Span::styled("  [map edited, exported]", theme.dim()));
    } else if app.map_edited() {
        markers.push(Span::styled("  [map edited]", theme.warn()));
    }
    if app.rows.sort() != crate::rows::Sort::Module {
        markers.push(Span::styled(
            format!("  [by {}]", app.rows.sort().label()),
            theme.dim(),
        ));
    }
    if let Some(f) = &app.filter {
        markers.push(Span::styled(
            format!("  [filter: {}]", devmap_core::text::escaped(f)),
            theme.warn(),
        ));
    }
    if !app.warnings.is_empty() {
        markers.push(Span::styled(
            format!(
                "  ! {}",
                devmap_core::text::count(app.warnings.len(), "warning", "warnings")
            ),
            theme.warn(),
        ));
    }
    // (what, the order it is left out in; `None`: kept).
    let mut facts: Vec<(String, Option<u8>)> = vec![
        (app.source_kind.clone(), Some(3)),
        (
            devmap_core::text::count(root.tensors, "tensor", "tensors"),
            Some(1),
        ),
        (devmap_core::human_bytes(root.bytes()), None),
        (
            format!("{} params", devmap_core::inspect::human_count(root.params)),
            Some(0),
        ),
    ];
    if let Some(q) = &app.ckpt.config.quantization {
        facts.push((format!("{} quantized", q.method), Some(2)));
    }
    let marker_width: usize = markers.iter().map(|s| s.content.chars().count()).sum();
    let width = usize::from(area.width);
    let facts_width = |facts: &[(String, Option<u8>)]| -> usize {
        facts.iter().map(|(f, _)| 3 + f.chars().count()).sum()
    };
    // " devmap · NAME" and the facts and markers.
    let needed = |facts: &[(String, Option<u8>)]| {
        10 + name.chars().count() + facts_width(facts) + marker_width
    };
    while needed(&facts) > width {
        let Some(at) = (0..facts.len())
            .filter(|&i| facts[i].1.is_some())
            .min_by_key(|&i| facts[i].1)
        else {
            break;
        };
        facts.remove(at);
    }
    // Still too wide: the name is what gives.
    let name_room = width.saturating_sub(10 + facts_width(&facts) + marker_width);
    let name = if name.chars().count() > name_room {
        name.chars()
            .take(name_room.saturating_sub(1))
            .collect::<String>()
            + "…"
    } else {
        name
    };
    let mut text = format!("· {name}");
    for (f, _) in &facts {
        text.push_str(" · ");
        text.push_str(f);
    }
    let mut spans = vec![Span::styled(" devmap ", theme.title()), Span::raw(text)];
    spans.extend(markers);
    frame.render_widget(Paragraph::new(fit(Line::from(spans), width)), area);
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
        (Mode::Filter(q), _) => Line::from(vec![
            Span::styled("filter ", theme.title()),
            Span::raw(with_cursor(q, app.cursor)),
            Span::styled(
                format!(
                    "   {}   {}",
                    devmap_core::text::count(app.rows.visible().len(), "row", "rows"),
                    keys::hint(&app.mode)
                ),
                theme.dim(),
            ),
        ]),
        (Mode::Search(q), _) => {
            // The count always shows; the query scrolls to keep its cursor in view;
            // the key hint takes what is left.
            let count = match app.match_position() {
                Some((at, of)) => format!("   {at}/{of}"),
                None => format!(
                    "   {}",
                    devmap_core::text::count(app.matches.len(), "match", "matches")
                ),
            };
            let hint = format!("   {}", keys::hint(&app.mode));
            let field_room = hint_width.saturating_sub(1 + count.chars().count()).max(4);
            let typed = q.chars().count() + 1;
            let (field, hint) = if typed + hint.chars().count() <= field_room {
                (with_cursor(q, app.cursor), hint)
            } else {
                (field_window(q, app.cursor, field_room), String::new())
            };
            Line::from(vec![
                Span::styled("/", theme.title()),
                Span::raw(field),
                Span::styled(format!("{count}{hint}"), theme.dim()),
            ])
        }
        // A message stands where the key bar is, in a dialog too (Tab's list of
        // completions in the save dialog was only seen once the dialog closed).
        (Mode::Browse | Mode::SaveDialog(_) | Mode::Export(_), Some(m)) => {
            let style = match m.tone {
                Tone::Info => ratatui::style::Style::default(),
                Tone::Good => theme.good(),
                Tone::Bad => theme.bad(),
            };
            Line::from(vec![Span::styled(
                devmap_core::text::escaped(&m.text).into_owned(),
                style,
            )])
        }
        (Mode::Browse, None) => {
            Line::from(Span::styled(keys::browse_hint(hint_width), theme.dim()))
        }
        (mode, _) => Line::from(Span::styled(keys::hint_in(mode, hint_width), theme.dim())),
    };
    let line = match busy {
        Some(busy) => {
            let mut spans = vec![Span::styled(busy, theme.warn())];
            spans.extend(line.spans);
            Line::from(spans)
        }
        None => line,
    };
    frame.render_widget(Paragraph::new(fit(line, usize::from(area.width))), area);
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

/// `line` cut to `width` cells: unchanged when it fits; otherwise it ends in `…` at
/// the last word boundary (a space, or after `,` `;` `:`) that leaves room for it, so
/// no number or name is cut in the middle, nor a number parted from its unit. Styles are kept span by span.
pub fn fit(line: Line<'_>, width: usize) -> Line<'_> {
    use unicode_width::UnicodeWidthStr;
    let total: usize = line.spans.iter().map(|s| s.content.width()).sum();
    if total <= width || width == 0 {
        return line;
    }
    // The text as one string, to find the cut, and each span's extent in it.
    let text: String = line.spans.iter().map(|s| s.content.as_ref()).collect();
    let budget = width - 1;
    let mut end = 0;
    let mut used = 0;
    let mut boundary = None;
    let mut previous = ' ';
    for (i, c) in text.char_indices() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
        if used + w > budget {
            break;
        }
        used += w;
        end = i + c.len_utf8();
        // A number and its unit (`20.72 GiB`, `10 s`) stay together.
        let before = std::mem::replace(&mut previous, c);
        if c == ' ' && !before.is_ascii_digit() {
            boundary = Some(i);
        } else if matches!(c, ',' | ';' | ':') {
            boundary = Some(end);
        }
    }
    // Cut at a boundary unless that throws away most of the room (one long word); a
    // cut at a boundary drops the separator and shows ` …`, a cut inside a word `…`.
    let (keep, mark) = match boundary {
        Some(b) if b * 2 >= end => (text[..b].trim_end_matches([' ', ',', ';', ':']), " …"),
        _ => (&text[..end], "…"),
    };
    let mut spans = Vec::new();
    let mut at = 0;
    for span in line.spans {
        let len = span.content.len();
        if at >= keep.len() {
            break;
        }
        let take = (keep.len() - at).min(len);
        spans.push(Span::styled(span.content[..take].to_owned(), span.style));
        at += len;
    }
    spans.push(Span::raw(mark));
    Line::from(spans).style(line.style)
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

/// A text field with its cursor in at most `width` cells: scrolled so the cursor
/// stays in view, a cut at either end marked `…`.
pub fn field_window(text: &str, cursor: Option<usize>, width: usize) -> String {
    let shown: Vec<char> = with_cursor(text, cursor).chars().collect();
    if shown.len() <= width || width < 3 {
        return shown.into_iter().take(width.max(1)).collect();
    }
    let at = shown
        .iter()
        .position(|&c| c == '▏')
        .unwrap_or(shown.len() - 1);
    // The window ends a little after the cursor, or at the end of the text.
    let end = (at + 1 + width / 4).clamp(width.min(shown.len()), shown.len());
    let start = end.saturating_sub(width);
    let mut out: Vec<char> = shown[start..end].to_vec();
    if start > 0 {
        out[0] = '…';
    }
    if end < shown.len() {
        let last = out.len() - 1;
        out[last] = '…';
    }
    out.into_iter().collect()
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
            devmap_core::text::escaped(what),
            elapsed.as_secs_f64()
        )),
        Line::from(" reading every header, placing every tensor; q quits"),
    ];
    let mut text = text;
    if !status.is_empty() {
        text.push(Line::from(format!(
            " {}",
            devmap_core::text::escaped(status)
        )));
    }
    frame.render_widget(Paragraph::new(text), area);
}

#[cfg(test)]
mod fit_tests {
    use super::fit;
    use ratatui::text::{Line, Span};

    fn text(line: &Line<'_>) -> String {
        line.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    #[test]
    fn lines_are_cut_at_a_boundary_never_inside_a_number() {
        let cut = |s: &str, w| text(&fit(Line::from(s.to_owned()), w));
        assert_eq!(
            cut("0% of 20.72 GiB", 40),
            "0% of 20.72 GiB",
            "fits: unchanged"
        );
        assert_eq!(cut("0% of 20.72 GiB", 10), "0% of …");
        assert_eq!(cut("free 20.1 GiB   cache 12.3 GiB", 20), "free 20.1 GiB …");
        assert_eq!(cut("graph from 944.64 MiB", 20), "graph from …");
        assert_eq!(
            cut(
                "3 shards in /o: model-1.safetensors, model-2.safetensors",
                45
            ),
            "3 shards in /o: model-1.safetensors …"
        );
        // One long word: cut inside it, marked.
        assert_eq!(cut("abcdefghijklmnop", 8), "abcdefg…");
        for w in 1..30 {
            let out = fit(
                Line::from("used 1.2 GiB – 1.3 GiB in 60 s; graph from 1 GiB"),
                w,
            );
            assert!(out.width() <= w, "{w}: {}", text(&out));
        }
    }

    #[test]
    fn styles_stay_with_their_spans() {
        let styled = Line::from(vec![
            Span::styled("gpu:0 ", ratatui::style::Style::default().bold()),
            Span::raw("6.39 KiB 0% of 24 GiB"),
        ]);
        let out = fit(styled, 18);
        assert_eq!(text(&out), "gpu:0 6.39 KiB …");
        assert!(
            out.spans[0]
                .style
                .add_modifier
                .contains(ratatui::style::Modifier::BOLD)
        );
    }
}
