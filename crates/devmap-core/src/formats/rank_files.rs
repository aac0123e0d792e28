//! transformers 5 distributed checkpoints (`save_pretrained(…,
//! distributed_checkpoint=True)`, torch's `HuggingFaceStorageWriter` with
//! `save_distributed=True`): every rank writes safetensors files of its own,
//! `shard-0000R-model-0000K-of-0000N.safetensors`, holding its block of each tensor
//! under the tensor's full name. Each header's `__metadata__` carries
//! `DCP_SHARDING_INFO`, a JSON object giving each name's `saved_offsets` in the whole
//! tensor; the block's own shape is its entry's. There is no index: a tensor's whole
//! shape is, along each dimension, the largest offset plus size of its blocks, as
//! torch's reader computes it.
//!
//! A name every block of which is the whole tensor at offset 0 (a replicated tensor
//! one rank wrote) is a plain entry of that file; others are stored in pieces.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::safetensors::{Header, HeaderTensor, read_header};
use super::split::{PiecedTensor, Split};
use super::{FormatError, Kind};
use crate::types::pieces::Piece;
use crate::types::range::ByteRange;
use crate::types::shape::Shape;

/// The `__metadata__` key holding the blocks' offsets.
pub const SHARDING_INFO: &str = "DCP_SHARDING_INFO";

/// Whether `name` is a rank file's name: `shard-NNNNN-model-NNNNN-of-NNNNN.safetensors`.
pub fn is_rank_file_name(name: &str) -> bool {
    let Some(rest) = name
        .strip_prefix("shard-")
        .and_then(|r| r.strip_suffix(".safetensors"))
    else {
        return false;
    };
    let parts: Vec<&str> = rest.split('-').collect();
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    matches!(parts[..], [r, "model", k, "of", n] if digits(r) && digits(k) && digits(n))
}

/// The offsets `DCP_SHARDING_INFO` gives each name of a rank file's header.
fn saved_offsets(path: &Path, header: &Header) -> Result<HashMap<String, Vec<u64>>, FormatError> {
    let Some(info) = header.metadata.as_ref().and_then(|m| m.get(SHARDING_INFO)) else {
        return Ok(HashMap::new());
    };
    #[derive(serde::Deserialize)]
    struct Entry {
        saved_offsets: Vec<u64>,
    }
    let entries: HashMap<String, Entry> = serde_json::from_str(info).map_err(|e| {
        FormatError::invalid_as(
            Kind::NotTheFormat,
            path,
            format!("has a {SHARDING_INFO} in its metadata that is not what torch writes: {e}"),
        )
    })?;
    Ok(entries
        .into_iter()
        .map(|(name, e)| (name, e.saved_offsets))
        .collect())
}

/// One rank file's block of a tensor: (file, tensor as its header gives it, offsets).
type Block = (usize, HeaderTensor, Vec<u64>);

/// The tensors of the rank files `paths` (sorted), under their full names.
pub fn read_rank_files(paths: &[PathBuf]) -> Result<Split, FormatError> {
    let mut files = Vec::with_capacity(paths.len());
    // Each name's blocks, in file order: (file, tensor as its header gives it, offsets).
    let mut blocks: HashMap<Box<str>, Vec<Block>> = HashMap::new();
    let mut order = Vec::new();
    for (file, path) in paths.iter().enumerate() {
        let mut header = read_header(path)?;
        let mut offsets = saved_offsets(path, &header)?;
        for t in std::mem::take(&mut header.tensors) {
            let at = offsets
                .remove(&*t.name)
                .unwrap_or_else(|| vec![0; t.shape.len()]);
            if at.len() != t.shape.len() {
                return Err(FormatError::tensor(
                    path,
                    &*t.name,
                    format!(
                        "has {} dimensions, but {SHARDING_INFO} gives it offsets {at:?}",
                        t.shape.len()
                    ),
                ));
            }
            let list = blocks.entry(t.name.clone()).or_insert_with(|| {
                order.push(t.name.clone());
                Vec::new()
            });
            list.push((file, t, at));
        }
        files.push((path.clone(), header));
    }
    let mut pieced = Vec::new();
    for name in order {
        let Some(list) = blocks.remove(&*name) else {
            continue;
        };
        let (first_file, first, _) = &list[0];
        if let Some((file, other, _)) = list.iter().find(|(_, t, _)| t.dtype != first.dtype) {
            return Err(FormatError::tensor(
                &paths[*file],
                &*name,
                format!(
                    "is {} here but {} in {}",
                    other.dtype,
                    first.dtype,
                    paths[*first_file].display()
                ),
            ));
        }
        let dims = first.shape.len();
        if let Some((file, _, _)) = list.iter().find(|(_, t, _)| t.shape.len() != dims) {
            return Err(FormatError::tensor(
                &paths[*file],
                &*name,
                format!(
                    "has another number of dimensions than in {}",
                    paths[*first_file].display()
                ),
            ));
        }
        let mut size = vec![0u64; dims];
        for (_, t, at) in &list {
            for (d, (o, s)) in at.iter().zip(t.shape.iter()).enumerate() {
                size[d] = size[d].max(o.saturating_add(s));
            }
        }
        let whole = list.iter().all(|(_, t, at)| {
            at.iter().all(|&o| o == 0) && t.shape.iter().eq(size.iter().copied())
        });
        if whole {
            // Replicated: each copy is the whole tensor; the first one is read.
            if let Some((file, t, _)) = list.into_iter().next() {
                files[file].1.tensors.push(t);
            }
            continue;
        }
        let dtype = first.dtype;
        let pieces = list
            .into_iter()
            .map(|(file, t, at)| Piece {
                range: ByteRange {
                    file,
                    offset: t.offset,
                    len: t.len,
                },
                offsets: at.into_boxed_slice(),
                sizes: t.shape.to_vec().into_boxed_slice(),
                stride: None,
            })
            .collect();
        pieced.push(PiecedTensor {
            name: name.to_string(),
            dtype,
            shape: Shape::new(&size),
            pieces,
        });
    }
    for (_, header) in &mut files {
        header.tensors.sort_by_key(|t| (t.offset, t.len));
    }
    Ok(Split {
        files,
        pieced,
        left_out: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_file_names_are_torchs_pattern_only() {
        assert!(is_rank_file_name(
            "shard-00001-model-00001-of-00002.safetensors"
        ));
        assert!(!is_rank_file_name("model-00001-of-00002.safetensors"));
        assert!(!is_rank_file_name(
            "shard-1-model-00001-of-00002.safetensors"
        ));
        assert!(!is_rank_file_name("shard-00001-model-00001-of-00002.bin"));
        assert!(!is_rank_file_name(
            "shard-00001-model-00001-of-00002-x.safetensors"
        ));
    }
}
