//! The human `inspect` report: a compact module tree, device totals, ties, warnings.
//!
//! Compact means: modules are opened to `depth` levels, deeper only where devices are
//! mixed (that is where a map needs explaining), and runs of numbered siblings that
//! are alike (same size, same device) print as one line (`layers.0–15 ×16`).

use std::fmt::Write;

use super::human_count;
use crate::human_bytes;
use crate::model::checkpoint::Checkpoint;
use crate::model::tree::{ModuleTree, Node, NodeId};
use crate::text::escaped;

/// `text` padded with spaces to `width` characters, on the left when `right_align`.
fn pad(text: &str, width: usize, right_align: bool) -> String {
    let fill = " ".repeat(width.saturating_sub(text.chars().count()));
    if right_align {
        format!("{fill}{text}")
    } else {
        format!("{text}{fill}")
    }
}

#[derive(Debug, Clone, Copy)]
pub struct TextOptions {
    /// Levels always opened.
    pub depth: usize,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions { depth: 2 }
    }
}

struct Row {
    label: String,
    size: String,
    params: String,
    placement: String,
    note: String,
}

pub fn to_text(ckpt: &Checkpoint, options: TextOptions) -> String {
    let tree = ModuleTree::build(ckpt);
    let mut out = String::new();
    let root = &tree.nodes[ModuleTree::ROOT];
    let _ = writeln!(out, "{}", ckpt.display_name());
    let _ = writeln!(
        out,
        "  {} · {} · {} parameters",
        crate::text::count(root.tensors, "tensor", "tensors"),
        human_bytes(root.bytes()),
        human_count(root.params)
    );
    let _ = writeln!(
        out,
        "  device map: {}",
        match (&ckpt.device_map_path, &ckpt.device_map) {
            (Some(p), _) => crate::text::path(p),
            // A live model's: it lives in the Python session, not in a file.
            (None, Some(map)) => crate::text::count(map.entries().len(), "key", "keys"),
            (None, None) => "none (everything on cpu)".to_owned(),
        }
    );
    if let Some(dir) = &ckpt.offload_dir {
        let _ = writeln!(out, "  offload folder: {}", crate::text::path(dir));
    }
    if let Some(q) = ckpt.quantization_summary() {
        let _ = writeln!(out, "  quantized: {q}");
    }
    out.push('\n');

    let mut rows = vec![Row {
        label: "MODULE".into(),
        size: "SIZE".into(),
        params: "PARAMS".into(),
        placement: "PLACEMENT".into(),
        note: String::new(),
    }];
    for child in tree.children(ModuleTree::ROOT) {
        collect_rows(ckpt, &tree, child, 0, options, &mut rows);
    }
    // Names come from the files: escaped before anything is measured or printed.
    for r in &mut rows {
        r.label = escaped(&r.label).into_owned();
        r.note = escaped(&r.note).into_owned();
    }
    let width =
        |f: fn(&Row) -> &String| rows.iter().map(|r| f(r).chars().count()).max().unwrap_or(0);
    let (wl, ws, wp, wd) = (
        width(|r| &r.label),
        width(|r| &r.size),
        width(|r| &r.params),
        width(|r| &r.placement),
    );
    for r in &rows {
        // Padded by hand: a format width is at most 65,535, and a name can be longer.
        let line = format!(
            "{}  {}  {}  {}  {}",
            pad(&r.label, wl, false),
            pad(&r.size, ws, true),
            pad(&r.params, wp, true),
            pad(&r.placement, wd, false),
            r.note
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }

    out.push_str("\nDEVICES\n");
    let total = ckpt.total_bytes().max(1);
    for (placement, bytes) in ckpt.device_totals() {
        let _ = writeln!(
            out,
            "  {:<9} {:>11}  {:>5.1}%",
            placement.to_string(),
            human_bytes(bytes),
            bytes as f64 * 100.0 / total as f64
        );
    }
    let shares = ckpt.rank_shares();
    if !shares.is_empty() {
        out.push_str("\nRANKS (the training run's share of the stored tensors)\n");
        let all = shares.iter().map(|(_, b)| b).sum::<u64>().max(1);
        for (rank, bytes) in shares {
            let _ = writeln!(
                out,
                "  rank {:<4} {:>11}  {:>5.1}%",
                rank,
                human_bytes(bytes),
                bytes as f64 * 100.0 / all as f64
            );
        }
    }
    if !ckpt.ties.is_empty() {
        out.push_str("\nTIES (saved once, under the first name)\n");
        for g in &ckpt.ties {
            let names: Vec<String> = g
                .members
                .iter()
                .map(|&m| {
                    format!(
                        "{} [{}]",
                        escaped(&ckpt.tensors()[m].name),
                        ckpt.tensors()[m].placement
                    )
                })
                .collect();
            let _ = writeln!(out, "  {}  ({})", names.join(" = "), g.evidence.label());
        }
    }
    lora_section(ckpt, &mut out);
    let warnings = crate::model::checks::all_warnings(ckpt);
    if !warnings.is_empty() {
        out.push_str("\nWARNINGS\n");
        for w in &warnings {
            let _ = writeln!(out, "  ! {w}");
        }
    }
    out
}

/// What `--merge-lora` changes: every merged tensor with its adapter steps, and every
/// tensor an adapter replaces.
fn lora_section(ckpt: &Checkpoint, out: &mut String) {
    let replaced: Vec<&str> = (0..ckpt.tensors().len())
        .filter(|&id| ckpt.replaced_by_adapter(id))
        .map(|id| ckpt.tensors()[id].name.as_ref())
        .collect();
    let merged: Vec<usize> = (0..ckpt.tensors().len())
        .filter(|&id| !ckpt.merges_of(id).is_empty())
        .collect();
    if merged.is_empty() && replaced.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nLORA (applied on save: {} merged, {} replaced)",
        crate::text::count(merged.len(), "tensor", "tensors"),
        replaced.len()
    );
    for id in merged {
        let steps: Vec<String> = ckpt
            .merges_of(id)
            .iter()
            .map(|m| {
                format!(
                    "{} {}, rank {}, scale {}",
                    escaped(&m.adapter),
                    m.kind_name(),
                    m.rank,
                    m.scale
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "  {}  += {}",
            escaped(&ckpt.tensors()[id].name),
            steps.join(", then ")
        );
    }
    for name in replaced {
        let _ = writeln!(out, "  {}  = the adapter's own value", escaped(name));
    }
}

fn placement_label(node: &Node) -> String {
    match node.split.as_slice() {
        [(p, _)] => p.to_string(),
        split => {
            let total = node.bytes().max(1) as f64;
            let parts: Vec<String> = split
                .iter()
                .map(|(p, b)| format!("{p} {:.0}%", *b as f64 * 100.0 / total))
                .collect();
            format!("mixed ({})", parts.join(", "))
        }
    }
}

fn is_mixed(node: &Node) -> bool {
    node.split.len() > 1
}

fn collect_rows(
    ckpt: &Checkpoint,
    tree: &ModuleTree,
    id: NodeId,
    level: usize,
    options: TextOptions,
    rows: &mut Vec<Row>,
) {
    // A module holding a single child and nothing else prints as one dotted line
    // (`lm_head.weight`, `rotary_emb.inv_freq`).
    let mut id = id;
    let mut name = tree.nodes[id].name.to_string();
    while tree.nodes[id].tensor().is_none()
        && let Some(only) = tree.only_child(id)
    {
        id = only;
        name = format!("{name}.{}", tree.nodes[id].name);
    }
    let node = &tree.nodes[id];
    let indent = "  ".repeat(level);
    let label = format!("{indent}{name}");
    rows.push(node_row(ckpt, node, label));
    let open = level + 1 < options.depth || is_mixed(node);
    if !open {
        return;
    }
    let children: Vec<NodeId> = tree.children(id).collect();
    let children = children.as_slice();
    let mut i = 0;
    while i < children.len() {
        let first = &tree.nodes[children[i]];
        let run = run_length(tree, children, i, options, level + 1);
        if run > 1 {
            let last = &tree.nodes[children[i + run - 1]];
            let mut row = node_row(
                ckpt,
                first,
                format!("{indent}  {}–{} ×{run}", first.name, last.name),
            );
            row.size = format!("{} each", human_bytes(first.bytes()));
            rows.push(row);
            i += run;
        } else {
            collect_rows(ckpt, tree, children[i], level + 1, options, rows);
            i += 1;
        }
    }
}

/// How many numbered siblings from `start` look alike and stay closed.
fn run_length(
    tree: &ModuleTree,
    children: &[NodeId],
    start: usize,
    options: TextOptions,
    level: usize,
) -> usize {
    let first = &tree.nodes[children[start]];
    let numbered = |n: &Node| n.name.bytes().all(|b| b.is_ascii_digit()) && !n.name.is_empty();
    let closed = |n: &Node| !(level + 1 < options.depth || is_mixed(n));
    if !numbered(first) || !closed(first) || first.tensor().is_some() {
        return 1;
    }
    children[start..]
        .iter()
        .take_while(|&&c| {
            let n = &tree.nodes[c];
            numbered(n)
                && closed(n)
                && n.tensor().is_none()
                && n.bytes() == first.bytes()
                && n.split.first().map(|s| s.0) == first.split.first().map(|s| s.0)
                && !n.has_tie
        })
        .count()
        .max(1)
}

fn node_row(ckpt: &Checkpoint, node: &Node, label: String) -> Row {
    let mut note = String::new();
    if let Some(t) = node.tensor() {
        let tensor = &ckpt.tensors()[t];
        note = format!("{} {:?}", tensor.dtype, tensor.shape);
        if let Some(group) = ckpt.tie_group(t) {
            let partners: Vec<&str> = group
                .members
                .iter()
                .filter(|&&m| m != t)
                .map(|&m| ckpt.tensors()[m].name.as_ref())
                .collect();
            let _ = write!(note, "  ⇄ tied to {}", partners.join(", "));
        }
    } else if node.has_tie {
        note = "⇄ holds tied weights".into();
    }
    Row {
        label,
        size: human_bytes(node.bytes()),
        params: human_count(node.params),
        placement: placement_label(node),
        note,
    }
}
