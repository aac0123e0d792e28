//! The model as accelerate plans it. transformers 5 loads some checkpoints into another
//! layout before `device_map="auto"` walks them: a mixture-of-experts layer's
//! per-expert tensors become two fused parameters (`P.experts.gate_up_proj`
//! `[E, 2I, H]`, `P.experts.down_proj` `[E, H, I]`) and Mixtral's `block_sparse_moe`
//! is `mlp` — and many checkpoints are saved under other names than the model loads
//! (Llava, Gemma 3 and Qwen2-VL keep the language model elsewhere; the architecture
//! table's rename rules say where). Planning on the checkpoint's own names would write map keys transformers
//! does not know (`…block_sparse_moe.experts.3`) once the plan splits inside a layer,
//! and would walk experts one by one where accelerate sees two parameters. So the
//! planner walks a view of the checkpoint under runtime names; the map it returns uses
//! them, and `checkpoint::place` finds per-expert tensors under them.
//!
//! The view also holds what the loaded model has and a checkpoint never does: the
//! non-persistent buffers (rotary `inv_freq`, BERT-family `position_ids`, GPT-Neo's
//! causal mask), which accelerate counts in their module's size.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::model::arch::Arch;
use crate::model::checkpoint::{Checkpoint, NO_KEY, NamedTie, Parts, Source, Tensor};
use crate::model::names::expert_piece;
use crate::types::placement::Placement;

/// What the planner walks: the checkpoint as the loaded model has it.
#[derive(Debug, Default)]
pub struct PlanView {
    /// The checkpoint under the loaded model's names and layout, with its buffers
    /// (`None`: plan the checkpoint as it is). Only what planning reads is kept:
    /// names, dtypes, shapes, ties and the config.
    pub ckpt: Option<Checkpoint>,
    /// Which of its tensors are non-persistent buffers: counted in their module's
    /// size, never walked on their own (accelerate drops a split module's buffers).
    pub buffers: HashSet<Arc<str>>,
    /// Which of those keep the dtype they are made in whatever the load dtype (rotary
    /// `inv_freq`, made in float32), unlike Gemma's `embed_scale`.
    pub fixed: HashSet<Arc<str>>,
}

/// The checkpoint as the loaded model has it (see [`PlanView`]).
pub fn plan_view(ckpt: &Checkpoint, arch: Option<&Arch>) -> PlanView {
    let runtime = runtime_view(ckpt, arch);
    let base = runtime.as_ref().unwrap_or(ckpt);
    let buffers = buffers_of(base);
    if buffers.is_empty() {
        return PlanView {
            ckpt: runtime,
            ..PlanView::default()
        };
    }
    let names = buffers.iter().map(|(t, _)| Arc::from(&*t.name)).collect();
    let fixed = buffers
        .iter()
        .filter(|(_, follows_load)| !follows_load)
        .map(|(t, _)| Arc::from(&*t.name))
        .collect();
    let mut tensors = base.tensors().to_vec();
    tensors.extend(buffers.into_iter().map(|(t, _)| t));
    let ckpt = view_of(base, tensors, base.tie_names());
    PlanView {
        ckpt: Some(ckpt),
        buffers: names,
        fixed,
    }
}

/// The non-persistent buffers of the model `ckpt` loads into (the buffer table),
/// each where the checkpoint has its module's parent: a buffer the checkpoint's names
/// would not reach (a model saved under other names) is left out rather than put in a
/// module of its own. Each with whether it follows the load dtype.
fn buffers_of(ckpt: &Checkpoint) -> Vec<(Tensor, bool)> {
    let buffers = crate::model::expect::buffers_of(&ckpt.config.architectures, &ckpt.config.raw);
    if buffers.is_empty() {
        return Vec::new();
    }
    let mut parents: HashSet<&str> = HashSet::new();
    for t in ckpt.tensors() {
        let mut name: &str = &t.name;
        while let Some((parent, _)) = name.rsplit_once('.') {
            if !parents.insert(parent) {
                break;
            }
            name = parent;
        }
    }
    let held: HashSet<&str> = ckpt.tensors().iter().map(|t| &*t.name).collect();
    buffers
        .into_iter()
        .filter(|b| {
            let module = b.name.rsplit_once('.').map_or("", |(m, _)| m);
            let parent = module.rsplit_once('.').map_or("", |(p, _)| p);
            !held.contains(b.name.as_str()) && (parent.is_empty() || parents.contains(parent))
        })
        .map(|b| {
            let tensor = Tensor {
                name: b.name.into(),
                dtype: b.dtype,
                shape: b.shape.as_slice().into(),
                placement: Placement::Cpu,
                map_key: NO_KEY,
                source: Source::None,
                load_dtype: None,
            };
            (tensor, b.follows_load)
        })
        .collect()
}

/// The checkpoint under the names and layout the loaded model has, when they differ
/// (`None`: plan the checkpoint as it is).
fn runtime_view(ckpt: &Checkpoint, arch: Option<&Arch>) -> Option<Checkpoint> {
    // A checkpoint transformers loads dequantized is planned as the plain model it
    // becomes, under the names and layout the loaded model has too.
    let dequantized = dequantized_view(ckpt);
    let Some(base) = dequantized else {
        return renamed_view(ckpt, arch);
    };
    renamed_view(&base, arch).or(Some(base))
}

/// The checkpoint as transformers loads it with `dequantize: true`: each quantized
/// weight (`model::quantized`) as the plain weight it becomes — its dequantized name
/// and shape, in the model's dtype — and its scales gone. `None` when the config does
/// not ask for dequantized loading.
fn dequantized_view(ckpt: &Checkpoint) -> Option<Checkpoint> {
    use crate::model::quantized::{QuantizedPart, dequantized_dtype, quantized_part};
    if !ckpt.config.quantization.as_ref()?.dequantize {
        return None;
    }
    let dtype = dequantized_dtype(ckpt);
    let mut tensors = Vec::with_capacity(ckpt.tensors().len());
    for (id, t) in ckpt.tensors().iter().enumerate() {
        match quantized_part(ckpt, id) {
            Some(QuantizedPart::Scales { .. }) => {}
            Some(QuantizedPart::Weight {
                dequantized_name,
                dequantized_shape,
                ..
            }) => tensors.push(Tensor {
                name: dequantized_name.into(),
                dtype,
                shape: dequantized_shape.as_slice().into(),
                placement: Placement::Cpu,
                map_key: NO_KEY,
                source: Source::None,
                load_dtype: None,
            }),
            None => tensors.push(Tensor {
                placement: Placement::Cpu,
                map_key: NO_KEY,
                source: Source::None,
                ..t.clone()
            }),
        }
    }
    Some(view_of(ckpt, tensors, ckpt.tie_names()))
}

/// A checkpoint of `tensors` and `ties` with `ckpt`'s folder and config: what the
/// planner reads of a view.
fn view_of(ckpt: &Checkpoint, tensors: Vec<Tensor>, ties: Vec<NamedTie>) -> Checkpoint {
    Checkpoint::assemble(Parts {
        dir: ckpt.dir.clone(),
        tensors,
        ties,
        config: ckpt.config.clone(),
        ..Parts::default()
    })
}

/// [`runtime_view`] without dequantization: the renames and fused experts.
fn renamed_view(ckpt: &Checkpoint, arch: Option<&Arch>) -> Option<Checkpoint> {
    let arch = arch?;
    let fused = fused_experts(ckpt, arch);
    let runtime = |name: &str| arch.loaded_name(name);
    let renamed = ckpt.tensors().iter().any(|t| runtime(&t.name).is_some());
    if fused.is_empty() && !renamed {
        return None;
    }
    let plain = |t: &Tensor| Tensor {
        name: runtime(&t.name).map_or_else(|| t.name.clone(), Box::from),
        placement: Placement::Cpu,
        map_key: NO_KEY,
        source: Source::None,
        ..t.clone()
    };
    let mut tensors: Vec<Tensor> = ckpt
        .tensors()
        .iter()
        .filter(|t| {
            expert_piece(&t.name)
                .is_none_or(|piece| !fused.contains_key(&arch.loaded_or_same(&piece.fused)))
        })
        .map(plain)
        .collect();
    for (name, (dtype, shape)) in fused {
        tensors.push(Tensor {
            name: name.into(),
            dtype,
            shape: shape.into(),
            placement: Placement::Cpu,
            map_key: NO_KEY,
            source: Source::None,
            load_dtype: None,
        });
    }
    let ties = ckpt
        .ties
        .iter()
        .map(|g| NamedTie {
            names: g
                .members
                .iter()
                .map(|&m| plain(&ckpt.tensors()[m]).name.to_string())
                .collect(),
            evidence: g.evidence,
        })
        .collect();
    Some(view_of(ckpt, tensors, ties))
}

/// A tensor's dtype and dims.
type Layout = (crate::types::DType, Vec<u64>);

/// The fused parameters the architecture loads per-expert tensors into, with their
/// dtype and shape: for each, every expert `0..E` must be there with one dtype and one
/// shape (else that layer is planned as stored).
fn fused_experts(ckpt: &Checkpoint, arch: &Arch) -> BTreeMap<String, Layout> {
    // fused name -> (expert, part) -> layout
    let mut pieces: BTreeMap<String, BTreeMap<(u64, u8), Layout>> = BTreeMap::new();
    for t in ckpt.tensors() {
        if let Some(piece) = expert_piece(&t.name)
            && let fused = arch.loaded_or_same(&piece.fused)
            && arch.position(&fused).is_some()
        {
            pieces
                .entry(fused)
                .or_default()
                .insert((piece.expert, piece.part), (t.dtype, t.shape.to_vec()));
        }
    }
    let mut fused = BTreeMap::new();
    for (name, parts) in pieces {
        let down = name.ends_with(".down_proj");
        let wanted: &[u8] = if down { &[2] } else { &[0, 1] };
        let experts = parts.keys().map(|(e, _)| e + 1).max().unwrap_or(0);
        let Some((dtype, shape)) = parts.values().next().cloned() else {
            continue;
        };
        let complete = parts.len() as u64 == experts * wanted.len() as u64
            && (0..experts).all(|e| wanted.iter().all(|p| parts.contains_key(&(e, *p))))
            && parts.values().all(|(d, s)| *d == dtype && *s == shape);
        let &[rows, cols] = shape.as_slice() else {
            continue;
        };
        if complete {
            let rows = rows * wanted.len() as u64;
            fused.insert(name, (dtype, vec![experts, rows, cols]));
        }
    }
    fused
}
