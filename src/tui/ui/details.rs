//! The details panel, which doubles as "explain": why the selected node is where it
//! is and where its bytes come from.

use std::path::Path;

use crate::text::escaped;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};

use super::bar;
use super::theme::Theme;
use crate::human_bytes;
use crate::inspect::human_count;
use crate::model::checkpoint::{ByteRange, Source};
use crate::tui::app::App;

pub fn draw(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let block = super::focusable(
        "Details",
        app.focus == crate::tui::app::Focus::Details,
        "↑↓ scroll, Tab next",
        theme,
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let Some(id) = app.selected() else {
        return;
    };
    let node = &app.tree.nodes[id];
    let name = app.tree.full_name(id);
    // Names and paths come from the files: escaped (see crate::text) before drawing.
    let mut lines = vec![Line::from(Span::styled(
        escaped(&name).into_owned(),
        theme.title(),
    ))];
    let kv = |k: &str, v: String| {
        Line::from(vec![
            Span::styled(format!("{k:<10}"), theme.dim()),
            Span::raw(escaped(&v).into_owned()),
        ])
    };
    if let Some(t) = node.tensor() {
        let tensor = &app.ckpt.tensors()[t];
        lines.push(kv("dtype", tensor.dtype.to_string()));
        lines.push(kv("shape", format!("{:?}", tensor.shape)));
        lines.push(kv(
            "size",
            format!(
                "{} ({} B, {} params)",
                human_bytes(tensor.bytes()),
                tensor.bytes(),
                human_count(tensor.numel())
            ),
        ));
        lines.push(Line::from(vec![
            Span::styled(format!("{:<10}", "device"), theme.dim()),
            Span::styled(tensor.placement.to_string(), theme.device(tensor.placement)),
        ]));
        lines.push(kv("because", because(app, app.ckpt.map_key(tensor))));
        if let Some((runtime, part)) =
            crate::model::arch::loaded_as(&app.ckpt.config.architectures, &tensor.name)
        {
            lines.push(kv("loaded as", format!("{runtime} ({part})")));
        }
        lines.push(kv("bytes in", source_text(app, tensor.source)));
        if let (Source::Offload(_), Some(old)) = (tensor.source, app.ckpt.checkpoint_range(t)) {
            lines.push(kv(
                "replaces",
                format!("{} (older value)", range_text(app, old)),
            ));
        }
        if let Some(load) = tensor.load_dtype {
            lines.push(kv(
                "loads as",
                format!("{} (stored {})", load.torch_name(), tensor.dtype),
            ));
        }
        if let Some(group) = app.ckpt.tie_group(t) {
            let members: Vec<String> = group
                .members
                .iter()
                .enumerate()
                .map(|(i, &m)| {
                    let mark = if i == 0 { " (kept on save)" } else { "" };
                    format!(
                        "{} [{}]{mark}",
                        app.ckpt.tensors()[m].name,
                        app.ckpt.tensors()[m].placement
                    )
                })
                .collect();
            lines.push(Line::from(vec![
                Span::styled(format!("{:<10}", "tied"), theme.dim()),
                Span::styled(members.join(" = "), theme.tie()),
            ]));
            lines.push(kv("evidence", group.evidence.label().to_owned()));
        }
        if let Some(part) = crate::model::quantized::quantized_part(&app.ckpt, t) {
            let dtype = crate::model::quantized::dequantized_dtype(&app.ckpt);
            let bytes = part.dequantized_bytes(dtype);
            let text = match part {
                crate::model::quantized::QuantizedPart::Weight { format, scales, .. } => format!(
                    "{format}; scales in {scales}; {} as {}",
                    human_bytes(bytes),
                    dtype.torch_name()
                ),
                crate::model::quantized::QuantizedPart::Scales { of } => {
                    format!("the scales of {of}")
                }
            };
            lines.push(kv("quantized", text));
        }
        for m in app.ckpt.merges_of(t) {
            lines.push(Line::from(vec![
                Span::styled(format!("{:<10}", "lora"), theme.dim()),
                Span::styled(
                    format!(
                        "+ {} ({}, rank {}, scale {}) on save",
                        crate::text::escaped(&m.adapter),
                        m.kind_name(),
                        m.rank,
                        m.scale
                    ),
                    theme.good(),
                ),
            ]));
        }
    } else {
        lines.push(kv(
            "module",
            format!(
                "{}, {} params",
                crate::text::count(node.tensors, "tensor", "tensors"),
                human_count(node.params)
            ),
        ));
        lines.push(kv("size", human_bytes(node.bytes())));
        if let Some(map) = &app.ckpt.device_map
            && let Some(p) = map.get(&name)
        {
            lines.push(kv("map key", format!("`{name}` → {p}")));
        }
        if node.has_tie {
            lines.push(Line::from(Span::styled(
                "holds tied weights (t on a tensor jumps)",
                theme.tie(),
            )));
        }
        lines.push(Line::from(Span::styled("split", theme.dim())));
        let total = node.bytes().max(1) as f64;
        let bar_w = (inner.width as usize).saturating_sub(28).clamp(4, 20);
        for (p, b) in &node.split {
            lines.push(Line::from(vec![
                Span::styled(format!("  {:<9}", p.to_string()), theme.device(*p)),
                Span::styled(bar(*b as f64 / total, bar_w), theme.device(*p)),
                Span::raw(format!(
                    " {:>10} {:>3.0}%",
                    human_bytes(*b),
                    *b as f64 * 100.0 / total
                )),
            ]));
        }
    }
    // Scrolled no further than its last line.
    let total = super::wrapped_rows(&lines, inner.width);
    let paragraph = Paragraph::new(lines).wrap(Wrap { trim: false });
    let scroll = app.details_scroll.min(total.saturating_sub(inner.height));
    frame.render_widget(paragraph.scroll((scroll, 0)), inner);
}

fn because(app: &App, key: Option<&str>) -> String {
    match (&app.ckpt.device_map, key) {
        (None, _) => "no device map: everything is on cpu".into(),
        (Some(_), Some("")) => "the map's \"\" entry covers the whole model".into(),
        (Some(_), Some(k)) => format!("device-map key `{k}`"),
        (Some(_), None) => "no device-map key covers it (unmapped)".into(),
    }
}

fn source_text(app: &App, source: Source) -> String {
    match source {
        Source::Checkpoint(r) => range_text(app, r),
        Source::Offload(r) => format!("offload {}", range_text(app, r)),
        Source::Adapter(r) => format!("adapter {}", range_text(app, r)),
        Source::Pieces(index) => {
            let pieces = app.ckpt.pieces(index);
            let mut files: Vec<String> = pieces
                .iter()
                .map(|p| relative(app.ckpt.file_path(p.range.file), &app.ckpt.dir))
                .collect();
            files.dedup();
            format!(
                "{} in {}: {}",
                crate::text::count(pieces.len(), "chunk", "chunks"),
                crate::text::count(files.len(), "file", "files"),
                crate::model::warning::name_list(&files)
            )
        }
        Source::Tied(to) => format!("tie partner {}", app.ckpt.tensors()[to].name),
        Source::None => "nowhere (meta: cannot be saved)".into(),
    }
}

fn range_text(app: &App, r: ByteRange) -> String {
    let path = app.ckpt.file_path(r.file);
    format!("{} @ {}", relative(path, &app.ckpt.dir), r.offset)
}

/// Paths inside the model directory are shown relative to it.
fn relative(path: &Path, dir: &Path) -> String {
    path.strip_prefix(dir)
        .map_or_else(|_| path.display().to_string(), |p| p.display().to_string())
}
