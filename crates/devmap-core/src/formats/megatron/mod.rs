//! Megatron-Core distributed checkpoints (`dist_checkpointing.save`, the `torch_dist`
//! backend): a torch.distributed.checkpoint folder (`.metadata`, `__R_S.distcp`) with
//! Megatron's `metadata.json` and `common.pt` beside it. Tensor, pipeline and expert
//! parallel splits are chunks of one global tensor there, so the DCP reader gives
//! each Megatron tensor whole or in pieces; this module renames and cuts them into
//! transformers' tensors by the one table in [`layout`], as pieces of the same files
//! (nothing is read but `.metadata` and `common.pt`).
//!
//! Left out, and said so: the optimizer's state (`optimizer.…`), Transformer
//! Engine's `_extra_state` entries (bytes, not weights) and the other objects ranks
//! saved (`rng_state`). A tensor the table has no name for is refused by name.

pub mod args;
pub mod deepseek;
pub mod fsdp_dtensor;
pub mod layout;
pub mod moe_rules;
pub mod names;
mod shapes;
pub mod yaml_args;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use self::args::{Args, Shapes};
use self::layout::{Heads, MoeNames, Source};
use super::safetensors::HeaderTensor;
use super::split::{PiecedTensor, Split};
use super::{FormatError, Kind};
use crate::types::DType;
use crate::types::pieces::Piece;
use crate::types::range::ByteRange;
use crate::types::shape::Shape;

/// Megatron's own file in the checkpoint folder: which backend wrote it.
pub const MARKER: &str = "metadata.json";

/// Megatron-Bridge's configuration of the run, beside the weights.
pub const RUN_CONFIG: &str = "run_config.yaml";

/// The files a Megatron checkpoint has besides its `.distcp` data (not copied by a
/// save: they are not the HF model's).
pub const OWN_FILES: [&str; 3] = [MARKER, args::COMMON, RUN_CONFIG];

/// Whether `dir` is a Megatron-Core distributed checkpoint: its `metadata.json`
/// names a `sharded_backend`.
pub fn is_megatron(dir: &Path) -> bool {
    let path = dir.join(MARKER);
    crate::formats::input::read_json_text(&path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|v| v.get("sharded_backend").is_some())
}

/// A Megatron checkpoint read: the HF model's tensors, and the config.json devmap
/// wrote from the training arguments (`None` when `--config` gave one).
pub struct Read {
    pub split: Split,
    pub config: Option<String>,
}

/// Where a checkpoint's hyperparameters come from, and what its tensor names carry
/// before megatron-core's own.
pub struct Origin {
    /// The training run's arguments (`None`: the file holds none), and that file,
    /// named in errors.
    pub args: Option<Args>,
    pub args_file: PathBuf,
    /// `""` for Megatron-LM's checkpoints; NeMo 2's wrapper adds `module.`, an
    /// `fsdp_dtensor` checkpoint its wrappers' (`module.`, flat `model.module.`).
    pub prefix: String,
}

/// Reads the Megatron checkpoint in `dir`. `config` is config.json's content when
/// `--config` names one: its head counts are used and no config is written.
pub fn read_megatron(dir: &Path, config: Option<&serde_json::Value>) -> Result<Read, FormatError> {
    // Megatron-Bridge (and newer Megatron-LM) keep the run's configuration beside the
    // weights as YAML, its `model:` the TransformerConfig; Megatron-LM's training loop
    // keeps `args` in common.pt.
    let run_config = dir.join(RUN_CONFIG);
    let origin = if std::fs::symlink_metadata(&run_config).is_ok() {
        Origin {
            args: Some(yaml_args::read(&run_config, "model")?),
            args_file: run_config,
            prefix: String::new(),
        }
    } else {
        Origin {
            args: args::read_args(dir)?,
            args_file: dir.join(args::COMMON),
            prefix: String::new(),
        }
    };
    read_megatron_from(dir, config, origin)
}

/// [`read_megatron`] with the arguments and the names' prefix given (a NeMo 2
/// checkpoint's `weights/`: see [`super::nemo`]).
pub fn read_megatron_from(
    dir: &Path,
    config: Option<&serde_json::Value>,
    origin: Origin,
) -> Result<Read, FormatError> {
    let marker = dir.join(MARKER);
    let text = crate::formats::input::read_json_text(&marker)?;
    let meta: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        FormatError::invalid_as(Kind::NotTheFormat, &marker, format!("not valid JSON: {e}"))
    })?;
    let backend = meta.get("sharded_backend").and_then(|b| b.as_str());
    if backend != Some("torch_dist") {
        return Err(FormatError::invalid_as(
            Kind::Unsupported,
            &marker,
            format!(
                "says the checkpoint was written by the `{}` backend; devmap reads `torch_dist` (Megatron-Core's default since 0.7): convert it with Megatron's own tools first",
                backend.unwrap_or("?")
            ),
        ));
    }
    let raw = super::dcp::read_dcp(dir, None)?;
    convert(dir, raw, config, origin)
}

/// The HF model's tensors (and config.json) out of the DCP checkpoint `raw` read from
/// `dir`, whose tensors carry megatron-core's names after `origin`'s prefix.
fn convert(
    dir: &Path,
    raw: Split,
    config: Option<&serde_json::Value>,
    origin: Origin,
) -> Result<Read, FormatError> {
    let metadata = dir.join(super::dcp::METADATA);
    let Origin {
        args,
        args_file,
        prefix,
    } = origin;
    // Megatron-core's names: the wrapper's prefix taken off (names without it, such as
    // the optimizer's, stay as they are).
    let named = |name: &str| {
        name.strip_prefix(prefix.as_str())
            .unwrap_or(name)
            .to_owned()
    };

    // Every saved tensor as chunks of its files.
    let mut sources: BTreeMap<String, (DType, Vec<u64>, Vec<Piece>)> = BTreeMap::new();
    for (file, (_, header)) in raw.files.iter().enumerate() {
        for t in &header.tensors {
            // A tensor stored whole is one chunk at offset zero.
            let shape = t.shape.to_vec();
            let chunk = Piece {
                range: ByteRange {
                    file,
                    offset: t.offset,
                    len: t.len,
                },
                offsets: vec![0; shape.len()].into(),
                sizes: shape.as_slice().into(),
                stride: None,
            };
            sources.insert(named(&t.name), (t.dtype, shape, vec![chunk]));
        }
    }
    for t in raw.pieced {
        sources.insert(named(&t.name), (t.dtype, t.shape.to_vec(), t.pieces));
    }

    let mut left_out = LeftOut::default();
    for entry in &raw.left_out {
        left_out.entry(entry);
    }
    // Split the names: the optimizer's (left out), the map's, and the others (refused).
    let mut mapped: Vec<(&str, names::Named)> = Vec::new();
    for name in sources.keys() {
        if name.starts_with("optimizer.") {
            left_out.optimizer += 1;
            continue;
        }
        if name.starts_with("mtp.") {
            left_out.mtp += 1;
            continue;
        }
        let named = names::parse_name(name);
        if !layout::is_mapped(&named.key) {
            return Err(FormatError::tensor_as(
                Kind::Unsupported,
                &metadata,
                name,
                "has no Hugging Face name in devmap's Megatron-Core map (Llama, Mistral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek-V3 and GLM-4-MoE layers: docs/guide.md, Input formats); nothing was written",
            ));
        }
        mapped.push((name, named));
    }

    let shapes = shapes::shapes(&metadata, &sources)?;
    let heads = resolve_heads(&args_file, config, args.as_ref(), &shapes)?;
    let moe = moe_names(config, &shapes);
    // Without --config, config.json is written from the arguments.
    let generated = if config.is_none() {
        let args = args.as_ref().ok_or_else(|| no_args(&args_file))?;
        let dtype = sources
            .get("embedding.word_embeddings.weight")
            .map_or(DType::F32, |s| s.0);
        let text = args::config_json(args, &shapes, (heads, moe), dtype.torch_name()).map_err(|missing| {
            FormatError::invalid_as(
                Kind::Missing,
                &args_file,
                format!(
                    "holds the training arguments, but not {}: devmap cannot write the config.json transformers needs; give --config DIR with the model's config.json",
                    missing.join(", ")
                ),
            )
        })?;
        Some(text)
    } else {
        None
    };

    // The outputs, each whole in one file or in pieces.
    let mut files: Vec<(PathBuf, super::safetensors::Header)> = raw
        .files
        .into_iter()
        .map(|(path, mut header)| {
            header.tensors.clear();
            (path, header)
        })
        .collect();
    let mut pieced = Vec::new();
    for (name, named) in mapped {
        let (key, layer) = (named.key, named.layer);
        let (dtype, shape, chunks) = &sources[name];
        let source = Source {
            name,
            dtype: *dtype,
            shape,
            chunks,
        };
        // Stacked layers: one output per index of the leading axis.
        let stacked = key.starts_with(layout::LAYERS) && layer.is_none();
        let layers: Vec<Option<u64>> = match (stacked, layer) {
            (true, _) => (0..shape.first().copied().unwrap_or(0)).map(Some).collect(),
            (false, l) => vec![l],
        };
        let outputs = layout::outputs_of(&key, moe, shapes.latent.is_some())
            .map_err(|why| FormatError::tensor_as(Kind::Unsupported, &metadata, name, why))?;
        if let Some(half) = named.half
            && !outputs.iter().any(|o| o.1 == layout::Cut::GateUp(half))
        {
            return Err(FormatError::tensor_as(
                Kind::Unsupported,
                &metadata,
                name,
                "is half of a gated linear_fc1 (singleton_local_shards), but the map cuts no gate and up projection from that tensor",
            ));
        }
        for (template, cut, per_expert) in outputs {
            // One half of a gated linear_fc1 saved apart: the rule of that half, whole.
            let cut = match (named.half, cut) {
                (None, cut) => cut,
                (Some(half), layout::Cut::GateUp(part)) if half == part => layout::Cut::Whole,
                (Some(_), _) => continue,
            };
            // An expert axis follows the layer axis (or leads, for a layer saved apart);
            // an expert saved apart names its own.
            let expert_axis = usize::from(stacked);
            let (experts, expert_from_axis): (Vec<Option<u64>>, bool) =
                match (per_expert, named.expert) {
                    (true, Some(e)) => (vec![Some(e)], false),
                    (true, None) => (
                        (0..shape.get(expert_axis).copied().unwrap_or(0))
                            .map(Some)
                            .collect(),
                        true,
                    ),
                    (false, _) => (vec![None], false),
                };
            let outputs: Vec<(Option<u64>, Option<u64>)> = layers
                .iter()
                .flat_map(|&at| experts.iter().map(move |&e| (at, e)))
                .collect();
            for (at, expert) in outputs {
                let mut prefix: Vec<u64> = if stacked {
                    at.into_iter().collect()
                } else {
                    Vec::new()
                };
                if expert_from_axis {
                    prefix.extend(expert);
                }
                if shape.len() <= prefix.len() {
                    return Err(FormatError::tensor_as(
                        Kind::Malformed,
                        &metadata,
                        name,
                        format!(
                            "has shape {shape:?}, which has no rows after its layer and expert axes"
                        ),
                    ));
                }
                let rows = shape.get(prefix.len()).copied().unwrap_or(0);
                let blocks = layout::row_blocks(cut, rows, Some(heads))
                    .map_err(|why| FormatError::tensor_as(Kind::Malformed, &metadata, name, why))?;
                let out_rows: u64 = blocks.iter().map(|b| b.len).sum();
                let mut out_shape = vec![out_rows];
                out_shape.extend_from_slice(&shape[prefix.len() + 1..]);
                let mut hf = template.to_owned();
                if let Some(e) = expert {
                    hf = hf.replace("{e}", &e.to_string());
                }
                if let Some(l) = at {
                    hf = hf.replace("{}", &l.to_string());
                }
                let pieces = layout::select(&metadata, &source, &prefix, &blocks)?;
                let whole = match pieces.as_slice() {
                    [p] if p.offsets.iter().all(|&o| o == 0) && *p.sizes == *out_shape => {
                        Some(p.range)
                    }
                    _ => None,
                };
                match whole {
                    Some(range) => files[range.file].1.tensors.push(HeaderTensor {
                        name: hf.into(),
                        dtype: *dtype,
                        shape: Shape::new(&out_shape),
                        offset: range.offset,
                        len: range.len,
                    }),
                    None => pieced.push(PiecedTensor {
                        name: hf,
                        dtype: *dtype,
                        shape: Shape::new(&out_shape),
                        pieces,
                    }),
                }
            }
        }
    }
    for (_, header) in &mut files {
        header.tensors.sort_by_key(|t| (t.offset, t.len));
    }
    Ok(Read {
        split: Split {
            files,
            pieced,
            left_out: left_out.lines(),
        },
        config: generated,
    })
}

/// The family whose names a MoE layer takes: `--config`'s model type, else DeepSeek-V3
/// for latent attention, GLM-4-MoE for a router bias or an ungated shared expert,
/// Qwen2-MoE for a gated shared expert, Qwen3-MoE when the attention has per-head q/k
/// norms, Mixtral when none.
fn moe_names(config: Option<&serde_json::Value>, shapes: &Shapes) -> MoeNames {
    let given = config
        .and_then(|c| c.get("model_type"))
        .and_then(|t| t.as_str())
        .and_then(MoeNames::of_model_type);
    match given {
        Some(family) => family,
        None if shapes.latent.is_some() => MoeNames::DeepseekV3,
        None if shapes.expert_bias || (shapes.shared_ffn.is_some() && !shapes.shared_gate) => {
            MoeNames::Glm4Moe
        }
        None if shapes.shared_ffn.is_some() => MoeNames::Qwen2Moe,
        None if shapes.qk_norm.is_some() => MoeNames::Qwen3Moe,
        None => MoeNames::Mixtral,
    }
}

/// The error for a checkpoint whose hyperparameters nothing gives (`file`: where they
/// were looked for).
fn no_args(file: &Path) -> FormatError {
    FormatError::invalid_as(
        Kind::Missing,
        file,
        "holds no training arguments for this Megatron-Core checkpoint (Megatron-LM's training loop saves them as `args` in common.pt, NeMo 2 as context/model.yaml's `config`): devmap needs num_attention_heads, num_query_groups and kv_channels to cut linear_qkv, and norm_epsilon, rotary_base and max_position_embeddings to write config.json; give --config DIR with the model's Hugging Face config.json",
    )
}

/// The head counts: `--config`'s, else the arguments', checked against the shapes.
fn resolve_heads(
    args_file: &Path,
    config: Option<&serde_json::Value>,
    args: Option<&Args>,
    shapes: &Shapes,
) -> Result<Heads, FormatError> {
    let (heads, from) = match (config, args) {
        (Some(c), _) => (
            args::heads_from_config(c, shapes),
            "--config's config.json (num_attention_heads, num_key_value_heads, head_dim)"
                .to_owned(),
        ),
        (None, Some(a)) => (
            args::heads_from_args(a, shapes),
            format!(
                "{}'s arguments (num_attention_heads, num_query_groups, kv_channels)",
                args_file
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
            ),
        ),
        (None, None) => return Err(no_args(args_file)),
    };
    let heads = heads.ok_or_else(|| {
        FormatError::invalid_as(
            Kind::Missing,
            args_file,
            format!("is a Megatron-Core checkpoint, and {from} do not say num_attention_heads"),
        )
    })?;
    let fits = match shapes.latent {
        Some(_) => deepseek::latent_dims(heads.query, shapes).map(|_| ()),
        None => args::check_heads(heads, shapes),
    };
    fits.map_err(|why| {
        FormatError::invalid_as(Kind::Malformed, args_file, format!("{from}: {why}"))
    })?;
    Ok(heads)
}

/// What was left out, counted by kind.
#[derive(Default)]
struct LeftOut {
    optimizer: usize,
    mtp: usize,
    extra_state: usize,
    other: Vec<String>,
}

impl LeftOut {
    fn entry(&mut self, line: &str) {
        if line.contains("_extra_state") {
            self.extra_state += 1;
        } else {
            self.other.push(line.to_owned());
        }
    }

    fn lines(self) -> Vec<String> {
        let mut lines = Vec::new();
        if self.optimizer > 0 {
            lines.push(format!(
                "`optimizer` ({})",
                crate::text::count(self.optimizer, "tensor", "tensors")
            ));
        }
        if self.mtp > 0 {
            lines.push(format!(
                "`mtp` ({}: multi-token prediction layers, which transformers' models do not have)",
                crate::text::count(self.mtp, "tensor", "tensors")
            ));
        }
        if self.extra_state > 0 {
            lines.push(format!(
                "`_extra_state` ({}: Transformer Engine's FP8 state, not weights)",
                crate::text::count(self.extra_state, "entry", "entries")
            ));
        }
        lines.extend(self.other);
        lines
    }
}
