//! torch.distributed.checkpoint folders (`dcp.save` with the default
//! `FileSystemWriter`): `.metadata`, a pickle of torch's `Metadata` dataclass, says
//! for each entry of the state dict its dtype, size and chunks (`offsets`, `sizes`),
//! and where each chunk is stored (`__R_S.distcp`, a byte range). Each chunk is a
//! `torch.save` archive of one tensor inside that range. Both are read without torch
//! and without running anything (`formats::pickle` with [`Allow::DcpMetadata`],
//! `formats::zip`).
//!
//! A nested state dict is flattened with `.` by DCP itself, which records each entry's
//! path of keys (`planner_data`: `model.model.layers.0…` is `("model",
//! "model.layers.0…")`). devmap keeps the model's part: the entries whose path starts
//! with the key `model`, named by the rest of their path, when there are any; else
//! every tensor entry under its own name (a model's state dict saved flat). Entries
//! that are not tensors (`BytesStorageMetadata`: an epoch counter, a learning-rate
//! schedule) are left out.
//!
//! A tensor stored whole (one chunk: what one process writes, and what ranks write for
//! tensors they do not shard) is a byte range of its `.distcp` file, like a `.bin`
//! tensor. A tensor split into chunks across ranks is stored in pieces, one per chunk
//! (`types::pieces`): whether they make up the tensor is the loader's check.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::pickle::{self, Allow, Value};
use super::safetensors::{Header, HeaderTensor};
use super::split::{PiecedTensor, Split};
use super::{FormatError, Kind, zip};
use crate::types::DType;
use crate::types::pieces::Piece;
use crate::types::range::ByteRange;
use crate::types::shape::Shape;

/// The metadata file of a DCP folder.
pub const METADATA: &str = ".metadata";

/// The largest `.metadata` devmap reads (millions of entries are a few hundred MB).
const MAX_METADATA: u64 = 1 << 30;

/// The state dict's part that is the model, when the checkpoint nests one.
const MODEL_KEY: &str = "model";

/// One tensor entry of `.metadata`.
struct Entry {
    dtype: DType,
    size: Vec<u64>,
    /// `(offsets, sizes)` of each chunk.
    chunks: Vec<(Vec<u64>, Vec<u64>)>,
}

/// Where one chunk is stored.
struct Stored {
    file: String,
    offset: u64,
    length: u64,
}

/// An entry of the checkpoint that is not a tensor (`BytesStorageMetadata`: what
/// `torch.save` made of a Python object, such as Megatron-LM's `args`), and where its
/// bytes are stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// Its flattened name in the state dict.
    pub fqn: String,
    /// The `.distcp` file, and the byte range of the `torch.save` archive in it.
    pub file: PathBuf,
    pub offset: u64,
    pub length: u64,
}

/// A DCP folder read: the model's tensors ([`read_dcp`]), and every entry that is not
/// a tensor (none of them read yet).
pub struct Read {
    pub split: Split,
    pub objects: Vec<Object>,
}

/// The tensors of the DCP checkpoint in `dir`, under the model's names: per `.distcp`
/// file those stored whole (a [`Header`] each, tensors with absolute byte ranges), and
/// those split into chunks across ranks as pieces. `key` names the part of a nested
/// state dict that is the model (`None`: `model`, when there is one).
pub fn read_dcp(dir: &Path, key: Option<&str>) -> Result<Split, FormatError> {
    Ok(read_dcp_objects(dir, key)?.split)
}

/// [`read_dcp`], and where each entry that is not a tensor is stored.
pub fn read_dcp_objects(dir: &Path, key: Option<&str>) -> Result<Read, FormatError> {
    let path = dir.join(METADATA);
    let file = super::input::open_regular(&path)?;
    let len = file
        .metadata()
        .map_err(|e| FormatError::io(&path, e))?
        .len();
    if len > MAX_METADATA {
        return Err(FormatError::invalid_as(
            Kind::TooLarge,
            &path,
            "is too large to be a checkpoint's metadata",
        ));
    }
    // From the file just opened and checked, not the path again.
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    std::io::Read::read_to_end(&mut &file, &mut bytes).map_err(|e| FormatError::io(&path, e))?;
    let value = pickle::read_as(&bytes, Allow::DcpMetadata)
        .map_err(|e| FormatError::invalid_as(e.kind(), &path, format!("{e}")))?;
    let (entries, stored, paths, not_tensors) = metadata(&path, value)?;
    // The model's part of a nested state dict, named by the rest of its path; else
    // every tensor entry under its own name.
    let wanted = key.unwrap_or(MODEL_KEY);
    let model_name = |fqn: &str| -> Option<String> {
        match paths.get(fqn)?.as_slice() {
            [first, rest @ ..] if first == wanted && !rest.is_empty() => Some(rest.join(".")),
            _ => None,
        }
    };
    let nested = entries.iter().any(|(fqn, _)| model_name(fqn).is_some());
    if key.is_some() && !nested {
        let mut keys: Vec<&str> = paths
            .values()
            .filter(|p| p.len() > 1)
            .map(|p| p[0].as_str())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        return Err(FormatError::invalid_as(
            Kind::Missing,
            &path,
            format!(
                "has no tensors under the key `{wanted}` (--state-dict-key); its nested keys: {}",
                if keys.is_empty() {
                    "none, it is flat".to_owned()
                } else {
                    keys.join(", ")
                }
            ),
        ));
    }
    let model = entries
        .iter()
        .filter_map(|(fqn, entry)| match model_name(fqn) {
            Some(name) => Some((fqn, name, entry)),
            None => (!nested).then(|| (fqn, fqn.clone(), entry)),
        });
    // What is not the model's, by the key it is under: left out, and said so.
    let mut left_out: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    let top = |fqn: &'_ str| -> String {
        paths
            .get(fqn)
            .and_then(|p| p.first().cloned())
            .unwrap_or_else(|| fqn.to_owned())
    };
    let tops: Vec<(String, bool)> = entries
        .iter()
        .filter(|(fqn, _)| nested && model_name(fqn).is_none())
        .map(|(fqn, _)| (top(fqn), true))
        .chain(not_tensors.iter().map(|fqn| (top(fqn), false)))
        .collect();
    for (key, tensor) in &tops {
        *left_out.entry(key).or_default() += usize::from(*tensor);
    }
    let left_out = left_out
        .into_iter()
        .map(|(key, tensors)| match tensors {
            0 => format!("`{key}`"),
            n => format!("`{key}` ({})", crate::text::count(n, "tensor", "tensors")),
        })
        .collect();
    let mut data = DataFiles::default();
    let mut pieced = Vec::new();
    for (fqn, name, entry) in model {
        let whole = entry.chunks.len() == 1
            && entry.chunks[0].0.iter().all(|&o| o == 0)
            && entry.chunks[0].1 == entry.size;
        let mut pieces = Vec::with_capacity(entry.chunks.len());
        for (offsets, sizes) in &entry.chunks {
            let Some(at) = stored.get(&(fqn.clone(), offsets.clone())) else {
                return Err(FormatError::tensor_as(
                    Kind::Missing,
                    &path,
                    fqn,
                    format!(
                        "has no storage entry for its chunk at {offsets:?}: its data is in no .distcp file"
                    ),
                ));
            };
            let (file, tensor) = data.chunk(dir, &path, fqn, at)?;
            if tensor.dtype != entry.dtype || !tensor.shape.iter().eq(sizes.iter().copied()) {
                return Err(FormatError::tensor(
                    data.path(file),
                    fqn,
                    format!(
                        "has a chunk at {offsets:?} stored as {} {:?}, but .metadata says {} {sizes:?}",
                        tensor.dtype,
                        tensor.shape.to_vec(),
                        entry.dtype,
                    ),
                ));
            }
            if whole {
                data.files[file].1.tensors.push(HeaderTensor {
                    name: name.as_str().into(),
                    ..tensor
                });
                break;
            }
            pieces.push(Piece {
                range: ByteRange {
                    file,
                    offset: tensor.offset,
                    len: tensor.len,
                },
                offsets: offsets.as_slice().into(),
                sizes: sizes.as_slice().into(),
                stride: None,
            });
        }
        if !whole {
            pieced.push(PiecedTensor {
                name,
                dtype: entry.dtype,
                shape: Shape::new(&entry.size),
                pieces,
            });
        }
    }
    let mut files = data.files;
    for (_, header) in &mut files {
        header.tensors.sort_by_key(|t| (t.offset, t.len));
    }
    // A bytes entry's storage is keyed by its name and no offsets.
    let objects = not_tensors
        .iter()
        .filter_map(|fqn| {
            let at = stored.get(&(fqn.clone(), Vec::new()))?;
            super::hf_index::is_shard_file_name(&at.file).then(|| Object {
                fqn: fqn.clone(),
                file: dir.join(&at.file),
                offset: at.offset,
                length: at.length,
            })
        })
        .collect();
    Ok(Read {
        split: Split {
            files,
            pieced,
            left_out,
        },
        objects,
    })
}

/// The `.distcp` files opened so far, each once, with the whole tensors found in it.
#[derive(Default)]
struct DataFiles {
    files: Vec<(PathBuf, Header)>,
    open: Vec<std::fs::File>,
    by_name: HashMap<String, usize>,
}

impl DataFiles {
    fn path(&self, file: usize) -> &Path {
        &self.files[file].0
    }

    /// Opens the data file `name` of the folder `dir` for the first of its chunks
    /// (tensor `fqn`'s); returns its index.
    fn open(
        &mut self,
        dir: &Path,
        metadata: &Path,
        fqn: &str,
        name: &str,
    ) -> Result<usize, FormatError> {
        let data_path = dir.join(name);
        let data = super::input::open_regular(&data_path).map_err(|e| {
            FormatError::tensor_as(
                Kind::Missing,
                metadata,
                fqn,
                format!("is stored in {name}, which cannot be read: {e}"),
            )
        })?;
        let file_len = data
            .metadata()
            .map_err(|e| FormatError::io(&data_path, e))?
            .len();
        self.open.push(data);
        self.files.push((
            data_path,
            Header {
                data_start: 0,
                file_len,
                tensors: Vec::new(),
                metadata: None,
            },
        ));
        self.by_name.insert(name.to_owned(), self.files.len() - 1);
        Ok(self.files.len() - 1)
    }

    /// The tensor of the chunk stored at `at`, as a byte range of its file (by index).
    fn chunk(
        &mut self,
        dir: &Path,
        metadata: &Path,
        fqn: &str,
        at: &Stored,
    ) -> Result<(usize, HeaderTensor), FormatError> {
        if !super::hf_index::is_shard_file_name(&at.file) {
            return Err(FormatError::tensor_as(
                Kind::Unsafe,
                metadata,
                fqn,
                format!(
                    "is stored in `{}`, which is not a file in the folder",
                    at.file
                ),
            ));
        }
        let file = match self.by_name.get(&at.file) {
            Some(&i) => i,
            None => self.open(dir, metadata, fqn, &at.file)?,
        };
        let (data_path, header) = &self.files[file];
        if at
            .offset
            .checked_add(at.length)
            .is_none_or(|e| e > header.file_len)
        {
            return Err(FormatError::tensor_as(
                Kind::Truncated,
                data_path,
                fqn,
                format!(
                    "is stored at bytes {}..{} of a file of {}",
                    at.offset,
                    at.offset.saturating_add(at.length),
                    header.file_len
                ),
            ));
        }
        let tensor = chunk_tensor(data_path, &self.open[file], (at.offset, at.length), fqn)?;
        Ok((file, tensor))
    }
}

/// The tensor a chunk's `torch.save` archive (bytes `offset..offset + length` of
/// `file`) holds, as a byte range of the file.
fn chunk_tensor(
    path: &Path,
    file: &std::fs::File,
    (offset, length): (u64, u64),
    fqn: &str,
) -> Result<HeaderTensor, FormatError> {
    let members = zip::members_in(path, file, offset, length)?;
    let (prefix, value) =
        super::torch_bin::read_archive(path, file, &members, Allow::StateDict, &|kind, m| {
            FormatError::tensor_as(kind, path, fqn, format!("its chunk {m}"))
        })?;
    let Value::Tensor(t) = value else {
        return Err(FormatError::tensor_as(
            Kind::NotTheFormat,
            path,
            fqn,
            "its chunk holds something other than a tensor",
        ));
    };
    let member =
        super::torch_bin::storage_member(&members, &prefix, &t.storage.key).ok_or_else(|| {
            FormatError::tensor_as(
                Kind::Missing,
                path,
                fqn,
                format!("its storage data/{} is not in its chunk", t.storage.key),
            )
        })?;
    super::torch_bin::byte_range(path, fqn, &t, member)
}

/// What `.metadata` says: the tensor entries (by fully qualified name), where each
/// chunk is stored (by name and the chunk's offsets), and each entry's path of keys in the nested state dict.
type Parsed = (
    Vec<(String, Entry)>,
    HashMap<(String, Vec<u64>), Stored>,
    HashMap<String, Vec<String>>,
    Vec<String>,
);

/// [`Parsed`] from the `Metadata` object `.metadata` holds.
fn metadata(path: &Path, value: Value) -> Result<Parsed, FormatError> {
    let bad = |m: &str| FormatError::invalid_as(Kind::NotTheFormat, path, m.to_owned());
    let fields = object_fields(&value, "Metadata")
        .ok_or_else(|| bad("does not hold torch.distributed.checkpoint's Metadata"))?;
    let Some(Value::Dict(state)) = field(fields, "state_dict_metadata") else {
        return Err(bad("has no state_dict_metadata"));
    };
    let mut entries = Vec::new();
    let mut not_tensors = Vec::new();
    for (key, meta) in state {
        let Value::Str(fqn) = key else {
            return Err(bad("has a state dict key that is not a string"));
        };
        let Some(fields) = object_fields(meta, "TensorStorageMetadata") else {
            // BytesStorageMetadata: not a tensor (an epoch, a scheduler's state).
            not_tensors.push(fqn.clone());
            continue;
        };
        let entry = tensor_entry(fields).ok_or_else(|| {
            FormatError::tensor(path, fqn, "has tensor metadata devmap cannot read")
        })?;
        entries.push((fqn.clone(), entry));
    }
    let Some(Value::Dict(storage)) = field(fields, "storage_data") else {
        return Err(bad("has no storage_data"));
    };
    let mut stored = HashMap::new();
    for (index, info) in storage {
        let (Some(index), Some(info)) = (
            object_fields(index, "MetadataIndex"),
            object_fields(info, "_StorageInfo"),
        ) else {
            return Err(bad("has storage_data entries devmap cannot read"));
        };
        let (Some(Value::Str(fqn)), Some(Value::Str(file)), Some(offset), Some(length)) = (
            field(index, "fqn"),
            field(info, "relative_path"),
            field(info, "offset").and_then(Value::as_u64),
            field(info, "length").and_then(Value::as_u64),
        ) else {
            return Err(bad("has storage_data entries devmap cannot read"));
        };
        // A bytes entry (not a tensor) has no offsets.
        let chunk_offsets = field(index, "offset")
            .and_then(Value::dims)
            .unwrap_or_default();
        stored.insert(
            (fqn.clone(), chunk_offsets),
            Stored {
                file: file.clone(),
                offset,
                length,
            },
        );
    }
    // `planner_data`: each flattened name's path of keys (absent, or not a dict, when
    // the state dict was not flattened).
    let mut paths = HashMap::new();
    if let Some(Value::Dict(items)) = field(fields, "planner_data") {
        for (key, value) in items {
            let (Value::Str(fqn), Value::Tuple(parts)) = (key, value) else {
                continue;
            };
            let parts: Option<Vec<String>> = parts
                .iter()
                .map(|p| match p {
                    Value::Str(s) => Some(s.clone()),
                    Value::Int(i) => Some(i.to_string()),
                    _ => None,
                })
                .collect();
            if let Some(parts) = parts {
                paths.insert(fqn.clone(), parts);
            }
        }
    }
    Ok((entries, stored, paths, not_tensors))
}

fn tensor_entry(fields: &[(Value, Value)]) -> Option<Entry> {
    let size = field(fields, "size")?.dims()?;
    // TensorProperties' state is a tuple: (dtype, layout, requires_grad, memory format,
    // pin_memory); or, from older torch, its fields.
    let properties = match field(fields, "properties")? {
        Value::Object { state, .. } => state.as_ref(),
        _ => return None,
    };
    let dtype = match properties {
        Value::Tuple(items) => match items.first()? {
            Value::DType(d) => *d,
            _ => return None,
        },
        Value::Dict(items) => match field(items, "dtype")? {
            Value::DType(d) => *d,
            _ => return None,
        },
        _ => return None,
    };
    let Value::List(chunks) = field(fields, "chunks")? else {
        return None;
    };
    let chunks = chunks
        .iter()
        .map(|c| {
            let f = object_fields(c, "ChunkStorageMetadata")?;
            Some((field(f, "offsets")?.dims()?, field(f, "sizes")?.dims()?))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Entry {
        dtype,
        size,
        chunks,
    })
}

/// The fields of an object of `class` (its state, a dict).
fn object_fields<'a>(value: &'a Value, class: &str) -> Option<&'a [(Value, Value)]> {
    match value {
        Value::Object { class: c, state } if *c == class => match state.as_ref() {
            Value::Dict(items) => Some(items),
            // A dataclass with slots pickles (None, {slots}).
            Value::Tuple(pair) => match pair.as_slice() {
                [_, Value::Dict(items)] => Some(items),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

fn field<'a>(fields: &'a [(Value, Value)], name: &str) -> Option<&'a Value> {
    fields
        .iter()
        .find(|(k, _)| matches!(k, Value::Str(s) if s == name))
        .map(|(_, v)| v)
}
