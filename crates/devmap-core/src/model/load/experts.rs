//! transformers 5's converted expert layouts, reversed. With disk offload, transformers
//! 5 writes a mixture-of-experts layer's experts fused, under runtime names:
//! `P.experts.gate_up_proj` `[E, 2I, H]` (each expert's gate rows, then its up rows)
//! and `P.experts.down_proj` `[E, H, I]`, where the checkpoint has one tensor per
//! expert. Every checkpoint tensor is a contiguous piece of the fused one, so the
//! reversal is only a byte range: each per-expert tensor takes its current value from
//! its slice of the offload entry, and the fused name is never written.
//!
//! Templates, from transformers' `conversion_mapping.py` (5.24):
//! - `qwen2_moe` (and the model types that reuse it, e.g. `qwen3_moe`):
//!   `P.experts.{e}.gate_proj/up_proj/down_proj.weight`;
//! - `mixtral`: the same with `block_sparse_moe` for `mlp` and `w1`/`w3`/`w2`;
//! - `lfm2_moe`: `w1`/`w3`/`w2` under a module that keeps its name;
//! - `dots3_note_vision_encoder`: `fc1` (gate), `fc3` (up), `fc2` (down);
//! - `nemotron_h`: experts without a gate, `P.experts.up_proj` `[E, I, H]` and
//!   `P.experts.down_proj`, under `mixer`, the checkpoint's `backbone.` loaded as
//!   `model.` (the architecture's rename rule, `checkpoint_name`).

use super::draft::Draft;
use crate::model::checkpoint::{ByteRange, Source};
use crate::model::names::{EXPERT_TEMPLATES, ExpertTemplate, MODULE_RENAMES};
use crate::types::DType;

/// If the offload entry `name` is a fused expert tensor whose per-expert pieces all
/// exist in the checkpoint with the shapes the layout implies, points each of them at
/// its slice of `range` (stored as `dtype`) and returns the names it took over.
/// The checkpoint's name for a runtime name, where the architecture renames it.
pub(super) type CheckpointName<'a> = &'a dyn Fn(&str) -> Option<String>;

pub(super) fn unfuse(
    draft: &mut Draft,
    (name, checkpoint_name): (&str, CheckpointName<'_>),
    shape: &[u64],
    dtype: DType,
    range: ByteRange,
    load_dtype: Option<DType>,
) -> Option<Vec<String>> {
    /// Which fused parameter: each expert's gate rows then its up rows, its up rows
    /// only (experts without a gate), or its down projection.
    #[derive(Clone, Copy, PartialEq)]
    enum Fused {
        GateUp,
        Up,
        Down,
    }
    let (runtime_prefix, fused) = if let Some(p) = name.strip_suffix(".experts.gate_up_proj") {
        (p, Fused::GateUp)
    } else if let Some(p) = name.strip_suffix(".experts.up_proj") {
        (p, Fused::Up)
    } else {
        (name.strip_suffix(".experts.down_proj")?, Fused::Down)
    };
    let &[experts, rows, cols] = shape else {
        return None;
    };
    let size = dtype.size();
    if experts * rows * cols * size != range.len {
        return None;
    }
    for ExpertTemplate {
        renamed,
        gate,
        up,
        down,
    } in EXPERT_TEMPLATES
    {
        let prefix = if renamed {
            let checkpoint_prefix = MODULE_RENAMES.iter().find_map(|(checkpoint, runtime)| {
                runtime_prefix
                    .strip_suffix(&format!(".{runtime}"))
                    .map(|base| format!("{base}.{checkpoint}"))
            });
            let Some(prefix) = checkpoint_prefix else {
                continue;
            };
            prefix
        } else {
            runtime_prefix.to_owned()
        };
        // (checkpoint part, row offset inside an expert's block, rows) per expert.
        let parts: Vec<(&str, u64, u64)> = match fused {
            Fused::GateUp if rows % 2 != 0 => continue,
            Fused::GateUp => vec![(gate, 0, rows / 2), (up, rows / 2, rows / 2)],
            Fused::Up => vec![(up, 0, rows)],
            Fused::Down => vec![(down, 0, rows)],
        };
        let mut pieces = Vec::new();
        for e in 0..experts {
            for &(part, row, n) in &parts {
                let tensor = format!("{prefix}.experts.{e}.{part}.weight");
                // Under the runtime name, or the checkpoint's where the architecture
                // renames the module path (`model.` loaded from `backbone.`).
                let found = draft
                    .find(&tensor)
                    .or_else(|| draft.find(&checkpoint_name(&tensor)?));
                let Some(id) = found else {
                    pieces.clear();
                    break;
                };
                if !draft.tensors[id].shape.iter().eq([n, cols]) {
                    pieces.clear();
                    break;
                }
                let offset = range.offset + (e * rows + row) * cols * size;
                pieces.push((id, offset, n * cols * size));
            }
            if pieces.is_empty() {
                break;
            }
        }
        if pieces.is_empty() {
            continue;
        }
        let mut names = Vec::with_capacity(pieces.len());
        for (id, offset, len) in pieces {
            let t = &mut draft.tensors[id];
            if let Source::Checkpoint(old) = t.source {
                draft.replaced.push((t.name.to_string(), old, t.dtype));
            }
            t.dtype = dtype;
            t.source = Source::Offload(ByteRange {
                file: range.file,
                offset,
                len,
            });
            t.load_dtype = load_dtype;
            names.push(t.name.to_string());
        }
        return Some(names);
    }
    None
}
