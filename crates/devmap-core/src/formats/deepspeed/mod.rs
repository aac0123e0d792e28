//! DeepSpeed ZeRO checkpoints (`engine.save_checkpoint(DIR)`): `DIR/latest` names the
//! step folder (`global_stepN`), which holds the model states (`mp_rank_00_model_states.pt`
//! for stages 1 and 2, one `zero_pp_rank_R_mp_rank_00_model_states.pt` per rank for
//! stage 3) and each rank's optimizer states (`zero_pp_rank_R_mp_rank_00_optim_states.pt`).
//! All are `torch.save` archives, read without torch and without running anything
//! (`formats::pickle` with [`Allow::DeepSpeed`]).
//!
//! The weights are the fp32 master copies the optimizer states hold, as DeepSpeed's
//! `zero_to_fp32` rebuilds them: the model states' `param_shapes` give each parameter's
//! name and shape, in the order its elements sit in the flat groups.
//! - Stages 1 and 2: each rank holds a slice of each group's flat vector
//!   (`single_partition_of_fp32_groups`); the slices, rank after rank, are the vector,
//!   and parameters follow one another in it (with `param_alignment_paddings` after
//!   each). A parameter is stored in the pieces of it the ranks' slices hold.
//! - Stage 3: every parameter is split over the ranks itself: each rank holds
//!   `ceil(numel / ranks)` elements of it (the last padded), one parameter after
//!   another in its flat groups (`fp32_flat_groups`, one run across groups).
//!
//! Pieces are blocks of the flattened parameter (see `types::pieces`). Buffers come
//! from the model states' `module` as stored; frozen parameters from
//! `frozen_param_fragments` (stages 2 and 3) or, under ZeRO 1, which does not list
//! them, from `module` too; `shared_params` (one parameter under two names) give the
//! second name the first one's pieces. Only data parallelism (`mp_rank_00`) is read.

use std::path::{Path, PathBuf};

use super::pickle::{Allow, Value};
use super::safetensors::{Header, HeaderTensor};
use super::split::{PiecedTensor, Split};
use super::{FormatError, Kind, zip};
use crate::types::DType;
use crate::types::pieces::Piece;
use crate::types::range::ByteRange;
use crate::types::shape::Shape;

/// The file naming the latest step's folder.
pub const LATEST: &str = "latest";

/// Files DeepSpeed leaves beside the step folders that are not the model's (a save
/// copies the small files of a model folder, but not these).
pub const OWN_FILES: [&str; 3] = [LATEST, "zero_to_fp32.py", "zero_to_torch.py"];

/// The folder holding a step's files: `dir` itself when it holds optimizer states,
/// else the one `dir/latest` names.
pub fn step_folder(dir: &Path) -> Option<PathBuf> {
    if !optim_files(dir).is_empty() {
        return Some(dir.to_path_buf());
    }
    let latest = super::input::read_json_text(&dir.join(LATEST)).ok()?;
    let name = latest.trim();
    if !super::hf_index::is_shard_file_name(name) {
        return None;
    }
    let step = dir.join(name);
    (!optim_files(&step).is_empty()).then_some(step)
}

/// The ranks' optimizer-state files of a step folder, by rank: `(rank, path)`.
fn optim_files(step: &Path) -> Vec<(u32, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(step) else {
        return Vec::new();
    };
    let mut files: Vec<(u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let rank = rank_in(&name, "_optim_states.pt")?;
            Some((rank, e.path()))
        })
        .collect();
    files.sort();
    files
}

/// The rank in `…zero_pp_rank_R_mp_rank_00<suffix>` (`bf16_` in front too).
pub(super) fn rank_in(name: &str, suffix: &str) -> Option<u32> {
    let rest = name.strip_suffix(suffix)?;
    let rest = rest.strip_prefix("bf16_").unwrap_or(rest);
    let rest = rest.strip_prefix("zero_pp_rank_")?;
    let (rank, mp) = rest.split_once("_mp_rank_")?;
    (mp == "00").then_some(())?;
    rank.parse().ok()
}

/// A file of the step folder saved by a model-parallel rank other than 00
/// (`mp_rank_01_model_states.pt`, `zero_pp_rank_0_mp_rank_01_optim_states.pt`) or by
/// a pipeline's stages (`layer_03-model_00-model_states.pt`), if any.
fn model_parallel_file(step: &Path) -> Option<PathBuf> {
    let split = |name: &str| {
        let Some(name) = name.strip_suffix(".pt") else {
            return false;
        };
        let other_rank = name
            .split_once("mp_rank_")
            .is_some_and(|(_, rest)| !rest.starts_with("00_"));
        let pipeline_layer = name.starts_with("layer_") && name.ends_with("-model_states");
        other_rank || pipeline_layer
    };
    let mut names: Vec<PathBuf> = std::fs::read_dir(step)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(split))
        .collect();
    names.sort();
    names.into_iter().next()
}

/// One opened archive: its path, file, members and the value its pickle holds.
struct Archive {
    path: PathBuf,
    members: Vec<zip::Member>,
    prefix: String,
    value: Value,
    len: u64,
}

impl Archive {
    fn open(path: &Path) -> Result<Archive, FormatError> {
        let file = super::input::open_regular(path)?;
        let len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
        let members = zip::members(path, &file, len)?;
        let (prefix, value) = super::torch_bin::read_archive(
            path,
            &file,
            &members,
            Allow::DeepSpeed,
            &|kind, message| FormatError::invalid_as(kind, path, message),
        )?;
        Ok(Archive {
            path: path.to_path_buf(),
            members,
            prefix,
            value,
            len,
        })
    }

    fn bad(&self, message: impl Into<String>) -> FormatError {
        FormatError::invalid_as(Kind::NotTheFormat, &self.path, message.into())
    }

    /// The entry `key` of the dict at `path` (keys from the top), or an error naming it.
    fn get(&self, path: &[&str]) -> Result<&Value, FormatError> {
        let mut at = &self.value;
        for (i, key) in path.iter().enumerate() {
            at = at.get(key).ok_or_else(|| {
                self.bad(format!(
                    "has no `{}`: not a DeepSpeed checkpoint devmap can read",
                    path[..=i].join(".")
                ))
            })?;
        }
        Ok(at)
    }

    /// A tensor of the pickle as a byte range of this archive (contiguous views only).
    fn tensor(&self, name: &str, value: &Value) -> Result<HeaderTensor, FormatError> {
        let Value::Tensor(t) = value else {
            return Err(FormatError::tensor(&self.path, name, "is not a tensor"));
        };
        let member = super::torch_bin::storage_member(&self.members, &self.prefix, &t.storage.key)
            .ok_or_else(|| {
                FormatError::tensor_as(
                    Kind::Missing,
                    &self.path,
                    name,
                    format!("its storage data/{} is not in the archive", t.storage.key),
                )
            })?;
        super::torch_bin::byte_range(&self.path, name, t, member)
    }
}

fn list(v: &Value) -> &[Value] {
    match v {
        Value::List(items) | Value::Tuple(items) => items,
        _ => &[],
    }
}

fn dict(v: &Value) -> &[(Value, Value)] {
    match v {
        Value::Dict(items) => items,
        _ => &[],
    }
}

fn string(v: &Value) -> Option<&str> {
    match v {
        Value::Str(s) => Some(s),
        _ => None,
    }
}

/// `(name, shape)` of each entry of a dict of shapes.
fn shapes(archive: &Archive, v: &Value) -> Result<Vec<(String, Vec<u64>)>, FormatError> {
    dict(v)
        .iter()
        // A torch.Size (or list) of dimensions; anything else is no shape (a bare
        // integer read as an empty list would be a scalar).
        .map(|(k, v)| match (string(k), v.dims()) {
            (Some(name), Some(shape)) => Ok((name.to_owned(), shape)),
            _ => Err(archive.bad("has a parameter shape devmap cannot read")),
        })
        .collect()
}

/// A flat group's place: which split file holds it, and where.
#[derive(Clone, Copy)]
struct Flat {
    file: usize,
    offset: u64,
    elements: u64,
}

/// The model's tensors in the ZeRO checkpoint in `dir` (the folder `latest` is in, or
/// the step folder itself).
pub fn read_deepspeed(dir: &Path) -> Result<Split, FormatError> {
    let step = step_folder(dir).ok_or_else(|| {
        FormatError::invalid_as(
            Kind::Missing,
            dir,
            "holds no DeepSpeed optimizer states (`*_optim_states.pt`), nor a `latest` naming a folder that does",
        )
    })?;
    if let Some(path) = model_parallel_file(&step) {
        // Each model-parallel rank holds its own slice of every split weight; reading
        // rank 00 alone would write a model of slices. zero_to_fp32 refuses it too.
        return Err(FormatError::invalid_as(
            Kind::Unsupported,
            &path,
            "was saved by a model-parallel rank other than mp_rank_00 or by a pipeline stage: devmap reads ZeRO checkpoints of data parallelism alone (tensor or pipeline parallel parts are not put together)",
        ));
    }
    let optim_paths = optim_files(&step);
    let optim: Vec<Archive> = optim_paths
        .iter()
        .map(|(_, p)| Archive::open(p))
        .collect::<Result<_, _>>()?;
    let ranks = optim.len() as u64;
    for (i, (rank, path)) in optim_paths.iter().enumerate() {
        if u64::from(*rank) != i as u64 {
            return Err(FormatError::invalid_as(
                Kind::Missing,
                path,
                format!("is rank {rank}'s, but rank {i}'s optimizer states are missing"),
            ));
        }
    }
    let first = &optim[0];
    let stage = Value::as_u64(first.get(&["optimizer_state_dict", "zero_stage"])?)
        .ok_or_else(|| first.bad("has a zero_stage that is not a number"))?;
    let partitions = first.get(&["optimizer_state_dict", "partition_count"])?;
    let partition_count = partitions
        .as_u64()
        .or_else(|| list(partitions).iter().filter_map(Value::as_u64).max());
    if partition_count != Some(ranks) {
        return Err(first.bad(format!(
            "was saved by {} ranks, but the folder holds {ranks} optimizer-state files",
            partition_count.map_or("an unknown number of".to_owned(), |n| n.to_string())
        )));
    }
    let model_paths: Vec<PathBuf> = if stage <= 2 {
        vec![step.join("mp_rank_00_model_states.pt")]
    } else {
        (0..ranks)
            .map(|r| step.join(format!("zero_pp_rank_{r}_mp_rank_00_model_states.pt")))
            .collect()
    };
    let models: Vec<Archive> = model_paths
        .iter()
        .map(|p| Archive::open(p))
        .collect::<Result<_, _>>()?;
    let model = &models[0];

    // The split's files: the model states, then the ranks' optimizer states.
    let mut files: Vec<(PathBuf, Header)> = models
        .iter()
        .chain(&optim)
        .map(|a| {
            (
                a.path.clone(),
                Header {
                    data_start: 0,
                    file_len: a.len,
                    tensors: Vec::new(),
                    metadata: None,
                },
            )
        })
        .collect();
    let optim_file = |rank: usize| models.len() + rank;

    // Buffers, as the model states store them.
    let buffer_names: Vec<&str> = list(model.get(&["buffer_names"])?)
        .iter()
        .filter_map(string)
        .collect();
    from_module(model, &mut files[0].1.tensors, |n| {
        buffer_names.contains(&n)
    })?;

    let mut pieced: Vec<PiecedTensor> = Vec::new();
    let mut dtype = None;
    // Each rank's flat groups.
    let groups_key = if stage <= 2 {
        "single_partition_of_fp32_groups"
    } else {
        "fp32_flat_groups"
    };
    let mut flats: Vec<Vec<Flat>> = Vec::new();
    for (rank, archive) in optim.iter().enumerate() {
        let mut groups = Vec::new();
        for (g, v) in list(archive.get(&["optimizer_state_dict", groups_key])?)
            .iter()
            .enumerate()
        {
            let t = archive.tensor(&format!("{groups_key}[{g}]"), v)?;
            if *dtype.get_or_insert(t.dtype) != t.dtype {
                return Err(archive.bad("holds flat groups of two dtypes"));
            }
            groups.push(Flat {
                file: optim_file(rank),
                offset: t.offset,
                elements: t.len / t.dtype.size(),
            });
        }
        flats.push(groups);
    }
    let dtype = dtype.unwrap_or(DType::F32);
    let param_groups: Vec<Vec<(String, Vec<u64>)>> = list(model.get(&["param_shapes"])?)
        .iter()
        .map(|g| shapes(model, g))
        .collect::<Result<_, _>>()?;
    let mut add = |name: String, shape: Vec<u64>, pieces: Vec<Piece>| {
        pieced.push(PiecedTensor {
            name,
            dtype,
            shape: Shape::new(&shape),
            pieces,
        });
    };
    if stage <= 2 {
        let paddings = first
            .get(&["optimizer_state_dict"])?
            .get("param_alignment_paddings");
        for (g, params) in param_groups.iter().enumerate() {
            // The group's vector: rank 0's slice, then rank 1's, …
            let slices: Vec<Flat> = flats
                .iter()
                .map(|groups| {
                    groups
                        .get(g)
                        .copied()
                        .ok_or_else(|| first.bad(format!("has no flat group {g} on every rank")))
                })
                .collect::<Result<_, _>>()?;
            let padding: Vec<u64> = paddings
                .and_then(|p| list(p).get(g))
                .map(|p| list(p).iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            let mut at = 0u64;
            for (i, (name, shape)) in params.iter().enumerate() {
                let numel: u64 = shape.iter().product();
                let mut pieces = Vec::new();
                let mut start = 0u64;
                for slice in &slices {
                    let (lo, hi) = (at.max(start), (at + numel).min(start + slice.elements));
                    if lo < hi {
                        pieces.push(flat_piece(slice, lo - start, lo - at, hi - lo, dtype));
                    }
                    start += slice.elements;
                }
                add(name.clone(), shape.clone(), pieces);
                at += numel + padding.get(i).copied().unwrap_or(0);
            }
        }
    } else {
        // Each rank's groups run one after another.
        let total: u64 = flats[0].iter().map(|f| f.elements).sum();
        let mut at = 0u64;
        for (name, shape) in param_groups.iter().flatten() {
            let numel: u64 = shape.iter().product();
            let part = numel.div_ceil(ranks);
            let mut pieces = Vec::new();
            for (rank, groups) in flats.iter().enumerate() {
                let begin = rank as u64 * part;
                let len = part.min(numel.saturating_sub(begin));
                pieces.extend(across_groups(groups, at, begin, len, dtype));
            }
            add(name.clone(), shape.clone(), pieces);
            at += part;
        }
        if at > total {
            return Err(first.bad(format!(
                "holds {total} elements of flat groups per rank, but its parameters need {at}"
            )));
        }
    }

    // Frozen parameters: whole in the model states (stages 1–2), or a fragment per rank.
    let frozen = shapes(
        model,
        model
            .value
            .get("frozen_param_shapes")
            .unwrap_or(&Value::None),
    )?;
    for (name, shape) in frozen {
        let numel: u64 = shape.iter().product();
        if stage <= 2 {
            let v = model.get(&["frozen_param_fragments", &name])?;
            let mut t = model.tensor(&name, v)?;
            t.name = name.into();
            t.shape = Shape::new(&shape);
            files[0].1.tensors.push(t);
        } else {
            let part = numel.div_ceil(ranks);
            let mut pieces = Vec::new();
            for (rank, archive) in models.iter().enumerate() {
                let v = archive.get(&["frozen_param_fragments", &name])?;
                let t = archive.tensor(&name, v)?;
                let begin = rank as u64 * part;
                let len = part.min(numel.saturating_sub(begin));
                let size = t.dtype.size();
                if len > 0 {
                    pieces.push(Piece {
                        range: ByteRange {
                            file: rank,
                            offset: t.offset,
                            len: len * size,
                        },
                        offsets: vec![begin].into(),
                        sizes: vec![len].into(),
                        stride: None,
                    });
                }
            }
            add(name, shape, pieces);
        }
    }

    // A parameter under a second name: that name reads the first one's bytes.
    for (k, v) in dict(model.value.get("shared_params").unwrap_or(&Value::None)) {
        let (Some(alias), Some(of)) = (string(k), string(v)) else {
            continue;
        };
        if let Some(t) = pieced.iter().find(|t| t.name == of).cloned() {
            pieced.push(PiecedTensor {
                name: alias.to_owned(),
                ..t
            });
        }
    }
    if stage <= 2 {
        add_untracked_frozen(model, &pieced, &mut files[0].1.tensors)?;
    }
    for (_, header) in &mut files {
        header.tensors.sort_by_key(|t| (t.offset, t.len));
    }
    Ok(Split {
        files,
        pieced,
        left_out: vec!["the optimizer's own state (`base_optimizer_state`)".to_owned()],
    })
}

/// Parameters the optimizer never saw and the model states do not list as frozen:
/// ZeRO 1 records no `frozen_param_shapes` (DeepSpeed saves those for stages 2 and 3),
/// so a run that froze part of the model keeps those parameters only in the model
/// states' `module`, whole, as they were loaded. `zero_to_fp32` leaves them out, and a
/// model loaded from its output gets them freshly initialised; they are read from
/// `module` instead. (Stage 2 lists them, and read that way they are the same bytes.)
fn add_untracked_frozen(
    model: &Archive,
    pieced: &[PiecedTensor],
    whole: &mut Vec<HeaderTensor>,
) -> Result<(), FormatError> {
    let known: std::collections::HashSet<String> = pieced
        .iter()
        .map(|t| t.name.clone())
        .chain(whole.iter().map(|t| t.name.to_string()))
        .collect();
    from_module(model, whole, |n| !known.contains(n))
}

/// The entries of the model states' `module` (the model's state dict as the run held
/// it) whose names `keep` accepts, added to `whole` as stored.
fn from_module(
    model: &Archive,
    whole: &mut Vec<HeaderTensor>,
    keep: impl Fn(&str) -> bool,
) -> Result<(), FormatError> {
    for (k, v) in dict(model.get(&["module"])?) {
        if let Some(name) = string(k).filter(|n| keep(n)) {
            let mut t = model.tensor(name, v)?;
            t.name = name.into();
            whole.push(t);
        }
    }
    Ok(())
}

/// The piece `len` elements of a flat slice hold, from element `from` of the slice,
/// which are elements `to..` of the flattened parameter.
fn flat_piece(slice: &Flat, from: u64, to: u64, len: u64, dtype: DType) -> Piece {
    Piece {
        range: ByteRange {
            file: slice.file,
            offset: slice.offset + from * dtype.size(),
            len: len * dtype.size(),
        },
        offsets: vec![to].into(),
        sizes: vec![len].into(),
        stride: None,
    }
}

/// The pieces of a rank's `len` elements at `at` of its groups run together, which are
/// elements `begin..` of the flattened parameter (ZeRO-3: a rank's share may cross
/// from one group into the next).
fn across_groups(groups: &[Flat], at: u64, begin: u64, len: u64, dtype: DType) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut start = 0u64;
    for group in groups {
        let (lo, hi) = (at.max(start), (at + len).min(start + group.elements));
        if lo < hi {
            pieces.push(flat_piece(
                group,
                lo - start,
                begin + (lo - at),
                hi - lo,
                dtype,
            ));
        }
        start += group.elements;
    }
    pieces
}

#[cfg(test)]
mod tests;
