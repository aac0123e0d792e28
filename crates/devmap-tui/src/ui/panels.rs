//! The lower panels: per-device totals against budgets, the live memory gauge, and
//! the save progress.

use ratatui::Frame;
use ratatui::layout::{Constraint, Direction, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Sparkline};

use super::theme::Theme;
use super::{bar, fit, panel};
use crate::app::{App, Outcome};
use devmap_core::human_bytes;
use devmap_core::types::placement::Placement;

/// `tp 2, ep 2, pp 2` (the parts that are not 1; `tp 1` when all are).
fn layout_name(layout: devmap_core::plan::parallel::Layout) -> String {
    let parts: Vec<String> = [("tp", layout.tp), ("ep", layout.ep), ("pp", layout.pp)]
        .iter()
        .filter(|(_, n)| *n > 1)
        .map(|(name, n)| format!("{name} {n}"))
        .collect();
    if parts.is_empty() {
        "tp 1".to_owned()
    } else {
        parts.join(", ")
    }
}

pub fn devices(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    // The bars are each device's share of the model (they add up to 100%); the
    // figure after them is the device's budget, chosen or free.
    // With `--context`, each device's row is its weights and the KV cache its layers
    // hold, against its budget.
    let what = match &app.kv {
        Some(kv) => format!(
            "Devices + KV{} at {}",
            if kv.act.is_some() { " + act." } else { "" },
            devmap_core::text::count(kv.cache.request.context as usize, "token", "tokens")
        ),
        None => "Devices".to_owned(),
    };
    let title = match app.budgets.chosen_from {
        Some(from) => format!("{what} · ≤ {from} budgets"),
        None => format!("{what} · ≤ free"),
    };
    let kv_on = |p: Placement| {
        app.kv.as_ref().map_or(0, |kv| {
            kv.on(&app.ckpt, p) + kv.activations_on(&app.ckpt, p)
        })
    };
    let block = super::focusable(
        &title,
        app.focus == crate::app::Focus::Devices,
        "↑↓ scroll, Tab next",
        theme,
    );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    // Each row's share of all the rows: weights, and with --context what runs.
    let total = app
        .device_totals()
        .into_iter()
        .map(|(p, weights)| weights + kv_on(p))
        .sum::<u64>()
        .max(1);
    let width = inner.width as usize;
    // The root's split is the per-device total, kept current by `recompute`: no walk
    // over every tensor per frame.
    let devices: Vec<(Placement, DeviceRow)> = app
        .device_totals()
        .into_iter()
        .map(|(p, weights)| {
            let bytes = weights + kv_on(p);
            let budget = app.device_budget(p);
            let over = budget.is_some_and(|b| bytes > b);
            let row = DeviceRow {
                device: p.to_string(),
                bytes: human_bytes(bytes),
                share: bytes as f64 / total as f64,
                budget: budget.map(|b| {
                    let word = if over { "OVER" } else { "≤" };
                    format!("{word} {}", human_bytes(b))
                }),
                over,
            };
            (p, row)
        })
        .collect();
    // One layout for every row, so the bars line up: budgets shown when all fit (an
    // OVER always is), the bar in what is left.
    let widest = devices
        .iter()
        .map(|(_, r)| r.budget.as_deref().map_or(0, |b| b.chars().count() + 2))
        .max()
        .unwrap_or(0);
    let budgets_fit = DeviceRow::TEXT + widest <= width;
    let bar_w = width
        .saturating_sub(DeviceRow::TEXT + if budgets_fit { widest } else { 0 } + 1)
        .min(20);
    let rows: Vec<(Line, bool)> = devices
        .into_iter()
        .map(|(p, row)| {
            let style = if row.over {
                theme.bad()
            } else {
                theme.device(p)
            };
            (row.line(bar_w, budgets_fit, style, theme), row.over)
        })
        .collect();
    // With --tp, the last line names the largest GPU of that layout.
    let largest = app.parallel.as_ref().and_then(|s| {
        let r = s.largest()?;
        let bytes = r.weights + r.kv;
        let budget = app.device_budget(Placement::Gpu(r.rank as u32));
        let over = budget.is_some_and(|b| bytes > b);
        let text = format!(
            "vLLM {}: largest GPU rank {} of {}, {}{}",
            layout_name(s.layout),
            r.rank,
            s.ranks.len(),
            human_bytes(bytes),
            match budget {
                Some(b) if over => format!(" OVER {}", human_bytes(b)),
                Some(b) => format!(" ≤ {}", human_bytes(b)),
                None => String::new(),
            }
        );
        Some(Line::from(Span::styled(
            text,
            if over { theme.bad() } else { theme.dim() },
        )))
    });
    let room = (inner.height as usize).saturating_sub(usize::from(largest.is_some()));
    let lines: Vec<Line> = if rows.len() <= room {
        rows.into_iter().map(|(l, _)| l).collect()
    } else if app.devices_scroll > 0 {
        // Scrolled by the user (Tab to the panel, then ↑/↓): plain rows from there.
        let first = usize::from(app.devices_scroll).min(rows.len() - room);
        rows.into_iter()
            .skip(first)
            .take(room)
            .map(|(l, _)| l)
            .collect()
    } else {
        // More devices than lines: every device over its budget stays, then the rest in
        // order, and the last line counts what is not shown.
        let keep = room.saturating_sub(1);
        let mut chosen: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].1).take(keep).collect();
        for i in 0..rows.len() {
            if chosen.len() >= keep {
                break;
            }
            if !chosen.contains(&i) {
                chosen.push(i);
            }
        }
        chosen.sort_unstable();
        let hidden = rows.len() - chosen.len();
        let hidden_over = (0..rows.len())
            .filter(|i| rows[*i].1 && !chosen.contains(i))
            .count();
        let mut lines: Vec<Line> = chosen.iter().map(|&i| rows[i].0.clone()).collect();
        lines.push(if hidden_over > 0 {
            Line::from(Span::styled(
                format!(
                    "… {}, {hidden_over} of them OVER",
                    devmap_core::text::count(hidden, "more device", "more devices")
                ),
                theme.bad(),
            ))
        } else {
            Line::from(Span::styled(
                format!(
                    "… {}, all within budget",
                    devmap_core::text::count(hidden, "more device", "more devices")
                ),
                theme.dim(),
            ))
        });
        lines
    };
    let lines: Vec<Line> = lines
        .into_iter()
        .chain(largest)
        .map(|l| fit(l, inner.width as usize))
        .collect();
    frame.render_widget(Paragraph::new(lines), inner);
}

/// One row of the Devices panel: what does not fit is dropped whole (the bar first,
/// then the budget unless it is OVER), never cut mid-phrase.
struct DeviceRow {
    device: String,
    bytes: String,
    /// Of the model's bytes.
    share: f64,
    /// `≤ 24 GiB` or `OVER 300 KB`, when a budget is known.
    budget: Option<String>,
    over: bool,
}

impl DeviceRow {
    /// The device, its bytes and its share: `gpu:0      4.39 KiB  48%`.
    const TEXT: usize = 9 + 10 + 5;

    /// `gpu:0      4.39 KiB ████  48%  ≤ 24 GiB`
    fn line(
        &self,
        bar_w: usize,
        budgets_fit: bool,
        style: ratatui::style::Style,
        theme: Theme,
    ) -> Line<'static> {
        let share = format!(" {:>3.0}%", self.share * 100.0);
        let budget = self
            .budget
            .as_ref()
            .filter(|_| budgets_fit || self.over)
            .map(|b| format!("  {b}"));
        let mut spans = vec![
            Span::styled(format!("{:<9}", self.device), style),
            Span::raw(format!("{:>10}", self.bytes)),
        ];
        if bar_w >= 4 {
            spans.push(Span::raw(" "));
            spans.push(Span::styled(bar(self.share, bar_w), style));
        }
        spans.push(Span::styled(share, theme.dim()));
        if let Some(b) = budget {
            spans.push(Span::styled(
                b,
                if self.over { theme.bad() } else { theme.dim() },
            ));
        }
        Line::from(spans)
    }
}

pub fn memory(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let block = panel("Memory");
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let Some(latest) = app.memory.back() else {
        frame.render_widget(
            Paragraph::new(Span::styled("waiting for a reading…", theme.dim())),
            inner,
        );
        return;
    };
    let gpu_rows = if app.gpus.is_empty() {
        u16::from(app.gpu_note.is_some())
    } else {
        app.gpus.len() as u16
    };
    let rows = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Length(gpu_rows),
            Constraint::Min(1),
        ])
        .split(inner);
    let fraction = latest.used as f64 / latest.total.max(1) as f64;
    let numbers = format!("{}/{}", human_bytes(latest.used), human_bytes(latest.total));
    // Narrow panels drop the bar first, then the label.
    let room = inner.width as usize;
    let gauge = if room >= numbers.len() + 12 {
        let w = room - numbers.len() - 7;
        Line::from(vec![
            Span::raw("RAM "),
            Span::styled(bar(fraction, w), theme.gauge()),
            Span::raw(format!(" {numbers}")),
        ])
    } else if room >= numbers.len() + 4 {
        Line::from(format!("RAM {numbers}"))
    } else {
        Line::from(numbers)
    };
    frame.render_widget(Paragraph::new(gauge), rows[0]);
    frame.render_widget(
        Paragraph::new(fit(
            Line::from(vec![
                Span::styled("devmap ", theme.dim()),
                Span::raw(human_bytes(latest.rss)),
                Span::styled(
                    format!("   free {}", human_bytes(latest.available)),
                    theme.dim(),
                ),
                Span::styled(
                    format!("   cache {}", human_bytes(latest.cached)),
                    theme.dim(),
                ),
            ]),
            room,
        )),
        rows[1],
    );
    let gpu_lines: Vec<Line> = if app.gpus.is_empty() {
        app.gpu_note
            .iter()
            .map(|n| Line::from(Span::styled(n.clone(), theme.dim())))
            .collect()
    } else {
        app.gpus
            .iter()
            .map(|g| {
                let used = g.total.saturating_sub(g.free);
                let numbers = format!("{}/{}", human_bytes(used), human_bytes(g.total));
                let label = format!("GPU{} ", g.index);
                let style = theme.device(Placement::Gpu(g.index));
                let w = room.saturating_sub(numbers.len() + label.len() + 1);
                let mut spans = vec![Span::styled(label, style)];
                // Narrow panels drop the bar first, as the RAM gauge does.
                if w >= 6 {
                    spans.push(Span::styled(
                        bar(used as f64 / g.total.max(1) as f64, w),
                        style,
                    ));
                }
                spans.push(Span::raw(format!(" {numbers}")));
                Line::from(spans)
            })
            .collect()
    };
    let gpu_lines: Vec<Line> = gpu_lines.into_iter().map(|l| fit(l, room)).collect();
    frame.render_widget(Paragraph::new(gpu_lines), rows[2]);
    let rows = [rows[0], rows[1], rows[3]];
    // The last minute of used RAM, drawn above its own low point so that the change a
    // save makes is visible next to gigabytes that do not move.
    let width = rows[2].width as usize;
    let history: Vec<u64> = app
        .memory
        .iter()
        .rev()
        .take(width)
        .map(|s| s.used)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let low = history.iter().copied().min().unwrap_or(0);
    let high = history.iter().copied().max().unwrap_or(0);
    let floor = low.saturating_sub((high - low) / 4 + latest.total / 200);
    let lifted: Vec<u64> = history.iter().map(|u| u - floor).collect();
    let spark = Sparkline::default()
        .data(&lifted)
        .max((high - floor).max(1))
        .style(theme.gauge());
    // The graph is magnified to show small changes, so it says what its height spans.
    let mut graph = rows[2];
    if graph.height >= 2 && !history.is_empty() {
        let scale = Rect { height: 1, ..graph };
        graph.y += 1;
        graph.height -= 1;
        let seconds = devmap_core::monitor::SAMPLE_INTERVAL.as_secs_f64() * history.len() as f64;
        let label = format!(
            "used {} – {} in {seconds:.0} s; graph from {}",
            devmap_core::human_bytes(low),
            devmap_core::human_bytes(high),
            devmap_core::human_bytes(floor),
        );
        frame.render_widget(
            Paragraph::new(fit(Line::from(label), room)).style(theme.dim()),
            scale,
        );
    }
    frame.render_widget(spark, graph);
}

pub fn progress(app: &App, frame: &mut Frame<'_>, area: Rect, theme: Theme) {
    let Some(save) = &app.save else { return };
    let title = match &save.outcome {
        None if save.cancel_requested => "Save — cancelling",
        None => "Save — running (Esc cancels)",
        Some(Outcome::Done(_)) => match save.verify.as_ref().map(|v| &v.outcome) {
            None => "Save — done (v verifies, Esc closes)",
            Some(None) => "Save — done · verifying (Esc stops)",
            Some(Some(Ok(r))) if r.differences() == 0 => "Save — done · verified",
            Some(Some(_)) => "Save — done · verify found problems",
        },
        Some(Outcome::Failed(_)) => "Save — failed",
        Some(Outcome::Cancelled) => "Save — cancelled",
    };
    let block = panel(title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let width = inner.width as usize;
    let overall = save.written as f64 / save.total.max(1) as f64;
    // While it runs: the rate and the time left. Done: the average rate. Cancelled or
    // failed: neither (a rate or an ETA there would be stale).
    let rate = app
        .save_rate()
        .and_then(|(r, eta)| match &save.outcome {
            None => {
                let eta = if eta.is_finite() {
                    format!("{eta:.0}s")
                } else {
                    "?".into()
                };
                Some(format!("  {}/s  ETA {eta}", human_bytes(r as u64)))
            }
            Some(Outcome::Done(_)) => Some(format!("  {}/s", human_bytes(r as u64))),
            Some(_) => None,
        })
        .unwrap_or_default();
    let head = format!(
        "→ {}  {} / {}{rate}",
        save.out.display(),
        human_bytes(save.written),
        human_bytes(save.total)
    );
    let mut lines = vec![Line::from(head)];
    let bar_w = width.saturating_sub(14).max(4);
    lines.push(Line::from(vec![
        Span::raw("all     "),
        Span::styled(bar(overall, bar_w), theme.gauge()),
        Span::raw(format!(" {:>3.0}%", overall * 100.0)),
    ]));
    match &save.outcome {
        Some(Outcome::Done(r)) => {
            lines.push(Line::from(Span::styled(
                format!(
                    "{} in {}: {}",
                    devmap_core::text::count(r.shard_files.len(), "shard", "shards"),
                    r.out.display(),
                    r.shard_files.join(", ")
                ),
                theme.good(),
            )));
            lines.push(verify_line(save, bar_w, theme));
        }
        Some(Outcome::Failed(why)) => {
            lines.push(Line::from(Span::styled(why.clone(), theme.bad())));
        }
        Some(Outcome::Cancelled) => lines.push(Line::from("no shard was left behind")),
        None => {
            // A window of shards around the current one.
            let room = inner.height.saturating_sub(2) as usize;
            let current = save.current.unwrap_or(0);
            let first = current
                .saturating_sub(room / 2)
                .min(save.shards.len().saturating_sub(room));
            let name_w = 34.min(width / 2);
            for s in save.shards.iter().skip(first).take(room) {
                let f = s.written as f64 / s.bytes.max(1) as f64;
                let w = width.saturating_sub(name_w + 8).max(4);
                let mark = if s.done { "✓" } else { " " };
                lines.push(Line::from(vec![
                    Span::raw(format!(
                        "{mark}{:<name_w$} ",
                        s.file_name.chars().take(name_w).collect::<String>()
                    )),
                    Span::styled(bar(f, w), if s.done { theme.good() } else { theme.gauge() }),
                    Span::raw(format!(" {:>3.0}%", f * 100.0)),
                ]));
            }
        }
    }
    let lines: Vec<Line> = lines.into_iter().map(|l| fit(l, width)).collect();
    frame.render_widget(Paragraph::new(lines), inner);
}

/// The save panel's verify line: the offer, the progress, or the verdict.
fn verify_line(save: &crate::app::SaveProgress, bar_w: usize, theme: Theme) -> Line<'static> {
    let Some(v) = &save.verify else {
        return Line::from(Span::styled(
            "v verify: read the save back and compare every tensor with its source",
            theme.dim(),
        ));
    };
    match &v.outcome {
        None => {
            let f = v.read as f64 / v.total.max(1) as f64;
            Line::from(vec![
                Span::raw("verify  "),
                Span::styled(bar(f, bar_w), theme.gauge()),
                Span::raw(format!(" {:>3.0}%", f * 100.0)),
            ])
        }
        Some(Ok(r)) if r.differences() == 0 => Line::from(Span::styled(
            format!(
                "verified: {} their source{} ({} read), no differences",
                devmap_core::text::count(r.compared, "tensor equals", "tensors equal"),
                r.coverage
                    .architecture
                    .as_ref()
                    .map_or(String::new(), |a| format!(", as {a} expects")),
                human_bytes(r.bytes_read)
            ),
            theme.good(),
        )),
        Some(Ok(r)) => {
            let first = r
                .findings
                .iter()
                .find(|f| f.severity == devmap_core::verify::Severity::Difference)
                .map(|f| format!(": {f}"))
                .unwrap_or_default();
            Line::from(Span::styled(
                format!(
                    "verify: {}{first}",
                    devmap_core::text::count(r.differences(), "difference", "differences")
                ),
                theme.bad(),
            ))
        }
        Some(Err(why)) => Line::from(Span::styled(
            format!("could not verify: {why}"),
            theme.bad(),
        )),
    }
}
