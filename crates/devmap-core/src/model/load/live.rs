//! A model in a Python session, described by a live-model manifest
//! (`formats::live`), read into a [`Checkpoint`] the saver writes like any other.
//!
//! The manifest already names tensors as `save_pretrained` writes them (the Python side
//! ran transformers' own tie removal and weight-conversion reversal), so nothing here
//! renames or ties: each entry becomes one tensor whose source is a range of process
//! memory or of a file, stored in one dtype and held by the model in another where the
//! two differ (`Tensor::load_dtype`, which `DtypeChoice::AsLoaded` writes).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::LoadError;
use crate::formats::FormatError;
use crate::formats::config::{ModelConfig, read_config};
use crate::formats::live::{LivePiece, LiveSource, LiveTensor, Manifest, STAGED_PREFIX};
use crate::formats::safetensors::HeaderCache;
use crate::model::checkpoint::{
    ByteRange, Checkpoint, FileId, InputKind, NO_KEY, NamedTie, Parts, Piece, Source, SourceFile,
    Tensor, TieEvidence,
};
use crate::types::DType;
use crate::types::placement::Placement;

/// Reads `manifest` into a checkpoint. `origin` names the manifest in errors.
pub fn load_live(manifest: &Manifest, origin: &Path) -> Result<Checkpoint, LoadError> {
    load_live_into(manifest, origin, None)
}

/// [`load_live`] for a save into `out`: a tensor is copied from the file it is mapped
/// from only when that file is not inside `out` (a save into the model's own folder
/// replaces it; the tensor is then read from memory, as the model holds it).
pub fn load_live_saving_to(
    manifest: &Manifest,
    origin: &Path,
    out: &Path,
) -> Result<Checkpoint, LoadError> {
    let out = out.canonicalize().unwrap_or_else(|_| out.to_path_buf());
    load_live_into(manifest, origin, Some(out))
}

fn load_live_into(
    manifest: &Manifest,
    origin: &Path,
    out: Option<PathBuf>,
) -> Result<Checkpoint, LoadError> {
    let config_path = manifest.config_dir.join("config.json");
    let config = if config_path.is_file() {
        read_config(&config_path)?
    } else {
        ModelConfig::absent()
    };
    let mut files = Files {
        mapped: crate::sys::mapped::Mappings::of_process(manifest.pid),
        memory: crate::sys::proc::memory_of(manifest.pid),
        out,
        ..Files::default()
    };
    let mut tensors = Vec::with_capacity(manifest.tensors.len());
    let mut ties = Vec::new();
    let mut pieces = Vec::new();
    for live in &manifest.tensors {
        if let LiveSource::Tied { to } = &live.source {
            // The kept name first: it is the one a save writes.
            // One parameter under two names: the live model's own storage says so.
            ties.push(NamedTie {
                names: vec![to.clone(), live.name.clone()],
                evidence: TieEvidence::SameStorage,
            });
        }
        tensors.push(tensor_of(live, (&mut files, &mut pieces), origin)?);
    }
    let mut ckpt = Checkpoint::assemble(Parts {
        dir: manifest.config_dir.clone(),
        files: files.list,
        tensors,
        ties,
        device_map: None,
        device_map_path: None,
        offload_dir: None,
        config,
        weight_files: Vec::new(),
        config_dir: None,
        warnings: Vec::new(),
        replaced: Vec::new(),
        pieces,
    });
    if let Some(w) = ckpt.tensors().windows(2).find(|w| w[0].name == w[1].name) {
        return Err(LoadError::Conflict {
            path: origin.to_path_buf(),
            message: format!("names tensor `{}` twice", w[0].name),
        });
    }
    ckpt.total_parameters = manifest.total_parameters;
    ckpt.title.clone_from(&manifest.title);
    if let Some(map) = &manifest.device_map {
        let map = crate::formats::device_map::parse_device_map(origin, &map.to_string())?;
        // The key that placed each tensor, for the reports; where it lives stays what
        // the session says (a map edit in the inspector re-places from the map).
        ckpt.record_device_map(map);
    }
    Ok(ckpt)
}

/// The source files met so far, each once.
#[derive(Default)]
struct Files {
    list: Vec<SourceFile>,
    ids: HashMap<PathBuf, FileId>,
    headers: HeaderCache,
    /// The Python process's file mappings, read once.
    mapped: crate::sys::mapped::Mappings,
    /// Where its memory reads from (`/proc/self/mem` in that process).
    memory: PathBuf,
    /// The folder a save writes into (canonical): its files are never read for a
    /// mapped tensor.
    out: Option<PathBuf>,
}

impl Files {
    fn id(
        &mut self,
        path: &Path,
        len: u64,
        modified: Option<std::time::SystemTime>,
        kind: InputKind,
    ) -> FileId {
        if let Some(&id) = self.ids.get(path) {
            return id;
        }
        self.list.push(SourceFile {
            path: path.to_path_buf(),
            len,
            modified,
            kind,
        });
        self.ids.insert(path.to_path_buf(), self.list.len() - 1);
        self.list.len() - 1
    }

    /// The Python process's memory: no length or time to compare (the Python side
    /// checks each tensor's version counter instead).
    fn memory(&mut self) -> FileId {
        let path = std::mem::take(&mut self.memory);
        let id = self.id(&path, 0, None, InputKind::ProcessMemory);
        self.memory = path;
        id
    }
}

fn tensor_of(
    live: &LiveTensor,
    (files, pieces): (&mut Files, &mut Vec<Box<[Piece]>>),
    origin: &Path,
) -> Result<Tensor, LoadError> {
    let bad = |message: String| {
        LoadError::Format(FormatError::tensor(origin, live.name.clone(), message))
    };
    let dtype_of = |name: &str| {
        DType::from_torch_name(name).ok_or_else(|| {
            bad(format!(
                "has dtype `{name}`, which safetensors cannot store"
            ))
        })
    };
    let held = dtype_of(&live.dtype)?;
    let placement = Placement::parse_device(&live.device).ok_or_else(|| {
        bad(format!(
            "is on device `{}`, which devmap does not know",
            live.device
        ))
    })?;
    let shape = crate::types::shape::Shape::new(&live.shape);
    let numel = live
        .shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            bad(format!(
                "has shape {:?}, more elements than fit in 64 bits",
                live.shape
            ))
        })?;
    let bytes_as = |dtype: DType| {
        numel.checked_mul(dtype.size()).ok_or_else(|| {
            bad(format!(
                "has shape {:?}, more bytes than fit in 64 bits",
                live.shape
            ))
        })
    };
    let (source, stored) = match &live.source {
        LiveSource::Memory { address } => {
            let len = bytes_as(held)?;
            // A tensor still as the file it was mapped from holds it (transformers maps
            // the safetensors weights it loads as stored): copied from there, it does
            // not fault every page of it into this process.
            if let Some((path, offset)) = files.mapped.file_behind(*address, len)
                && let Ok(meta) = std::fs::metadata(&path)
                && !files
                    .out
                    .as_ref()
                    .is_some_and(|out| path.canonicalize().is_ok_and(|p| p.starts_with(out)))
            {
                let file = files.id(&path, meta.len(), meta.modified().ok(), InputKind::File);
                return Ok(Tensor {
                    name: live.name.as_str().into(),
                    shape,
                    source: Source::Checkpoint(ByteRange { file, offset, len }),
                    placement,
                    map_key: NO_KEY,
                    dtype: held,
                    load_dtype: None,
                });
            }
            let file = files.memory();
            (
                Source::Checkpoint(ByteRange {
                    file,
                    offset: *address,
                    len,
                }),
                held,
            )
        }
        LiveSource::File {
            path,
            offset,
            dtype,
            first,
        } => {
            let stored = dtype_of(dtype)?;
            let meta = crate::formats::input::check_regular(path)?;
            let len = bytes_as(stored)?;
            let start = first
                .checked_mul(stored.size())
                .and_then(|skip| skip.checked_add(*offset))
                .filter(|start| start.checked_add(len).is_some_and(|end| end <= meta.len()))
                .ok_or_else(|| {
                    LoadError::Format(FormatError::tensor(
                        path,
                        live.name.clone(),
                        format!(
                            "needs {len} bytes from byte {offset} (element {first} on), but the file holds {} bytes",
                            meta.len()
                        ),
                    ))
                })?;
            let file = files.id(path, meta.len(), meta.modified().ok(), InputKind::File);
            // A value an offload loader reads from a file: reported as offloaded.
            (
                Source::Offload(ByteRange {
                    file,
                    offset: start,
                    len,
                }),
                stored,
            )
        }
        LiveSource::Safetensors {
            path,
            tensor,
            first,
        } => {
            let header = files.headers.get(path)?;
            let entry = header
                .tensors
                .iter()
                .find(|t| *t.name == **tensor)
                .ok_or_else(|| {
                    LoadError::Format(FormatError::tensor(
                        path,
                        tensor.clone(),
                        format!(
                            "is not in the file (the model reads `{}` from it)",
                            live.name
                        ),
                    ))
                })?;
            let stored = entry.dtype;
            let len = bytes_as(stored)?;
            let skip = first
                .checked_mul(stored.size())
                .filter(|skip| skip.checked_add(len).is_some_and(|end| end <= entry.len))
                .ok_or_else(|| {
                    LoadError::Format(FormatError::tensor(
                        path,
                        tensor.clone(),
                        format!(
                            "holds {} bytes, but `{}` needs {len} of them from element {first} on",
                            entry.len, live.name
                        ),
                    ))
                })?;
            // `entry.offset` counts from the start of the file.
            let offset = entry.offset + skip;
            let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
            let file = files.id(path, header.file_len, modified, InputKind::File);
            // A value an offload loader reads from a file: reported as offloaded.
            (Source::Offload(ByteRange { file, offset, len }), stored)
        }
        LiveSource::Staged { key, first } => {
            let len = bytes_as(held)?;
            let skip = first
                .checked_mul(held.size())
                .ok_or_else(|| bad(format!("starts at element {first}, past any tensor")))?;
            let file = files.id(
                Path::new(&format!("{STAGED_PREFIX}{key}")),
                0,
                None,
                InputKind::Staged(*key),
            );
            (
                Source::Checkpoint(ByteRange {
                    file,
                    offset: skip,
                    len,
                }),
                held,
            )
        }
        LiveSource::Pieces { pieces: held_here } => {
            let blocks = held_here
                .iter()
                .map(|p| piece_of(p, (&live.shape, held), files).map_err(&bad))
                .collect::<Result<Box<[Piece]>, LoadError>>()?;
            if let Err(problem) = crate::types::pieces::held_apart(&live.shape, &blocks) {
                return Err(bad(format!("has blocks held here where {problem}")));
            }
            pieces.push(blocks);
            (Source::Pieces(pieces.len() as u32 - 1), held)
        }
        LiveSource::Tied { .. } | LiveSource::None => (Source::None, held),
    };
    Ok(Tensor {
        name: live.name.as_str().into(),
        shape,
        source,
        placement,
        map_key: NO_KEY,
        dtype: stored,
        load_dtype: (stored != held).then_some(held),
    })
}

/// A block this rank holds, as a piece of its tensor (of `shape`, held as `dtype`):
/// row-major in this process's memory, or staged.
fn piece_of(
    live: &LivePiece,
    (shape, dtype): (&[u64], DType),
    files: &mut Files,
) -> Result<Piece, String> {
    if live.offsets.len() != shape.len() || live.sizes.len() != shape.len() {
        return Err(format!(
            "has a block at {:?} of {:?}, not of the tensor's {} dimensions",
            live.offsets,
            live.sizes,
            shape.len()
        ));
    }
    let len = live
        .sizes
        .iter()
        .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            format!(
                "has a block of {:?}, more bytes than fit in 64 bits",
                live.sizes
            )
        })?;
    let range = match (live.address, live.key) {
        (Some(address), None) => ByteRange {
            file: files.memory(),
            offset: address,
            len,
        },
        (None, Some(key)) => ByteRange {
            file: files.id(
                Path::new(&format!("{STAGED_PREFIX}{key}")),
                0,
                None,
                InputKind::Staged(key),
            ),
            offset: live.first.checked_mul(dtype.size()).ok_or_else(|| {
                format!("has a block from element {}, past any tensor", live.first)
            })?,
            len,
        },
        _ => {
            return Err(format!(
                "has a block at {:?} with no place (an address or a staged key, one of them)",
                live.offsets
            ));
        }
    };
    Ok(Piece {
        range,
        offsets: live.offsets.clone().into(),
        sizes: live.sizes.clone().into(),
        stride: None,
    })
}
