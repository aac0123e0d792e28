//! The safetensors container: an 8-byte little-endian header length, a JSON header,
//! then the tensors' bytes. Opening a file reads its first 8 bytes and its header with
//! ordinary reads and nothing else; the parser itself works from a prefix of the file
//! and the file's length, so a header can come from anywhere (a range read, say).

mod write;

pub use write::{HeaderEntry, encode_header, header_len, write_header};

use super::Kind;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use super::FormatError;
use crate::types::shape::Shape;
use crate::types::{DType, byte_len};

/// The largest header the reference implementation accepts.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// One tensor as a header describes it. Offsets are absolute positions in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTensor {
    /// Allocated at its length: it becomes the checkpoint's name as it is (a `String`
    /// copied into another form later would leave a million freed blocks behind).
    pub name: Box<str>,
    pub dtype: DType,
    pub shape: Shape,
    pub offset: u64,
    pub len: u64,
}

/// A parsed and validated header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Where the data region starts (8 + the header length).
    pub data_start: u64,
    pub file_len: u64,
    /// Tensors in the order their bytes appear in the file.
    pub tensors: Vec<HeaderTensor>,
    pub metadata: Option<BTreeMap<String, String>>,
}

/// Reads and validates the header of the safetensors file at `path`.
pub fn read_header(path: &Path) -> Result<Header, FormatError> {
    read_header_as(path, false)
}

/// The header of a file cut short after its header (a download that stopped): checked
/// as a whole file of the length its header declares. Its tensors past the real end
/// (`Header::file_len`) have no bytes; the caller tells them apart.
pub fn read_header_of_cut_file(path: &Path) -> Result<Header, FormatError> {
    read_header_as(path, true)
}

fn read_header_as(path: &Path, cut: bool) -> Result<Header, FormatError> {
    let file = super::input::open_regular(path)?;
    let file_len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    if file_len < 8 {
        return Err(FormatError::invalid_as(
            Kind::Truncated,
            path,
            format!(
                "{file_len} bytes is too short for a safetensors file (the header length alone is 8 bytes); the file is truncated or not safetensors"
            ),
        ));
    }
    let mut len_bytes = [0u8; 8];
    read_exact_at(&file, &mut len_bytes, 0).map_err(|e| FormatError::io(path, e))?;
    let header_len = u64::from_le_bytes(len_bytes);
    check_header_len(path, header_len, file_len)?;
    // Parsed as it is read, never held whole: at a million tensors the text is 88 MB,
    // as much again as the entries parsed from it.
    let text = std::io::Read::take(PositionedReader { file: &file, at: 8 }, header_len);
    let raw = parse_entries(path, text, 8 + header_len)?;
    if cut {
        let declared = raw
            .tensors
            .iter()
            .map(|t| t.offset.saturating_add(t.len))
            .max()
            .unwrap_or(8 + header_len);
        let mut header = finish(path, raw, 8 + header_len, declared.max(file_len))?;
        header.file_len = file_len;
        return Ok(header);
    }
    finish(path, raw, 8 + header_len, file_len)
}

fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(buf, offset)
}

/// Reads a file from a position with positioned reads (the file's own cursor is
/// left alone).
struct PositionedReader<'f> {
    file: &'f File,
    at: u64,
}

impl std::io::Read for PositionedReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// Passes bytes through, failing at the first that are not UTF-8: serde_json checks
/// the strings, not the bytes between them, and a header must be UTF-8 whole. A
/// character cut by a read's end is held over (`carry`) and checked with the next.
struct Utf8Checked<R> {
    inner: R,
    carry: Vec<u8>,
    /// Bytes passed so far, for the message.
    offset: u64,
    /// Where the first bad byte was: kept outside, since the error serde_json is
    /// given may come back wrapped in an entry's message.
    bad_at: std::rc::Rc<std::cell::Cell<Option<u64>>>,
}

impl<R: std::io::Read> std::io::Read for Utf8Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let bad = |at: u64| {
            self.bad_at.set(Some(at));
            std::io::Error::new(std::io::ErrorKind::InvalidData, "the header is not UTF-8")
        };
        if n == 0 {
            if self.carry.is_empty() || buf.is_empty() {
                return Ok(0);
            }
            return Err(bad(self.offset - self.carry.len() as u64));
        }
        let mut checked = std::mem::take(&mut self.carry);
        checked.extend_from_slice(&buf[..n]);
        // Where `checked` starts in the header: the carried bytes came before.
        let start = (self.offset + n as u64).saturating_sub(checked.len() as u64);
        match std::str::from_utf8(&checked) {
            Ok(_) => {}
            Err(e) if e.error_len().is_none() => {
                self.carry = checked[e.valid_up_to()..].to_vec();
            }
            Err(e) => return Err(bad(start + e.valid_up_to() as u64)),
        }
        self.offset += n as u64;
        Ok(n)
    }
}

/// The declared header length must fit the 100 MB limit and the file.
fn check_header_len(path: &Path, header_len: u64, file_len: u64) -> Result<(), FormatError> {
    if header_len > MAX_HEADER_LEN {
        return Err(FormatError::invalid_as(
            Kind::TooLarge,
            path,
            format!(
                "header length {header_len} is over the 100 MB limit; the file is corrupt or not safetensors"
            ),
        ));
    }
    if 8 + header_len > file_len {
        return Err(FormatError::invalid_as(
            Kind::Truncated,
            path,
            format!(
                "header length {header_len} runs past the end of the {file_len}-byte file; the file is truncated"
            ),
        ));
    }
    Ok(())
}

/// Headers already read, by path, so files named many times (offload indexes point
/// into the same checkpoint shard once per tensor) are parsed once.
#[derive(Debug, Default)]
pub struct HeaderCache {
    headers: std::collections::HashMap<std::path::PathBuf, std::sync::Arc<Header>>,
}

impl HeaderCache {
    pub fn get(&mut self, path: &Path) -> Result<std::sync::Arc<Header>, FormatError> {
        if let Some(h) = self.headers.get(path) {
            return Ok(h.clone());
        }
        let header = std::sync::Arc::new(read_header(path)?);
        self.headers.insert(path.to_path_buf(), header.clone());
        Ok(header)
    }
}

/// Parses a header from a prefix of a `file_len`-byte file. `prefix` must hold at
/// least the 8-byte length and the header (the whole file will do); tensor data in it
/// is not read.
pub fn parse_header(path: &Path, prefix: &[u8], file_len: u64) -> Result<Header, FormatError> {
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(prefix.get(..8).ok_or_else(|| {
        FormatError::invalid_as(
            Kind::Truncated,
            path,
            "shorter than the 8-byte header length",
        )
    })?);
    let header_len = u64::from_le_bytes(len_bytes);
    check_header_len(path, header_len, file_len)?;
    let data_start = 8 + header_len;
    let header_bytes = usize::try_from(data_start)
        .ok()
        .and_then(|end| prefix.get(8..end))
        .ok_or_else(|| {
            FormatError::invalid_as(Kind::Truncated,
                path,
                format!(
                    "only {} bytes of the {data_start}-byte header were given; the header is cut short",
                    prefix.len()
                ),
            )
        })?;
    let raw = parse_entries(path, header_bytes, data_start)?;
    finish(path, raw, data_start, file_len)
}

/// The entries of the header `text` (a reader of the header's bytes), each checked as
/// it is read; the data region starts at `data_start`.
fn parse_entries(
    path: &Path,
    text: impl std::io::Read,
    data_start: u64,
) -> Result<RawHeader, FormatError> {
    // Each entry is checked as it is read and kept only as a HeaderTensor: no second
    // list of raw entries, which for a million tensors would double the cost.
    let seed = HeaderSeed {
        path,
        data_start,
        entry_error: std::cell::RefCell::new(None),
    };
    // serde_json reads a byte at a time: the buffer goes outside the check.
    let bad_at = std::rc::Rc::default();
    let text = std::io::BufReader::with_capacity(
        1 << 16,
        Utf8Checked {
            inner: text,
            carry: Vec::new(),
            offset: 0,
            bad_at: std::rc::Rc::clone(&bad_at),
        },
    );
    let mut de = serde_json::Deserializer::from_reader(text);
    let parsed = serde::de::DeserializeSeed::deserialize(&seed, &mut de).and_then(|h| {
        de.end()?;
        Ok(h)
    });
    parsed.map_err(|e| {
        if let Some(at) = bad_at.get() {
            return FormatError::invalid_as(
                Kind::NotTheFormat,
                path,
                format!("header is not UTF-8 (invalid byte at {at} of the header)"),
            );
        }
        if e.is_io() {
            // serde_json gives back the reader's own error.
            return FormatError::io(path, std::io::Error::from(e));
        }
        seed.entry_error.into_inner().unwrap_or_else(|| {
            FormatError::invalid_as(
                Kind::NotTheFormat,
                path,
                format!("header is not a JSON object of tensors: {e}"),
            )
        })
    })
}

/// A parsed header checked whole: no name twice, and the data region covered exactly.
fn finish(
    path: &Path,
    raw: RawHeader,
    data_start: u64,
    file_len: u64,
) -> Result<Header, FormatError> {
    if let Some(dup) = first_duplicate(&raw.tensors) {
        return Err(FormatError::tensor(
            path,
            dup,
            "appears twice in the header",
        ));
    }
    let metadata = raw.metadata;
    let mut tensors = raw.tensors;
    validate_layout(path, &mut tensors, data_start, file_len)?;
    Ok(Header {
        data_start,
        file_len,
        tensors,
        metadata,
    })
}

/// A header as written: tensor entries in file order (duplicates kept, so they can be
/// refused by name) and the optional `__metadata__`. Entries are typed, so parsing a
/// 100,000-tensor header allocates little beyond the names.
struct RawHeader {
    tensors: Vec<HeaderTensor>,
    metadata: Option<BTreeMap<String, String>>,
}

/// Reads a header with what checking its entries needs: the file (for messages) and
/// where the data starts. The first entry that fails its check is kept here, so the
/// caller reports it rather than a JSON error.
struct HeaderSeed<'p> {
    path: &'p Path,
    data_start: u64,
    entry_error: std::cell::RefCell<Option<FormatError>>,
}

#[derive(serde::Deserialize)]
struct RawEntry {
    dtype: DTypeName,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// A header key read straight into the shared name the checkpoint keeps: one
/// allocation per tensor, not a `String` and then a copy.
struct TensorName(Box<str>);

impl<'de> serde::Deserialize<'de> for TensorName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl serde::de::Visitor<'_> for NameVisitor {
            type Value = TensorName;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a tensor name")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TensorName, E> {
                Ok(TensorName(v.into()))
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

/// A dtype name read without allocating when it is one devmap knows.
enum DTypeName {
    Known(DType),
    Unknown(String),
}

impl<'de> serde::Deserialize<'de> for DTypeName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl serde::de::Visitor<'_> for NameVisitor {
            type Value = DTypeName;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a dtype name such as \"BF16\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DTypeName, E> {
                Ok(DType::from_safetensors_name(v)
                    .map_or_else(|| DTypeName::Unknown(v.to_owned()), DTypeName::Known))
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for &HeaderSeed<'_> {
    type Value = RawHeader;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<RawHeader, D::Error> {
        struct HeaderVisitor<'s, 'p>(&'s HeaderSeed<'p>);
        impl<'de> serde::de::Visitor<'de> for HeaderVisitor<'_, '_> {
            type Value = RawHeader;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object of tensor entries")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RawHeader, A::Error> {
                use serde::de::Error;
                let seed = self.0;
                // Grown by doubling: past the allocator's mmap threshold a grown list
                // is remapped, not copied, and pages not yet written are not resident.
                let mut tensors = Vec::new();
                let mut metadata = None;
                while let Some(TensorName(key)) = map.next_key::<TensorName>()? {
                    if &*key == "__metadata__" {
                        let m = map.next_value::<BTreeMap<String, String>>().map_err(|e| {
                            A::Error::custom(format!(
                                "`__metadata__` must be an object of strings ({e})"
                            ))
                        })?;
                        // The reference parser refuses a second `__metadata__`; a
                        // later one silently winning would hide what the file says.
                        if metadata.replace(m).is_some() {
                            return Err(A::Error::custom("`__metadata__` appears twice"));
                        }
                        continue;
                    }
                    let entry = map.next_value::<RawEntry>().map_err(|e| {
                        A::Error::custom(format!(
                            "tensor `{key}`: {e}; an entry is {{\"dtype\": name, \"shape\": [non-negative integers], \"data_offsets\": [begin, end]}}"
                        ))
                    })?;
                    match check_entry(seed.path, key, entry, seed.data_start) {
                        Ok(t) => tensors.push(t),
                        Err(e) => {
                            *seed.entry_error.borrow_mut() = Some(e);
                            return Err(A::Error::custom("an entry failed its check"));
                        }
                    }
                }
                Ok(RawHeader { tensors, metadata })
            }
        }
        deserializer.deserialize_map(HeaderVisitor(self))
    }
}

fn first_duplicate(tensors: &[HeaderTensor]) -> Option<&str> {
    let mut names: Vec<&str> = tensors.iter().map(|t| &*t.name).collect();
    names.sort_unstable();
    names.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

fn check_entry(
    path: &Path,
    name: Box<str>,
    entry: RawEntry,
    data_start: u64,
) -> Result<HeaderTensor, FormatError> {
    let bad = |message: String| FormatError::tensor(path, &*name, message);
    let dtype = match entry.dtype {
        DTypeName::Known(d) => d,
        DTypeName::Unknown(name) => return Err(bad(format!("unknown dtype `{name}`"))),
    };
    let shape = entry.shape;
    let (begin, end) = entry.data_offsets;
    if end < begin {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] end before they begin"
        )));
    }
    let expected = byte_len(dtype, &shape).ok_or_else(|| {
        bad(format!(
            "shape {shape:?} overflows: its element count does not fit in 64 bits"
        ))
    })?;
    if end - begin != expected {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] hold {} bytes but {dtype} {shape:?} needs {expected}",
            end - begin
        )));
    }
    let offset = data_start
        .checked_add(begin)
        .ok_or_else(|| bad("data offset overflows".into()))?;
    Ok(HeaderTensor {
        name,
        dtype,
        // Inline for every real shape: no heap block per tensor.
        shape: Shape::new(&shape),
        offset,
        len: expected,
    })
}

/// The data region must be covered exactly: offsets contiguous from 0, no overlap, no
/// hole, no trailing bytes. Sorts `tensors` into file order.
fn validate_layout(
    path: &Path,
    tensors: &mut [HeaderTensor],
    data_start: u64,
    file_len: u64,
) -> Result<(), FormatError> {
    // In place: a stable sort would borrow half the list again.
    tensors.sort_unstable_by_key(|t| (t.offset, t.len));
    let mut cursor = data_start;
    for t in tensors.iter() {
        let rel = t.offset - data_start;
        if t.offset < cursor {
            return Err(FormatError::tensor(
                path,
                &*t.name,
                format!(
                    "bytes from {rel} overlap the previous tensor, which ends at {}",
                    cursor - data_start
                ),
            ));
        }
        if t.offset > cursor {
            return Err(FormatError::tensor(
                path,
                &*t.name,
                format!(
                    "starts at {rel}, leaving a hole after byte {}",
                    cursor - data_start
                ),
            ));
        }
        cursor = t.offset + t.len;
        if cursor > file_len {
            return Err(FormatError::tensor(
                path,
                &*t.name,
                format!(
                    "ends at byte {} of the data, past the end of the file ({} data bytes); the file is truncated",
                    cursor - data_start,
                    file_len - data_start
                ),
            ));
        }
    }
    if cursor != file_len {
        return Err(FormatError::invalid(
            path,
            format!(
                "{} bytes after the last tensor are not described by the header",
                file_len - cursor
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
