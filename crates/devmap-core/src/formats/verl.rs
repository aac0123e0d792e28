//! verl's FSDP checkpoints (`global_step_N/actor/`): each rank of the FSDP2 job saved
//! its `model.state_dict()` with `torch.save` as `model_world_size_N_rank_K.pt`, a dict
//! of DTensors (`torch.distributed.tensor`), each holding the rank's block of a
//! parameter and its spec: the global shape, the device mesh and the placement
//! (`Shard(dim)`: the tensor cut along `dim` as `torch.chunk` cuts it, one chunk a rank
//! in mesh order; `Replicate()`: the whole tensor on every rank). Beside them:
//! `optim_world_size_N_rank_K.pt` and `extra_state_world_size_N_rank_K.pt` (the
//! optimizer and the scheduler/RNG state: left out), `fsdp_config.json`, and
//! `huggingface/` with the model's config.json.
//!
//! Read without torch: each rank file's pickle through the restricted reader (DTensors
//! built as data), each block a piece of its rank file, put together as DCP's are.
//! A mesh of several dimensions (FSDP with tensor parallelism: FSDP2's
//! `_StridedShard` over the tensor-parallel `Shard`; HSDP's `Replicate`) is cut as
//! torch cuts it ([`super::dtensor`]), each mesh dimension's size the largest
//! coordinate on it plus one; a block held by several ranks is read from one.
//! `Partial` placements and FSDP1's `ShardedTensor`s are refused by name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::dtensor::Placement;
use super::pickle::{self, TensorRef, Value};
use super::safetensors::{Header, HeaderTensor};
use super::split::{PiecedTensor, Split};
use super::{FormatError, Kind, torch_bin};
use crate::types::pieces::Piece;
use crate::types::range::ByteRange;
use crate::types::shape::Shape;

/// The folder verl writes the model's config.json (and tokenizer) into.
pub const HF_FOLDER: &str = "huggingface";

/// `(world size, rank)` of a model rank file's name, `model_world_size_N_rank_K.pt`.
pub fn rank_of(name: &str) -> Option<(u64, u64)> {
    let rest = name
        .strip_prefix("model_world_size_")?
        .strip_suffix(".pt")?;
    let (world, rank) = rest.split_once("_rank_")?;
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let (world, rank) = (number(world)?, number(rank)?);
    (rank < world).then_some((world, rank))
}

/// The model rank files of `dir` in rank order, when it has any; an error when their
/// world sizes disagree or a rank's file is missing.
pub fn rank_files(dir: &Path) -> Result<Option<Vec<PathBuf>>, FormatError> {
    let entries = std::fs::read_dir(dir).map_err(|e| FormatError::io(dir, e))?;
    let mut found: BTreeMap<u64, (u64, PathBuf)> = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|e| FormatError::io(dir, e))?;
        let name = entry.file_name();
        if let Some((world, rank)) = name.to_str().and_then(rank_of) {
            found.insert(rank, (world, entry.path()));
        }
    }
    let Some((world, _)) = found.values().next().map(|(w, p)| (*w, p.clone())) else {
        return Ok(None);
    };
    if let Some((other, path)) = found.values().find(|(w, _)| *w != world) {
        return Err(FormatError::invalid(
            path,
            format!(
                "is a rank file of a {other}-rank job beside rank files of a {world}-rank one: which job the model is not clear"
            ),
        ));
    }
    if let Some(missing) = (0..world).find(|r| !found.contains_key(r)) {
        return Err(FormatError::invalid_as(
            Kind::Missing,
            dir,
            format!(
                "holds rank files of a {world}-rank FSDP job but not model_world_size_{world}_rank_{missing}.pt: each rank's file holds its block of every parameter"
            ),
        ));
    }
    Ok(Some(found.into_values().map(|(_, p)| p).collect()))
}

/// A DTensor's fields: its pickled state is a dict, or (for its `__slots__`) a pair of
/// `(dict or None, slots dict)`.
fn dtensor_fields(state: &Value) -> Option<&Value> {
    match state {
        Value::Dict(_) => Some(state),
        Value::Tuple(parts) => parts.iter().find(|p| p.get("_local_tensor").is_some()),
        _ => None,
    }
}

/// A DTensor's local tensor, from its parts (`(wrapper arguments, state)`).
fn local_tensor(parts: &Value) -> Result<&TensorRef, &'static str> {
    let Value::Tuple(parts) = parts else {
        return Err("is a DTensor without its parts");
    };
    match parts
        .get(1)
        .and_then(dtensor_fields)
        .and_then(|f| f.get("_local_tensor"))
    {
        Some(Value::Tensor(t)) => Ok(t),
        _ => Err("is a DTensor without a local tensor"),
    }
}

fn state_of(value: &Value) -> Option<&Value> {
    match value {
        Value::Object { state, .. } => Some(state),
        _ => None,
    }
}

/// One rank's block of a parameter: where in the whole tensor it lies.
struct Block {
    rank: usize,
    tensor: HeaderTensor,
    offsets: Vec<u64>,
    whole: Vec<u64>,
}

/// A DTensor as its rank file holds it: its local tensor, the whole shape, and where
/// on the mesh the rank sits and how the mesh places it.
struct Placed {
    rank: usize,
    tensor: HeaderTensor,
    whole: Vec<u64>,
    coordinate: Vec<u64>,
    placements: Vec<Placement>,
}

/// A DTensor of rank `rank`: its local tensor's bytes, its global shape, its
/// coordinate on the mesh (the spec's; on a mesh of one dimension, else the file
/// name's rank) and its placements.
fn placed_of(
    (path, name): (&Path, &str),
    rank: usize,
    state: &Value,
    local: HeaderTensor,
) -> Result<Placed, FormatError> {
    let bad = |kind: Kind, why: String| FormatError::tensor_as(kind, path, name, why);
    let malformed = |what: &str| bad(Kind::Malformed, format!("is a DTensor without {what}"));
    let Value::Tuple(parts) = state else {
        return Err(malformed("its parts"));
    };
    let [wrapper, fields] = parts.as_slice() else {
        return Err(malformed("its parts"));
    };
    let whole = match wrapper {
        Value::Tuple(args) => args.get(2).and_then(Value::dims),
        _ => None,
    }
    .ok_or_else(|| malformed("a global size"))?;
    let spec = dtensor_fields(fields)
        .and_then(|f| f.get("_spec"))
        .and_then(state_of)
        .ok_or_else(|| malformed("a spec"))?;
    let Some(Value::Tuple(placements) | Value::List(placements)) = spec.get("placements") else {
        return Err(malformed("placements"));
    };
    let int = |state: &Value, key: &str| match state.get(key) {
        Some(Value::Int(d)) => u64::try_from(*d).ok(),
        _ => None,
    };
    let mut places = Vec::with_capacity(placements.len());
    for placement in placements {
        places.push(match placement {
            Value::Object {
                class: "Shard",
                state,
            } => Placement::Shard(
                int(state, "dim").ok_or_else(|| malformed("a shard dimension"))? as usize,
            ),
            Value::Object {
                class: "_StridedShard",
                state,
            } => Placement::Strided {
                dim: int(state, "dim").ok_or_else(|| malformed("a shard dimension"))? as usize,
                split_factor: int(state, "split_factor")
                    .filter(|&f| f > 0)
                    .ok_or_else(|| malformed("a split factor"))?,
            },
            Value::Object {
                class: "Replicate", ..
            } => Placement::Replicate,
            Value::Object { class, .. } => {
                return Err(bad(
                    Kind::Unsupported,
                    format!(
                        "is a DTensor placed as `{class}`, which devmap does not put together (it reads Shard, _StridedShard and Replicate)"
                    ),
                ));
            }
            _ => return Err(malformed("a placement")),
        });
    }
    // The rank's place on the mesh: the spec says it; on a mesh of one dimension, the
    // file name's rank where it does not.
    let coordinate = match spec
        .get("mesh")
        .and_then(state_of)
        .and_then(|m| m.get("_coordinate_on_dim"))
        .and_then(Value::dims)
    {
        Some(c) if c.len() == places.len() => c,
        _ if places.len() == 1 => vec![rank as u64],
        _ => return Err(malformed("its coordinate on the mesh")),
    };
    Ok(Placed {
        rank,
        tensor: local,
        whole,
        coordinate,
        placements: places,
    })
}

/// Where a placed DTensor's block lies, on a mesh of `sizes`; its local tensor must
/// be that block's shape.
fn block_of(path: &Path, name: &str, placed: Placed, sizes: &[u64]) -> Result<Block, FormatError> {
    let (offsets, shape) =
        super::dtensor::block(&placed.whole, sizes, &placed.coordinate, &placed.placements)
            .map_err(|why| FormatError::tensor_as(Kind::Unsupported, path, name, why))?;
    if placed.tensor.shape.to_vec() != shape {
        return Err(FormatError::tensor_as(
            Kind::Malformed,
            path,
            name,
            format!(
                "is the block of shape {:?} at mesh coordinate {:?} of a {:?} tensor, where its placements ({:?} on a {sizes:?} mesh) give {shape:?}",
                placed.tensor.shape.to_vec(),
                placed.coordinate,
                placed.whole,
                placed.placements
            ),
        ));
    }
    Ok(Block {
        rank: placed.rank,
        tensor: placed.tensor,
        offsets,
        whole: placed.whole,
    })
}

/// Every rank file's blocks put together: whole tensors (replicated, or a world of
/// one) as entries of a file, the others in pieces, one piece a rank.
pub fn read_verl(paths: &[PathBuf]) -> Result<Split, FormatError> {
    let world = paths.len() as u64;
    let mut files = Vec::with_capacity(paths.len());
    let mut held: BTreeMap<String, Vec<Placed>> = BTreeMap::new();
    for (rank, path) in paths.iter().enumerate() {
        let archive = torch_bin::StateDictArchive::open(path, pickle::Allow::DTensor)?;
        for (name, value) in &archive.items {
            let name = name.as_str();
            let (local, dtensor) = match value {
                Value::Tensor(t) => (t, None),
                Value::Object {
                    class: "DTensor",
                    state,
                } => {
                    let local = local_tensor(state)
                        .map_err(|why| FormatError::tensor_as(Kind::Malformed, path, name, why))?;
                    (local, Some(state.as_ref()))
                }
                _ => {
                    return Err(FormatError::tensor_as(
                        Kind::Unsupported,
                        path,
                        name,
                        "is neither a tensor nor a DTensor (FSDP1's ShardedTensor is not read): devmap reads verl checkpoints of FSDP2",
                    ));
                }
            };
            let member = archive.member_of(path, name, local)?;
            let tensor = torch_bin::byte_range(path, name, local, member)?;
            let placed = match dtensor {
                Some(state) => placed_of((path, name), rank, state, tensor)?,
                // A plain tensor: whole, on no mesh.
                None => Placed {
                    rank,
                    whole: tensor.shape.to_vec(),
                    tensor,
                    coordinate: Vec::new(),
                    placements: Vec::new(),
                },
            };
            held.entry(name.to_owned()).or_default().push(placed);
        }
        files.push((
            path.clone(),
            Header {
                data_start: 0,
                file_len: archive.file_len,
                tensors: Vec::new(),
                metadata: None,
            },
        ));
    }
    // Each mesh dimension's size: the largest coordinate on it plus one (the rank files
    // of a job cover its mesh), per number of mesh dimensions.
    let mut sizes: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for p in held.values().flatten() {
        let dims = sizes
            .entry(p.coordinate.len())
            .or_insert_with(|| vec![1; p.coordinate.len()]);
        for (size, &c) in dims.iter_mut().zip(&p.coordinate) {
            *size = (*size).max(c + 1);
        }
    }
    let mut pieced = Vec::new();
    for (name, placed) in held {
        let count = placed.len();
        let mut list = Vec::with_capacity(count);
        for p in placed {
            let mesh = sizes
                .get(&p.coordinate.len())
                .map_or(&[][..], Vec::as_slice);
            list.push(block_of(&paths[p.rank], &name, p, mesh)?);
        }
        let first = &list[0];
        if let Some(other) = list
            .iter()
            .find(|b| b.whole != first.whole || b.tensor.dtype != first.tensor.dtype)
        {
            return Err(FormatError::tensor(
                &paths[other.rank],
                &name,
                format!(
                    "is a {} {:?} tensor here but {} {:?} in {}",
                    other.tensor.dtype,
                    other.whole,
                    first.tensor.dtype,
                    first.whole,
                    paths[first.rank].display()
                ),
            ));
        }
        let whole = first.whole.clone();
        if let Some(at) = list.iter().position(|b| b.tensor.shape.to_vec() == whole) {
            // Replicated (or one rank): any copy is the whole tensor.
            let copy = list.swap_remove(at);
            files[copy.rank].1.tensors.push(copy.tensor);
            continue;
        }
        let (first_rank, dtype) = (first.rank, first.tensor.dtype);
        // A block several ranks hold (replicated along a mesh dimension) is read from
        // the first of them.
        list.sort_by(|a, b| (&a.offsets, a.rank).cmp(&(&b.offsets, b.rank)));
        list.dedup_by(|b, a| b.offsets == a.offsets && b.tensor.shape == a.tensor.shape);
        // Sharded: the blocks must cover the tensor (the placements' blocks do not
        // overlap, so their sizes add up to it exactly when every rank's is there).
        let numel: u64 = whole.iter().product();
        let covered: u64 = list
            .iter()
            .map(|b| b.tensor.shape.iter().product::<u64>())
            .sum();
        if covered != numel || count != paths.len() {
            return Err(FormatError::tensor_as(
                Kind::Missing,
                &paths[first_rank],
                &name,
                format!(
                    "has blocks of {covered} of its {numel} elements in {count} of the {} rank files",
                    paths.len()
                ),
            ));
        }
        let pieces = list
            .into_iter()
            .filter(|b| b.tensor.len > 0)
            .map(|b| Piece {
                range: ByteRange {
                    file: b.rank,
                    offset: b.tensor.offset,
                    len: b.tensor.len,
                },
                offsets: b.offsets.into_boxed_slice(),
                sizes: b.tensor.shape.to_vec().into_boxed_slice(),
                stride: None,
            })
            .collect();
        pieced.push(PiecedTensor {
            name,
            dtype,
            shape: Shape::new(&whole),
            pieces,
        });
    }
    for (_, header) in &mut files {
        header.tensors.sort_by_key(|t| (t.offset, t.len));
    }
    Ok(Split {
        files,
        pieced,
        left_out: vec![format!(
            "the optimizer and extra state (`optim_world_size_{world}_rank_*.pt`, `extra_state_world_size_{world}_rank_*.pt`)"
        )],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_file_names_are_verls_pattern_only() {
        assert_eq!(rank_of("model_world_size_4_rank_3.pt"), Some((4, 3)));
        assert_eq!(rank_of("model_world_size_4_rank_4.pt"), None);
        assert_eq!(rank_of("optim_world_size_4_rank_3.pt"), None);
        assert_eq!(rank_of("model_world_size__rank_0.pt"), None);
        assert_eq!(rank_of("model_world_size_2_rank_1.pt.tmp"), None);
    }
}
