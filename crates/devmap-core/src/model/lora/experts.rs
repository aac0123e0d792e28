//! LoRA on fused experts (peft's `target_parameters`: `mlp.experts.gate_up_proj`
//! `[E, 2I, H]` and `mlp.experts.down_proj` `[E, H, I]` as transformers 5 loads them),
//! merged into the checkpoint's per-expert tensors: expert e's slice of the fused delta
//! goes to its gate and up halves (`w1`/`w3` or `gate_proj`/`up_proj`) and to its
//! `down_proj` (`w2`), exactly as peft's merge followed by transformers' save writes
//! them.

use std::collections::HashMap;

use crate::model::TensorId;
use crate::model::checkpoint::Checkpoint;
use crate::model::merge::MergeKind;
use crate::model::names::expert_piece;

/// The per-expert checkpoint tensors of each fused runtime parameter:
/// `fused name → (expert, part, tensor)`, part 0 gate, 1 up, 2 down.
pub(super) type Pieces = HashMap<String, Vec<(u64, u8, TensorId)>>;

/// Every per-expert tensor of the checkpoint, by the fused parameter it is loaded into.
pub(super) fn pieces(ckpt: &Checkpoint) -> Pieces {
    let mut by_fused: Pieces = HashMap::new();
    for (id, t) in ckpt.tensors().iter().enumerate() {
        if let Some(p) = expert_piece(&t.name) {
            by_fused
                .entry(p.fused)
                .or_default()
                .push((p.expert, p.part, id));
        }
    }
    by_fused
}

/// Model types whose fused experts are `[E, in, out]` (their experts module says
/// `is_transposed` in transformers 5.24): peft's delta for them is each expert's
/// `(B·A)ᵀ`.
const TRANSPOSED_EXPERTS: [&str; 3] = ["gpt_oss", "aria", "openai_privacy_filter"];

/// A fused experts parameter the checkpoint holds whole (`[E, out, in]` under the name
/// transformers renames it from: GraniteMoE's `block_sparse_moe.input_linear.weight`
/// for `…experts.gate_up_proj`; `[E, in, out]` for gpt-oss), or as MXFP4 blocks
/// (`P_blocks`, which dequantize to `[E, in, out]`).
fn whole(
    ckpt: &Checkpoint,
    fused: &str,
    (a_rows, a_cols): (u64, u64),
    (b_rows, b_cols): (u64, u64),
) -> Result<(u64, Vec<Target>), String> {
    let stored = ckpt.index_of(fused).or_else(|| {
        let arch = crate::model::arch::lookup(&ckpt.config.architectures)?;
        ckpt.index_of(&arch.checkpoint_name(fused)?)
    });
    // MXFP4 blocks, as the parameter they dequantize to (`[E, in, out]`).
    let mxfp4 = || {
        let id = ckpt.index_of(&format!("{fused}_blocks"))?;
        match crate::model::quantized::quantized_part(ckpt, id)? {
            crate::model::quantized::QuantizedPart::Weight {
                dequantized_shape, ..
            } => Some((id, dequantized_shape, true)),
            crate::model::quantized::QuantizedPart::Scales { .. } => None,
        }
    };
    let model_type = ckpt.config.raw.get("model_type").and_then(|t| t.as_str());
    let transposed = model_type.is_some_and(|t| TRANSPOSED_EXPERTS.contains(&t));
    let found = stored
        .map(|id| (id, ckpt.tensors()[id].shape.iter().collect(), transposed))
        .or_else(mxfp4);
    let Some((id, dims, transposed)) = found else {
        return Err(format!(
            "`{fused}`: the checkpoint has neither per-expert tensors nor the whole parameter"
        ));
    };
    let (experts, out, cols) = match *dims.as_slice() {
        [e, d1, d2] if transposed => (e, d2, d1),
        [e, d1, d2] => (e, d1, d2),
        _ => return Err(format!("`{fused}` is {dims:?}, not [experts, out, in]")),
    };
    let fits =
        experts > 0 && a_rows % experts == 0 && a_cols == cols && b_rows == out && b_cols == a_rows;
    if !fits {
        let shape = if transposed {
            format!("[{experts}, {cols}, {out}] (experts, in, out)")
        } else {
            format!("[{experts}, {out}, {cols}]")
        };
        return Err(format!(
            "`{fused}` {shape} needs A [r·{experts}, {cols}] and B [{out}, r·{experts}]"
        ));
    }
    let target = Target {
        id,
        kind: MergeKind::Expert {
            expert: None,
            experts,
            delta_row: 0,
            transposed,
        },
    };
    Ok((a_rows / experts, vec![target]))
}

/// One expert tensor an adapter pair changes, and how.
pub(super) struct Target {
    pub id: TensorId,
    pub kind: MergeKind,
}

/// What a LoRA pair on a fused experts parameter changes: `module` is the key's module
/// (`model.layers.0.mlp.experts`, with a `.base_layer` per wrapper peft nested),
/// `a` and `b` the pair's shapes. The parameter is the one of `target_parameters`
/// under that module whose shape the pair fits. Returns the rank per expert and the
/// tensors with their merge kinds, or why not.
pub(super) fn targets(
    ckpt: &Checkpoint,
    pieces: &Pieces,
    target_parameters: &[String],
    module: &str,
    (a_rows, a_cols): (u64, u64),
    (b_rows, b_cols): (u64, u64),
) -> Result<(u64, Vec<Target>), String> {
    let mut experts_module = module;
    while let Some(inner) = experts_module.strip_suffix(".base_layer") {
        experts_module = inner;
    }
    let params: Vec<&str> = target_parameters
        .iter()
        .filter_map(|t| {
            let (owner, param) = t.rsplit_once('.')?;
            let under = experts_module == owner || experts_module.ends_with(&format!(".{owner}"));
            under.then_some(param)
        })
        .collect();
    if params.is_empty() {
        return Err(format!(
            "adapts `{module}`, which is neither a tensor of the model nor under one of its target_parameters"
        ));
    }
    let mut tried = Vec::new();
    for param in params {
        let fused = format!("{experts_module}.{param}");
        let Some(found) = pieces.get(&fused) else {
            match whole(ckpt, &fused, (a_rows, a_cols), (b_rows, b_cols)) {
                Ok(found) => return Ok(found),
                Err(why) => tried.push(why),
            }
            continue;
        };
        let experts = found.iter().map(|&(e, _, _)| e + 1).max().unwrap_or(0);
        let gate_up = found.iter().any(|&(_, part, _)| part < 2);
        let parts: &[u8] = if gate_up { &[0, 1] } else { &[2] };
        // Each expert's tensor for each part, with the shape they share.
        let mut by_expert = vec![[None; 3]; experts as usize];
        for &(e, part, id) in found {
            by_expert[e as usize][part as usize] = Some(id);
        }
        let shape = |id: TensorId| -> Option<(u64, u64)> {
            let mut dims = ckpt.tensors()[id].shape.iter();
            match (dims.next(), dims.next(), dims.next()) {
                (Some(r), Some(c), None) => Some((r, c)),
                _ => None,
            }
        };
        let Some(first) = by_expert
            .first()
            .and_then(|e| e[parts[0] as usize])
            .and_then(shape)
        else {
            tried.push(format!("`{fused}`: expert 0 is missing or not a matrix"));
            continue;
        };
        let (rows, cols) = first;
        let complete = by_expert.iter().all(|e| {
            parts
                .iter()
                .all(|&p| e[p as usize].and_then(shape) == Some((rows, cols)))
        });
        if !complete {
            tried.push(format!(
                "`{fused}`: its {experts} experts' tensors are not all there with one shape"
            ));
            continue;
        }
        // The fused parameter is [E, out, in]: out = rows per part × parts.
        let out = rows * parts.len() as u64;
        let fits = experts > 0
            && a_rows % experts == 0
            && a_cols == cols
            && b_rows == out
            && b_cols == a_rows;
        if !fits {
            tried.push(format!(
                "`{fused}` [{experts}, {out}, {cols}] needs A [r·{experts}, {cols}] and B [{out}, r·{experts}]"
            ));
            continue;
        }
        let targets = by_expert
            .iter()
            .enumerate()
            .flat_map(|(e, ids)| {
                parts.iter().enumerate().filter_map(move |(half, &p)| {
                    Some(Target {
                        id: ids[p as usize]?,
                        kind: MergeKind::Expert {
                            expert: Some(e as u64),
                            experts,
                            delta_row: half as u64 * rows,
                            transposed: false,
                        },
                    })
                })
            })
            .collect();
        return Ok((a_rows / experts, targets));
    }
    Err(format!(
        "A [{a_rows}, {a_cols}] and B [{b_rows}, {b_cols}] fit no fused experts parameter under `{experts_module}`: {}",
        tried.join("; ")
    ))
}
