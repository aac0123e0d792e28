//! The details panel, which doubles as "explain": why the selected node is where it
//! is and where its bytes come from.

use std::path::Path;

use devmap_core::text::escaped;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};

use super::bar;
use super::theme::Theme;
use crate::app::App;
use devmap_core::human_bytes;
use devmap_core::inspect::human_count;
use devmap_core::model::checkpoint::{ByteRange, Source};

pub fn draw(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let block = super::focusable(
        "Details",
        app.focus == crate::app::Focus::Details,
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
    // Names and paths come from the files: escaped (see devmap_core::text) before drawing.
    let mut lines = vec![Line::from(Span::styled(
        escaped(&name).into_owned(),
        theme.title(),
    ))];
    // A value too long for the panel continues under the value column, never under
    // the labels (and a short one never breaks: the rows below are laid out to fit).
    let width = usize::from(inner.width);
    let labelled = |k: &str, text: &str, style: ratatui::style::Style| {
        let mut rows = continued(text, width.saturating_sub(LABEL).max(8)).into_iter();
        let mut lines = vec![Line::from(vec![
            Span::styled(format!("{k:<LABEL$}"), theme.dim()),
            Span::styled(rows.next().unwrap_or_default(), style),
        ])];
        lines.extend(rows.map(|r| {
            Line::from(vec![
                Span::raw(format!("{:LABEL$}", "")),
                Span::styled(r, style),
            ])
        }));
        lines
    };
    let kv = |k: &str, v: String| labelled(k, &escaped(&v), ratatui::style::Style::default());
    if let Some(t) = node.tensor() {
        let tensor = &app.ckpt.tensors()[t];
        lines.extend(kv("dtype", tensor.dtype.to_string()));
        lines.extend(kv("shape", format!("{:?}", tensor.shape)));
        let size = human_bytes(tensor.held_bytes());
        let exact = format!("{} B", tensor.held_bytes());
        lines.extend(kv(
            "size",
            if size == exact {
                size
            } else {
                format!("{size} ({exact})")
            },
        ));
        lines.extend(kv("params", human_count(tensor.numel())));
        lines.push(Line::from(vec![
            Span::styled(format!("{:<LABEL$}", "device"), theme.dim()),
            Span::styled(tensor.placement.to_string(), theme.device(tensor.placement)),
        ]));
        lines.extend(kv("because", because(app, app.ckpt.map_key(tensor))));
        if let Some((runtime, part)) =
            devmap_core::model::arch::loaded_as(&app.ckpt.config.architectures, &tensor.name)
        {
            lines.extend(kv("loaded as", format!("{runtime} ({part})")));
        }
        lines.extend(kv("bytes in", source_text(app, tensor.source)));
        // A tensor stored in blocks across a training run's ranks: each block, and
        // the dimension they split.
        if let Source::Pieces(index) = tensor.source {
            let pieces = app.ckpt.pieces(index);
            let split: Vec<usize> = (0..tensor.shape.len())
                .filter(|&d| {
                    pieces
                        .iter()
                        .any(|p| p.offsets.get(d) != pieces[0].offsets.get(d))
                })
                .collect();
            lines.extend(kv(
                "split",
                match split.as_slice() {
                    [] => "not split (each rank holds it whole)".to_owned(),
                    [d] => format!("along dim {d} in {} blocks", pieces.len()),
                    dims => format!("along dims {dims:?} in {} blocks", pieces.len()),
                },
            ));
            for p in pieces.iter().take(16) {
                let path = app.ckpt.file_path(p.range.file);
                let rank = devmap_core::formats::split::rank_of(path)
                    .map_or_else(|| "rank ?".to_owned(), |r| format!("rank {r}"));
                lines.extend(kv(
                    &rank,
                    format!(
                        "at {:?} size {:?} ({}, {})",
                        p.offsets,
                        p.sizes,
                        human_bytes(p.range.len),
                        relative(path, &app.ckpt.dir)
                    ),
                ));
            }
            if pieces.len() > 16 {
                lines.extend(kv("", format!("and {} more blocks", pieces.len() - 16)));
            }
        }
        if let (Source::Offload(_), Some(old)) = (tensor.source, app.ckpt.checkpoint_range(t)) {
            lines.extend(kv(
                "replaces",
                format!("{} (older value)", range_text(app, old)),
            ));
        }
        if let Some(load) = tensor.load_dtype {
            lines.extend(kv(
                "loads as",
                format!(
                    "{} (stored {}, {})",
                    load.torch_name(),
                    tensor.dtype,
                    human_bytes(tensor.bytes())
                ),
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
            lines.extend(labelled("tied", &members.join(" = "), theme.tie()));
            lines.extend(kv("evidence", group.evidence.label().to_owned()));
        }
        if let Some(part) = devmap_core::model::quantized::quantized_part(&app.ckpt, t) {
            let dtype = devmap_core::model::quantized::dequantized_dtype(&app.ckpt);
            let bytes = part.dequantized_bytes(dtype);
            let text = match part {
                devmap_core::model::quantized::QuantizedPart::Weight { format, scales, .. } => {
                    format!(
                        "{format}; scales in {scales}; {} as {}",
                        human_bytes(bytes),
                        dtype.torch_name()
                    )
                }
                devmap_core::model::quantized::QuantizedPart::Scales { of } => {
                    format!("the scales of {of}")
                }
            };
            lines.extend(kv("quantized", text));
        }
        for m in app.ckpt.merges_of(t) {
            lines.push(Line::from(vec![
                Span::styled(format!("{:<LABEL$}", "lora"), theme.dim()),
                Span::styled(
                    format!(
                        "+ {} ({}, rank {}, scale {}) on save",
                        devmap_core::text::escaped(&m.adapter),
                        m.kind_name(),
                        m.rank,
                        m.scale
                    ),
                    theme.good(),
                ),
            ]));
        }
    } else {
        lines.extend(kv(
            "module",
            devmap_core::text::count(node.tensors, "tensor", "tensors"),
        ));
        lines.extend(kv("params", human_count(node.params)));
        lines.extend(kv("size", human_bytes(node.bytes())));
        // The training run's ranks, on the top-level modules of a sharded checkpoint.
        if node.depth == 1 {
            let shares = app.ckpt.rank_shares();
            let all = shares.iter().map(|(_, b)| b).sum::<u64>().max(1);
            for (rank, bytes) in shares.iter().take(16) {
                lines.extend(kv(
                    &format!("rank {rank}"),
                    format!(
                        "{} ({:.0}% of the stored blocks)",
                        human_bytes(*bytes),
                        *bytes as f64 * 100.0 / all as f64
                    ),
                ));
            }
        }
        if let Some(map) = &app.ckpt.device_map
            && let Some(p) = map.get(&name)
        {
            // The key is the module's own name (the title above).
            lines.extend(kv("map key", format!("{p} (own key)")));
        }
        if node.has_tie {
            lines.push(Line::from(Span::styled(
                "holds tied weights (t on a tensor jumps)",
                theme.tie(),
            )));
        }
        lines.push(Line::from(Span::styled("split", theme.dim())));
        let total = node.bytes().max(1) as f64;
        // `  gpu:0    ███ 612 B  100%`: the bar takes what the device, size and share
        // leave (none on a narrow panel), so the row never wraps.
        let bar_w = width.saturating_sub(SPLIT_TEXT).min(20);
        for (p, b) in &node.split {
            let mut row = vec![Span::styled(
                format!("  {:<9}", p.to_string()),
                theme.device(*p),
            )];
            if bar_w >= 2 {
                row.push(Span::styled(
                    bar(*b as f64 / total, bar_w),
                    theme.device(*p),
                ));
            }
            row.push(Span::raw(format!(
                " {:>10} {:>3.0}%",
                human_bytes(*b),
                *b as f64 * 100.0 / total
            )));
            lines.push(Line::from(row));
        }
    }
    // Scrolled no further than its last line. The name (the title row) may wrap;
    // every other row was cut to the panel above.
    let total = super::wrapped_rows(&lines, inner.width);
    let paragraph = Paragraph::new(lines).wrap(Wrap { trim: false });
    let scroll = app.details_scroll.min(total.saturating_sub(inner.height));
    frame.render_widget(paragraph.scroll((scroll, 0)), inner);
}

/// The label column's width.
const LABEL: usize = 10;
/// A split row without its bar: `  ` + device (9) + ` ` + size (10: `515.50 KiB`) +
/// ` ` + `100%`.
const SPLIT_TEXT: usize = 2 + 9 + 1 + 10 + 1 + 4;

/// `text` in rows of at most `width` characters, broken after a space, `/`, `.` or
/// `,` where one is near the end of a row (so paths and names break at their parts).
fn continued(text: &str, width: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut rows = Vec::new();
    let mut start = 0;
    while chars.len() - start > width {
        let end = start + width;
        let cut = (start + width / 2..end)
            .rev()
            .find(|&i| matches!(chars[i], ' ' | '/' | '.' | ','))
            .map_or(end, |i| i + 1);
        rows.push(
            chars[start..cut]
                .iter()
                .collect::<String>()
                .trim_end()
                .to_owned(),
        );
        start = cut;
        while start < chars.len() && chars[start] == ' ' {
            start += 1;
        }
    }
    rows.push(chars[start..].iter().collect());
    rows
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
                devmap_core::text::count(pieces.len(), "chunk", "chunks"),
                devmap_core::text::count(files.len(), "file", "files"),
                devmap_core::model::warning::name_list(&files)
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

#[cfg(test)]
mod tests {
    use super::continued;

    #[test]
    fn long_values_break_at_their_parts_and_short_ones_stay_whole() {
        assert_eq!(continued("612 B", 18), vec!["612 B"]);
        let rows = continued("model-00001-of-00002.safetensors @ 123456", 18);
        assert!(rows.iter().all(|r| r.chars().count() <= 18), "{rows:?}");
        assert_eq!(
            rows.concat().replace(' ', ""),
            "model-00001-of-00002.safetensors@123456"
        );
        // A word longer than a row is cut at the row's end.
        assert_eq!(continued("abcdefghij", 4), vec!["abcd", "efgh", "ij"]);
    }
}
