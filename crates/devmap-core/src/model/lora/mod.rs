//! `--merge-lora ADAPTER`: reads a peft LoRA adapter folder and records, on the
//! checkpoint, which tensors it changes and how (a [`MergeStep`] each), and which it
//! replaces outright (`modules_to_save`, an embedding's `base_layer`). Everything that
//! can be wrong with an adapter is found here, before anything is written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::formats::FormatError;
use crate::formats::adapter::{
    ADAPTER_CONFIG, ADAPTER_WEIGHTS, pattern_value, read_adapter_config,
};
use crate::formats::safetensors::{HeaderTensor, read_header};
use crate::model::checkpoint::{ByteRange, Checkpoint};
use crate::model::merge::{Matrix, MergeKind, MergeStep};
use crate::types::DType;

mod experts;
mod quantized;

use quantized::{mergeable, packed_fp4_shape, packed_int_weight, quant_method};

/// peft prefixes every key of a saved adapter with this.
const KEY_PREFIX: &str = "base_model.model.";

#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{}: not a peft adapter folder (no {ADAPTER_CONFIG})", crate::text::path(.0))]
    NotAdapter(PathBuf),
    #[error("{}: {message}", crate::text::path(dir))]
    Unsupported { dir: PathBuf, message: String },
    #[error("{}: adapter key `{key}`: {message}", crate::text::path(dir))]
    Key {
        dir: PathBuf,
        key: String,
        message: String,
    },
}

/// What one adapter does to the model, for reports.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterSummary {
    pub dir: PathBuf,
    /// Tensors the adapter merges into.
    pub merged: Vec<String>,
    /// Tensors it replaces with values of its own.
    pub replaced: Vec<String>,
}

/// Refuses an adapter whose floating-point values include NaN or ±Inf: merged, they
/// would silently turn the weights they touch into NaN. Adapters are small (their
/// values are read once here, 8 MiB at a time).
fn refuse_nonfinite(
    dir: &Path,
    weights: &Path,
    header: &crate::formats::safetensors::Header,
) -> Result<(), LoraError> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(weights).map_err(|e| FormatError::io(weights, e))?;
    let mut bytes = Vec::new();
    for t in &header.tensors {
        let size = t.dtype.size();
        if !matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16) {
            continue;
        }
        let (mut bad, mut first) = (0u64, None);
        let mut done = 0u64;
        while done < t.len {
            let n = (t.len - done).min(8 << 20);
            bytes.resize(n as usize, 0);
            file.read_exact_at(&mut bytes, t.offset + done)
                .map_err(|e| FormatError::io(weights, e))?;
            for (k, e) in bytes.chunks_exact(size as usize).enumerate() {
                let finite = match t.dtype {
                    DType::F32 => f32::from_le_bytes([e[0], e[1], e[2], e[3]]).is_finite(),
                    DType::F16 => half::f16::from_le_bytes([e[0], e[1]]).is_finite(),
                    _ => half::bf16::from_le_bytes([e[0], e[1]]).is_finite(),
                };
                if !finite {
                    bad += 1;
                    first.get_or_insert(done / size + k as u64);
                }
            }
            done += n;
        }
        if let Some(first) = first {
            return Err(LoraError::Key {
                dir: dir.to_path_buf(),
                key: t.name.to_string(),
                message: format!(
                    "holds {} (the first at element {first}); merged, they would make the weights they touch NaN or infinite. Nothing was written; pass --allow-nonfinite to merge anyway",
                    crate::text::count(bad, "NaN or infinite value", "NaN or infinite values")
                ),
            });
        }
    }
    Ok(())
}

/// The pieces of one adapted module, by key suffix.
#[derive(Default)]
struct ModuleKeys {
    a: Option<(String, HeaderTensor)>,
    b: Option<(String, HeaderTensor)>,
    b_bias: Option<(String, HeaderTensor)>,
    embedding_a: Option<(String, HeaderTensor)>,
    embedding_b: Option<(String, HeaderTensor)>,
    magnitude: Option<(String, HeaderTensor)>,
}

/// An adapter tensor of `file` as a matrix: `[rows, cols]`, or a vector as one row.
fn matrix_of(t: &HeaderTensor, file: crate::types::range::FileId) -> Option<Matrix> {
    let (rows, cols) = match t.shape.len() {
        1 => (1, t.shape.iter().next()?),
        2 => {
            let mut dims = t.shape.iter();
            (dims.next()?, dims.next()?)
        }
        _ => return None,
    };
    Some(Matrix {
        range: ByteRange {
            file,
            offset: t.offset,
            len: t.len,
        },
        dtype: t.dtype,
        rows,
        cols,
    })
}

/// peft's scaling of a LoRA delta: α/r, or α/√r with rsLoRA, rounded to f32 as torch
/// multiplies by it.
fn lora_scale(alpha: f64, rank: u64, use_rslora: bool) -> f32 {
    if use_rslora {
        (alpha / (rank as f64).sqrt()) as f32
    } else {
        (alpha / rank as f64) as f32
    }
}

/// One LoRA pair on a fused experts parameter, with what its steps carry.
struct ExpertPair<'a> {
    a: &'a HeaderTensor,
    b: &'a HeaderTensor,
    adapter: &'a Arc<str>,
    alpha: f64,
    use_rslora: bool,
    allow_nonfinite: bool,
}

/// Records the merge of one LoRA pair on a fused experts parameter into every expert
/// tensor it changes ([`experts::targets`]). Returns their names.
fn merge_into_experts(
    ckpt: &mut Checkpoint,
    pieces: &experts::Pieces,
    target_parameters: &[String],
    module: &str,
    pair: &ExpertPair<'_>,
    file: crate::types::range::FileId,
) -> Result<Vec<String>, String> {
    let matrix = |t: &HeaderTensor| matrix_of(t, file).filter(|_| t.shape.len() == 2);
    let (Some(a), Some(b)) = (matrix(pair.a), matrix(pair.b)) else {
        return Err("A and B must be matrices".into());
    };
    let (rank, targets) = experts::targets(
        ckpt,
        pieces,
        target_parameters,
        module,
        (a.rows, a.cols),
        (b.rows, b.cols),
    )?;
    let scale = lora_scale(pair.alpha, rank, pair.use_rslora);
    let mut names = Vec::with_capacity(targets.len());
    for target in targets {
        let tensor = &ckpt.tensors()[target.id];
        mergeable(quant_method(ckpt), &tensor.name, tensor.dtype)?;
        names.push(tensor.name.to_string());
        let holder = ckpt
            .tie_group(target.id)
            .map_or(target.id, crate::model::TieGroup::kept);
        ckpt.merges.entry(holder).or_default().push(MergeStep {
            adapter: Arc::clone(pair.adapter),
            kind: target.kind,
            a: Some(a),
            b,
            rank,
            alpha: pair.alpha,
            scale,
            allow_nonfinite: pair.allow_nonfinite,
        });
    }
    Ok(names)
}

/// The tensor an adapter key's module names: as the checkpoint names it, or as the
/// loaded model does (peft saves under the loaded names: Llava's
/// `model.language_model.layers.0…` for the checkpoint's `language_model.model.layers.0…`),
/// through the architecture's rename rules, as device maps and offload entries are.
fn model_tensor(ckpt: &Checkpoint, name: &str) -> Option<crate::model::TensorId> {
    ckpt.index_of(name).or_else(|| {
        let arch = super::arch::lookup(&ckpt.config.architectures)?;
        ckpt.index_of(&arch.checkpoint_name(name)?)
    })
}

/// Reads the adapter in `dir` and records its merges and replacements on `ckpt`
/// (after those of adapters applied before it). Adapter values that are NaN or
/// infinite are refused, naming the key.
pub fn apply_adapter(ckpt: &mut Checkpoint, dir: &Path) -> Result<AdapterSummary, LoraError> {
    apply_adapter_with(ckpt, dir, false)
}

/// [`apply_adapter`]; `allow_nonfinite` (`--allow-nonfinite`) merges NaN and infinite
/// adapter values, and results that overflow, as peft would, instead of refusing.
pub fn apply_adapter_with(
    ckpt: &mut Checkpoint,
    dir: &Path,
    allow_nonfinite: bool,
) -> Result<AdapterSummary, LoraError> {
    let config_path = dir.join(ADAPTER_CONFIG);
    if std::fs::symlink_metadata(&config_path).is_err() {
        return Err(LoraError::NotAdapter(dir.to_path_buf()));
    }
    let config = read_adapter_config(&config_path)?;
    let unsupported = |message: String| LoraError::Unsupported {
        dir: dir.to_path_buf(),
        message,
    };
    if config.peft_type != "LORA" {
        return Err(unsupported(format!(
            "is a {} adapter; devmap merges LoRA adapters only (peft_type LORA)",
            config.peft_type
        )));
    }
    let weights = dir.join(ADAPTER_WEIGHTS);
    let header = read_header(&weights)?;
    if !allow_nonfinite {
        refuse_nonfinite(dir, &weights, &header)?;
    }
    let file = ckpt.add_source_file(&weights, header.file_len);
    let name: Arc<str> = Arc::from(dir.to_string_lossy().as_ref());
    let key_error = |key: &str, message: String| LoraError::Key {
        dir: dir.to_path_buf(),
        key: key.to_owned(),
        message,
    };

    let mut modules: BTreeMap<String, ModuleKeys> = BTreeMap::new();
    let mut replacements: Vec<(String, String, HeaderTensor)> = Vec::new();
    for t in header.tensors {
        let key = t.name.to_string();
        let bare = key.strip_prefix(KEY_PREFIX).unwrap_or(&key).to_owned();
        let split = |suffix: &str| bare.strip_suffix(suffix).map(str::to_owned);
        if let Some(m) = split(".lora_A.weight") {
            modules.entry(m).or_default().a = Some((key, t));
        } else if let Some(m) = split(".lora_B.weight") {
            modules.entry(m).or_default().b = Some((key, t));
        } else if let Some(m) = split(".lora_B.bias") {
            modules.entry(m).or_default().b_bias = Some((key, t));
        } else if let Some(m) = split(".lora_embedding_A") {
            modules.entry(m).or_default().embedding_a = Some((key, t));
        } else if let Some(m) = split(".lora_embedding_B") {
            modules.entry(m).or_default().embedding_b = Some((key, t));
        } else if let Some(m) =
            split(".lora_magnitude_vector").or_else(|| split(".lora_magnitude_vector.weight"))
        {
            modules.entry(m).or_default().magnitude = Some((key, t));
        } else if bare.contains(".lora_") {
            return Err(key_error(
                &key,
                "is a LoRA part devmap does not know; nothing was written".into(),
            ));
        } else {
            // A full value: `<module>.base_layer.<param>` (peft saves embedding layers
            // it may have resized) or a `modules_to_save` module's `<module>.<param>`.
            let target = bare.replacen(".base_layer.", ".", 1);
            replacements.push((key, target, t));
        }
    }

    let mut summary = AdapterSummary {
        dir: dir.to_path_buf(),
        merged: Vec::new(),
        replaced: Vec::new(),
    };
    for (key, target, t) in replacements {
        let Some(id) = model_tensor(ckpt, &target) else {
            return Err(key_error(
                &key,
                format!("replaces `{target}`, which the model does not have"),
            ));
        };
        let base = &ckpt.tensors()[id];
        if base.shape != t.shape.to_vec() {
            return Err(key_error(
                &key,
                format!(
                    "has shape {:?} but `{target}` has {:?}",
                    t.shape, base.shape
                ),
            ));
        }
        ckpt.replace_value(
            id,
            ByteRange {
                file,
                offset: t.offset,
                len: t.len,
            },
            t.dtype,
        );
        summary.replaced.push(target);
    }

    let matrix = |t: &HeaderTensor| matrix_of(t, file);
    let mut expert_pieces: Option<experts::Pieces> = None;
    for (module, keys) in modules {
        let (embedding, a_key, b_key) =
            match (&keys.a, &keys.b, &keys.embedding_a, &keys.embedding_b) {
                (Some(a), Some(b), None, None) => (false, a, b),
                (None, None, Some(a), Some(b)) => (true, a, b),
                _ => {
                    let key = [
                        &keys.a,
                        &keys.b,
                        &keys.embedding_a,
                        &keys.embedding_b,
                        &keys.magnitude,
                    ]
                    .into_iter()
                    .flatten()
                    .map(|(k, _)| k.clone())
                    .next()
                    .unwrap_or_else(|| module.clone());
                    return Err(key_error(
                        &key,
                        format!(
                            "module `{module}` does not have both halves of one LoRA pair (A and B)"
                        ),
                    ));
                }
            };
        let weight = format!("{module}.weight");
        if !embedding
            && !config.target_parameters.is_empty()
            && model_tensor(ckpt, &weight).is_none()
        {
            let pieces = expert_pieces.get_or_insert_with(|| experts::pieces(ckpt));
            let step = ExpertPair {
                a: &a_key.1,
                b: &b_key.1,
                adapter: &name,
                alpha: config.lora_alpha,
                use_rslora: config.use_rslora,
                allow_nonfinite,
            };
            merge_into_experts(
                ckpt,
                pieces,
                &config.target_parameters,
                &module,
                &step,
                file,
            )
            .map(|names| summary.merged.extend(names))
            .map_err(|message| key_error(&a_key.0, message))?;
            continue;
        }
        let (Some(ma), Some(mb)) = (matrix(&a_key.1), matrix(&b_key.1)) else {
            return Err(key_error(&a_key.0, "A and B must be matrices".into()));
        };
        // A packed integer weight (`M.weight_packed`) is merged into as the weight it
        // dequantizes to, `[rows, A's columns]` when A's columns pack to its width.
        let (id, dims) = match model_tensor(ckpt, &weight) {
            Some(id) => (
                id,
                packed_fp4_shape(ckpt, id, ma.cols)
                    .unwrap_or_else(|| ckpt.tensors()[id].shape.iter().collect::<Vec<u64>>()),
            ),
            None => match packed_int_weight(ckpt, &module, ma.cols) {
                Some(found) => found,
                None => {
                    return Err(key_error(
                        &a_key.0,
                        format!("adapts `{module}`, but the model has no tensor `{weight}`"),
                    ));
                }
            },
        };
        let base = &ckpt.tensors()[id];
        mergeable(quant_method(ckpt), &base.name, base.dtype)
            .map_err(|message| key_error(&a_key.0, message))?;
        let rank = ma.rows;
        // Each layout's expected shapes: W, A, B.
        let fan_in_fan_out = config.fan_in_fan_out && !embedding;
        let (w_expected, a_expected, b_expected) = if embedding {
            // W [num, dim], A [r, num], B [dim, r]
            let (num, dim) = (dims.first().copied(), dims.get(1).copied());
            ((num, dim), (rank, num), (dim, rank))
        } else if fan_in_fan_out {
            // Conv1D: W [in, out], A [r, in], B [out, r]
            let (inp, out) = (dims.first().copied(), dims.get(1).copied());
            ((inp, out), (rank, inp), (out, rank))
        } else {
            // W [out, in], A [r, in], B [out, r]
            let (out, inp) = (dims.first().copied(), dims.get(1).copied());
            ((out, inp), (rank, inp), (out, rank))
        };
        let agrees = dims.len() == 2
            && w_expected.0.is_some()
            && (Some(ma.rows), Some(ma.cols)) == (Some(a_expected.0), a_expected.1)
            && (Some(mb.rows), Some(mb.cols)) == (b_expected.0, Some(b_expected.1));
        if !agrees {
            return Err(key_error(
                &a_key.0,
                format!(
                    "A {:?} and B {:?} do not fit `{weight}` {:?}{}",
                    a_key.1.shape,
                    b_key.1.shape,
                    base.shape,
                    if config.fan_in_fan_out {
                        " (fan_in_fan_out)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let regex = |field: &str, p: String| {
            unsupported(format!(
                "{field} key `{p}` is a regular expression; devmap matches plain module names and dotted suffixes"
            ))
        };
        let r = pattern_value(&config.rank_pattern, &module)
            .map_err(|p| regex("rank_pattern", p))?
            .unwrap_or(config.r);
        let alpha = pattern_value(&config.alpha_pattern, &module)
            .map_err(|p| regex("alpha_pattern", p))?
            .unwrap_or(config.lora_alpha);
        if r != rank {
            return Err(key_error(
                &a_key.0,
                format!("has rank {rank}, but the config gives `{module}` rank {r}"),
            ));
        }
        let scale = lora_scale(alpha, r, config.use_rslora);
        let magnitude = match &keys.magnitude {
            None => None,
            Some((key, _)) if embedding || fan_in_fan_out => {
                return Err(key_error(
                    key,
                    "DoRA on embeddings and Conv1D layers is not supported; devmap merges DoRA into linear layers".into(),
                ));
            }
            Some((key, t)) => {
                let m = matrix(t).filter(|m| m.rows == 1 && Some(m.cols) == w_expected.0);
                Some(m.ok_or_else(|| {
                    key_error(
                        key,
                        format!(
                            "has shape {:?}; `{weight}` needs one magnitude per output row",
                            t.shape
                        ),
                    )
                })?)
            }
        };
        if config.use_dora && magnitude.is_none() {
            return Err(key_error(
                &a_key.0,
                "the config says use_dora but the adapter has no lora_magnitude_vector for this module".into(),
            ));
        }
        let holder = ckpt.tie_group(id).map_or(id, crate::model::TieGroup::kept);
        let steps = ckpt.merges.entry(holder).or_default();
        if magnitude.is_some() && !steps.is_empty() {
            return Err(key_error(
                &a_key.0,
                format!(
                    "`{weight}` is already changed by an earlier adapter; devmap merges DoRA only as the first change of a weight"
                ),
            ));
        }
        steps.push(MergeStep {
            adapter: Arc::clone(&name),
            kind: if embedding {
                MergeKind::Embedding
            } else {
                MergeKind::Linear {
                    fan_in_fan_out,
                    magnitude,
                }
            },
            a: Some(ma),
            b: mb,
            rank,
            alpha,
            scale,
            allow_nonfinite,
        });
        summary.merged.push(ckpt.tensors()[id].name.to_string());
        if let Some((key, t)) = &keys.b_bias {
            let bias_name = format!("{module}.bias");
            let Some(bias_id) = model_tensor(ckpt, &bias_name) else {
                return Err(key_error(
                    key,
                    format!("is a lora_bias, but the model has no `{bias_name}`"),
                ));
            };
            let m = matrix(t)
                .filter(|m| m.rows == 1 && ckpt.tensors()[bias_id].shape.iter().eq([m.cols]));
            let Some(m) = m else {
                return Err(key_error(
                    key,
                    format!("has shape {:?}, which does not fit `{bias_name}`", t.shape),
                ));
            };
            let holder = ckpt
                .tie_group(bias_id)
                .map_or(bias_id, crate::model::TieGroup::kept);
            ckpt.merges.entry(holder).or_default().push(MergeStep {
                adapter: Arc::clone(&name),
                kind: MergeKind::Bias,
                a: None,
                b: m,
                rank,
                alpha,
                scale,
                allow_nonfinite,
            });
            summary.merged.push(bias_name);
        }
    }
    if summary.merged.is_empty() && summary.replaced.is_empty() {
        return Err(unsupported(format!(
            "{ADAPTER_WEIGHTS} changes no tensor of the model"
        )));
    }
    Ok(summary)
}
