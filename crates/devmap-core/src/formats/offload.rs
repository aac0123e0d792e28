//! accelerate / transformers offload folders, in their three real forms:
//!
//! 1. accelerate's `index.json` of `name -> {"dtype", "shape"}` with raw little-endian
//!    bytes in `<name>.dat` (bfloat16 written as its int16 view; a 0-dim tensor as one
//!    element);
//! 2. `index.json` entries `{"safetensors_file", "weight_name", "dtype"}` pointing into a
//!    safetensors file (transformers writes absolute paths);
//! 3. transformers 5: one `<name>.safetensors` per tensor and no `index.json` on disk —
//!    or beside an `index.json` of form 1 or 2 (a folder used by both): then both are
//!    read, and a name in both is an error naming both files.

use super::Kind;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::FormatError;
use super::json::OrderedObject;
use super::safetensors::HeaderCache;
use crate::types::{DType, byte_len};

pub const OFFLOAD_INDEX: &str = "index.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadForm {
    Dat,
    IndexedSafetensors,
    PerTensorSafetensors,
}

/// One offloaded tensor and where its bytes are.
#[derive(Debug, Clone, PartialEq)]
pub struct OffloadEntry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub file: PathBuf,
    pub offset: u64,
    pub len: u64,
    pub form: OffloadForm,
    /// For form 2: the dtype the index says the model loads the tensor as, when it
    /// differs from the stored one.
    pub load_dtype: Option<DType>,
    /// The file's length and modification time, when reading the entry looked at
    /// them already (form 1), so the loader need not ask the file system again.
    pub file_stat: Option<(u64, Option<std::time::SystemTime>)>,
}

/// An offload folder as read: its tensors, and which of its entries are symlinks
/// (from the one listing of the folder, which the loader's symlink check reuses: a
/// second listing of 23,000 files was a tenth of `inspect`'s time).
#[derive(Debug, Default)]
pub struct OffloadFolder {
    pub entries: Vec<OffloadEntry>,
    pub links: std::collections::HashSet<std::ffi::OsString>,
}

/// Reads an offload folder. `model_dir` resolves relative `safetensors_file` paths
/// that are not found beside the index.
pub fn read_offload_folder(
    folder: &Path,
    model_dir: &Path,
    headers: &mut HeaderCache,
) -> Result<OffloadFolder, FormatError> {
    let listing = list(folder)?;
    let index_path = folder.join(OFFLOAD_INDEX);
    if std::fs::symlink_metadata(&index_path).is_err() {
        return Ok(OffloadFolder {
            entries: read_per_tensor_files(headers, listing.safetensors, &[])?,
            links: listing.links,
        });
    }
    // transformers 5 writes per-tensor files into a folder accelerate's index may
    // already describe: both are read, and one name in both is an error.
    let mut entries = read_index(folder, &index_path, model_dir, headers)?;
    let indexed: Vec<PathBuf> = entries.iter().map(|e| e.file.clone()).collect();
    let loose = read_per_tensor_files(headers, listing.safetensors, &indexed)?;
    for entry in &loose {
        if let Some(other) = entries.iter().find(|e| e.name == entry.name) {
            return Err(FormatError::tensor(
                &entry.file,
                &entry.name,
                format!(
                    "the offload folder holds this tensor twice: here and through {} ({}); remove one",
                    crate::text::path(&index_path),
                    crate::text::path(&other.file)
                ),
            ));
        }
    }
    entries.extend(loose);
    Ok(OffloadFolder {
        entries,
        links: listing.links,
    })
}

/// What one listing of the folder says: its `.safetensors` files (sorted) and the
/// names of its symlinks (from the entries' types, no system call per file).
struct Listing {
    safetensors: Vec<PathBuf>,
    links: std::collections::HashSet<std::ffi::OsString>,
}

fn list(folder: &Path) -> Result<Listing, FormatError> {
    let mut listing = Listing {
        safetensors: Vec::new(),
        links: std::collections::HashSet::new(),
    };
    for entry in std::fs::read_dir(folder)
        .map_err(|e| FormatError::io(folder, e))?
        .filter_map(Result::ok)
    {
        let name = entry.file_name();
        if entry.file_type().is_ok_and(|t| t.is_symlink()) {
            listing.links.insert(name.clone());
        }
        // The name is looked at before a path is made: most entries are `.dat` files.
        if Path::new(&name)
            .extension()
            .is_some_and(|x| x == "safetensors")
        {
            listing.safetensors.push(entry.path());
        }
    }
    listing.safetensors.sort();
    Ok(listing)
}

/// A tensor name becomes a file name in form 1 and 3, so it must not leave the folder.
fn check_file_name(index: &Path, name: &str) -> Result<(), FormatError> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\\')
        || name.contains('\0');
    if bad {
        return Err(FormatError::tensor_as(
            Kind::Unsafe,
            index,
            name,
            "this name would put its file outside the offload folder (it is empty, `..`, absolute or has a `/`); refusing to read it",
        ));
    }
    Ok(())
}

fn read_index(
    folder: &Path,
    index_path: &Path,
    model_dir: &Path,
    headers: &mut HeaderCache,
) -> Result<Vec<OffloadEntry>, FormatError> {
    let text = super::input::read_json_text(index_path)?;
    parse_index(folder, index_path, &text, model_dir, headers)
}

/// Parses an offload `index.json` given as text (`index_path` names it in errors).
pub fn parse_index(
    folder: &Path,
    index_path: &Path,
    text: &str,
    model_dir: &Path,
    headers: &mut HeaderCache,
) -> Result<Vec<OffloadEntry>, FormatError> {
    let object: OrderedObject<IndexEntry> = serde_json::from_str(text).map_err(|e| {
        FormatError::invalid_as(
            Kind::NotTheFormat,
            index_path,
            format!("an offload index must be a JSON object of tensor name to entry: {e}"),
        )
    })?;
    if let Some(dup) = object.first_duplicate() {
        return Err(FormatError::tensor(
            index_path,
            dup,
            "appears twice in the offload index",
        ));
    }
    let mut entries = Vec::with_capacity(object.0.len());
    let mut dat_files = Vec::new();
    for (name, info) in object.0 {
        let bad = |m: &str| FormatError::tensor(index_path, &name, m);
        if !info.object {
            return Err(bad("entry is not an object"));
        }
        let dtype_field = match &info.dtype {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(
                DType::from_torch_name(s).ok_or_else(|| bad(&format!("unknown dtype `{s}`")))?,
            ),
            Some(_) => return Err(bad("`dtype` is not a string")),
        };
        if let Some(file) = &info.safetensors_file {
            let file = file
                .as_str()
                .ok_or_else(|| bad("`safetensors_file` is not a string"))?;
            let weight_name = match &info.weight_name {
                None | Some(Value::Null) => name.as_str(),
                Some(Value::String(s)) => s.as_str(),
                Some(_) => return Err(bad("`weight_name` is not a string")),
            };
            let path = resolve(folder, model_dir, file);
            let header = headers.get(&path).map_err(|e| {
                FormatError::tensor_as(
                    Kind::Missing,
                    index_path,
                    &name,
                    format!("points at a safetensors file that cannot be used: {e}"),
                )
            })?;
            let t = header
                .tensors
                .iter()
                .find(|t| &*t.name == weight_name)
                .ok_or_else(|| {
                    FormatError::tensor(
                        index_path,
                        &name,
                        format!(
                            "points at tensor `{weight_name}`, which {} does not hold",
                            path.display()
                        ),
                    )
                })?;
            entries.push(OffloadEntry {
                name: name.clone(),
                dtype: t.dtype,
                shape: t.shape.to_vec(),
                file: path,
                offset: t.offset,
                len: t.len,
                form: OffloadForm::IndexedSafetensors,
                load_dtype: dtype_field.filter(|d| *d != t.dtype),
                file_stat: None,
            });
            continue;
        }
        let dtype = dtype_field.ok_or_else(|| bad("has neither `safetensors_file` nor `dtype`"))?;
        let shape = info
            .shape
            .as_ref()
            .and_then(Value::as_array)
            .ok_or_else(|| bad("has neither `safetensors_file` nor a `shape` list"))?
            .iter()
            .map(Value::as_u64)
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| bad("`shape` must hold non-negative integers"))?;
        check_file_name(index_path, &name)?;
        let len = byte_len(dtype, &shape)
            .ok_or_else(|| bad(&format!("shape {shape:?} overflows 64 bits")))?;
        let file = folder.join(format!("{name}.dat"));
        dat_files.push(entries.len());
        entries.push(OffloadEntry {
            name,
            dtype,
            shape,
            file,
            offset: 0,
            len,
            form: OffloadForm::Dat,
            load_dtype: None,
            file_stat: None,
        });
    }
    check_dat_files(folder, index_path, &mut entries, &dat_files)?;
    Ok(entries)
}

/// Checks that each `.dat` file of `entries` (at the indexes `dat_files`) is a regular
/// file of the length its entry says, and keeps its length and time for the loader.
/// The files are looked at on a few threads (`sys::look_in_parallel`); the first
/// problem in index order is the one reported.
fn check_dat_files(
    folder: &Path,
    index_path: &Path,
    entries: &mut [OffloadEntry],
    dat_files: &[usize],
) -> Result<(), FormatError> {
    let opened = crate::sys::Folder::open(folder).ok();
    let stat = |entry: &OffloadEntry| match &opened {
        Some(f) => f.stat(&format!("{}.dat", entry.name)),
        None => std::fs::metadata(&entry.file).map(|m| crate::sys::FileStat {
            is_file: m.is_file(),
            len: m.len(),
            modified: m.modified().ok(),
        }),
    };
    let entries_read: &[OffloadEntry] = entries;
    let stats =
        crate::sys::look_in_parallel(dat_files, |&i| stat(&entries_read[i])).ok_or_else(|| {
            FormatError::invalid(
                index_path,
                "the offload folder's files could not all be looked at",
            )
        })?;
    for (&i, stat) in dat_files.iter().zip(stats) {
        let entry = &mut entries[i];
        let (file, name, len) = (&entry.file, &entry.name, entry.len);
        match stat {
            Ok(meta) if !meta.is_file => {
                return Err(FormatError::tensor_as(
                    Kind::Unsafe,
                    file,
                    name,
                    "is not a regular file (a folder, FIFO or device); the offload folder is damaged",
                ));
            }
            Ok(meta) if meta.len == len => entry.file_stat = Some((len, meta.modified)),
            Ok(meta) => {
                return Err(FormatError::tensor(
                    file,
                    name,
                    format!(
                        "holds {} bytes but the offload index says {} {:?}, which is {len} bytes; the offload folder is damaged or from another model",
                        meta.len,
                        entry.dtype.torch_name(),
                        entry.shape
                    ),
                ));
            }
            // numpy cannot memory-map an empty file, so accelerate never writes one.
            Err(_) if len == 0 => {}
            Err(e) => {
                return Err(FormatError::tensor(
                    file,
                    name,
                    format!(
                        "is listed in {} but cannot be read: {e}",
                        index_path.display()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// One entry of an offload index as written: the fields devmap reads (anything else is
/// skipped unread), or a note that the entry is not an object. Cheaper than a map per
/// entry on an index of tens of thousands.
#[derive(Debug, Default)]
struct IndexEntry {
    object: bool,
    dtype: Option<Value>,
    shape: Option<Value>,
    safetensors_file: Option<Value>,
    weight_name: Option<Value>,
}

impl<'de> serde::Deserialize<'de> for IndexEntry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = IndexEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an offload index entry")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<IndexEntry, A::Error> {
                let mut entry = IndexEntry {
                    object: true,
                    ..IndexEntry::default()
                };
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let field = match key.as_ref() {
                        "dtype" => &mut entry.dtype,
                        "shape" => &mut entry.shape,
                        "safetensors_file" => &mut entry.safetensors_file,
                        "weight_name" => &mut entry.weight_name,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    *field = Some(map.next_value()?);
                }
                Ok(entry)
            }
            // Anything else is not an object: read past it, and say so later by name.
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<IndexEntry, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(IndexEntry::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<IndexEntry, E> {
                Ok(IndexEntry::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<IndexEntry, E> {
                Ok(IndexEntry::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<IndexEntry, E> {
                Ok(IndexEntry::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<IndexEntry, E> {
                Ok(IndexEntry::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<IndexEntry, E> {
                Ok(IndexEntry::default())
            }
            fn visit_unit<E>(self) -> Result<IndexEntry, E> {
                Ok(IndexEntry::default())
            }
        }
        deserializer.deserialize_any(EntryVisitor)
    }
}

fn resolve(folder: &Path, model_dir: &Path, file: &str) -> PathBuf {
    let given = Path::new(file);
    if given.is_absolute() {
        return given.to_path_buf();
    }
    let beside = folder.join(given);
    if beside.exists() {
        return beside;
    }
    let in_model = model_dir.join(given);
    if in_model.exists() { in_model } else { beside }
}

/// Form 3: every `<name>.safetensors` in the folder but the files in `indexed` (those an
/// `index.json` already points into).
fn read_per_tensor_files(
    headers: &mut HeaderCache,
    files: Vec<PathBuf>,
    indexed: &[PathBuf],
) -> Result<Vec<OffloadEntry>, FormatError> {
    if files.is_empty() {
        // The usual case (accelerate's `.dat` folder): nothing to resolve. Resolving
        // every indexed file is a dozen system calls each — seconds on a big folder.
        return Ok(Vec::new());
    }
    // The index may spell a file another way (relative, through a link): compare the
    // files themselves, each resolved once.
    let resolve = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let indexed: std::collections::HashSet<PathBuf> = indexed
        .iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|p| resolve(p))
        .collect();
    let mut entries = Vec::with_capacity(files.len());
    for path in files {
        if !indexed.is_empty() && indexed.contains(&resolve(&path)) {
            continue;
        }
        let Some(name) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else {
            continue;
        };
        let header = headers.get(&path)?;
        let t = header
            .tensors
            .iter()
            .find(|t| *t.name == *name)
            .or_else(|| (header.tensors.len() == 1).then(|| &header.tensors[0]))
            .ok_or_else(|| {
                FormatError::tensor_as(
                    Kind::Missing,
                    &path,
                    &name,
                    "an offload file must hold the tensor it is named after",
                )
            })?;
        entries.push(OffloadEntry {
            name,
            dtype: t.dtype,
            shape: t.shape.to_vec(),
            file: path.clone(),
            offset: t.offset,
            len: t.len,
            form: OffloadForm::PerTensorSafetensors,
            load_dtype: None,
            file_stat: None,
        });
    }
    Ok(entries)
}
