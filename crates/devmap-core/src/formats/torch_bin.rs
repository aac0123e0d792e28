//! `pytorch_model.bin` and its shards: the zip archives `torch.save` writes for a state
//! dict, read without torch and without running anything (`formats::pickle`). Each
//! tensor becomes a byte range of the archive (its storage member, from its offset),
//! described like a safetensors header so the loader treats both the same. A view that
//! is not contiguous in its storage (a transposed weight, a slice of a wider one) is a
//! strided piece of its storage, gathered through memory when written.

use super::Kind;
use std::path::Path;

use super::FormatError;
use super::pickle::{self, TensorRef, Value};
use super::safetensors::{Header, HeaderTensor};
use super::split::PiecedTensor;
use super::zip;
use crate::types::pieces::Piece;

/// The legacy transformers names: one file, or shards listed by an index.
pub const SINGLE_BIN: &str = "pytorch_model.bin";
pub const BIN_INDEX: &str = "pytorch_model.bin.index.json";

/// The largest `data.pkl` devmap reads (a state dict of millions of tensors is a few
/// hundred MB of pickle; anything larger is not one).
const MAX_PICKLE: u64 = 1 << 30;

/// Reads the state dict saved at `path` as a [`Header`]: its tensors with absolute
/// byte ranges, in the order their bytes appear in the file; and the views stored
/// with strides, as pieces (file index 0: this file).
pub fn read_bin(path: &Path) -> Result<(Header, Vec<PiecedTensor>), FormatError> {
    let archive = StateDictArchive::open(path, pickle::Allow::StateDict)?;
    let mut tensors = Vec::with_capacity(archive.items.len());
    let mut strided = Vec::new();
    for (name, value) in &archive.items {
        let Value::Tensor(t) = value else {
            return Err(FormatError::tensor_as(
                Kind::Unsupported,
                path,
                name,
                "is not a tensor; devmap reads state dicts of tensors",
            ));
        };
        match view(path, name, t, archive.member_of(path, name, t)?)? {
            Stored::Whole(tensor) => tensors.push(tensor),
            Stored::Strided(tensor) => strided.push(tensor),
        }
    }
    tensors.sort_by_key(|t| (t.offset, t.len));
    let header = Header {
        data_start: 0,
        file_len: archive.file_len,
        tensors,
        metadata: None,
    };
    Ok((header, strided))
}

/// A `torch.save` archive holding a state dict (`pytorch_model.bin`, a verl rank
/// file): its length, its members and their prefix, and the dict's items by name.
pub(super) struct StateDictArchive {
    pub file_len: u64,
    members: Vec<zip::Member>,
    prefix: String,
    pub items: Vec<(String, Value)>,
}

impl StateDictArchive {
    /// Reads the archive at `path`, its pickle naming only the globals `allow` allows;
    /// refused unless it holds a dict keyed by strings.
    pub fn open(path: &Path, allow: pickle::Allow) -> Result<StateDictArchive, FormatError> {
        let file = super::input::open_regular(path)?;
        let file_len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
        let members = zip::members(path, &file, file_len)?;
        let (prefix, value) = read_archive(path, &file, &members, allow, &|kind, message| {
            FormatError::invalid_as(kind, path, message)
        })?;
        let Value::Dict(items) = value else {
            return Err(FormatError::invalid_as(
                Kind::NotTheFormat,
                path,
                "holds something other than a state dict (a dict of tensors)",
            ));
        };
        let items = items
            .into_iter()
            .map(|(key, value)| match key {
                Value::Str(name) => Ok((name, value)),
                key => Err(FormatError::invalid(
                    path,
                    format!("a state dict key {key:?} is not a string"),
                )),
            })
            .collect::<Result<_, _>>()?;
        Ok(StateDictArchive {
            file_len,
            members,
            prefix,
            items,
        })
    }

    /// The member holding tensor `name`'s storage (`t`'s), or an error naming it.
    pub fn member_of(
        &self,
        path: &Path,
        name: &str,
        t: &TensorRef,
    ) -> Result<&zip::Member, FormatError> {
        storage_member(&self.members, &self.prefix, &t.storage.key).ok_or_else(|| {
            FormatError::tensor_as(
                Kind::Missing,
                path,
                name,
                format!("its storage data/{} is not in the archive", t.storage.key),
            )
        })
    }
}

/// The value a `torch.save` archive's `data.pkl` holds (its byte order checked, its
/// size bounded), and the prefix its members' names share. `bad` makes each error,
/// naming the archive or the tensor whose chunk it is.
pub(super) fn read_archive(
    path: &Path,
    file: &std::fs::File,
    members: &[zip::Member],
    allow: pickle::Allow,
    bad: &dyn Fn(Kind, String) -> FormatError,
) -> Result<(String, Value), FormatError> {
    let pkl = members
        .iter()
        .find(|m| m.name.ends_with("/data.pkl") || m.name == "data.pkl")
        .ok_or_else(|| {
            bad(
                Kind::NotTheFormat,
                "is a zip archive without data.pkl: not a torch.save file".to_owned(),
            )
        })?;
    let prefix = pkl.name[..pkl.name.len() - "data.pkl".len()].to_owned();
    if let Some(order) = members
        .iter()
        .find(|m| m.name == format!("{prefix}byteorder"))
    {
        let bytes = zip::read_member(path, file, order)?;
        if bytes != b"little" {
            return Err(bad(
                Kind::Unsupported,
                "was saved big-endian; devmap reads little-endian checkpoints".to_owned(),
            ));
        }
    }
    if pkl.len > MAX_PICKLE {
        return Err(bad(
            Kind::TooLarge,
            "its data.pkl is too large to be a state dict".to_owned(),
        ));
    }
    let bytes = zip::read_member(path, file, pkl)?;
    let value =
        pickle::read_as(&bytes, allow).map_err(|e| bad(e.kind(), format!("data.pkl {e}")))?;
    Ok((prefix, value))
}

/// The member holding storage `key` of an archive whose names start with `prefix`.
pub(super) fn storage_member<'m>(
    members: &'m [zip::Member],
    prefix: &str,
    key: &str,
) -> Option<&'m zip::Member> {
    let name = format!("{prefix}data/{key}");
    members.iter().find(|m| m.name == name)
}

/// Where tensor `name`'s bytes are: a contiguous view of its storage member.
pub(super) fn byte_range(
    path: &Path,
    name: &str,
    t: &TensorRef,
    member: &zip::Member,
) -> Result<HeaderTensor, FormatError> {
    match view(path, name, t, member)? {
        Stored::Whole(tensor) => Ok(tensor),
        Stored::Strided(_) => Err(FormatError::tensor(
            path,
            name,
            format!(
                "is a non-contiguous view (size {:?}, stride {:?}) where devmap reads contiguous tensors",
                t.shape, t.stride
            ),
        )),
    }
}

/// A tensor of an archive: a byte range of it, or a strided view of its storage.
pub(super) enum Stored {
    Whole(HeaderTensor),
    /// A view `torch.save` kept with its strides (a transposed weight, a slice of a
    /// wider one): one piece covering the whole tensor, its file index 0.
    Strided(PiecedTensor),
}

/// Where tensor `name`'s bytes are in its storage member: a byte range when the view
/// is contiguous (row-major: each stride the product of the sizes after it), else the
/// storage span the view reads with its strides. A view with no dimension of stride 1
/// (every other element) or of stride 0 (an expanded one) is refused by name.
pub(super) fn view(
    path: &Path,
    name: &str,
    t: &TensorRef,
    member: &zip::Member,
) -> Result<Stored, FormatError> {
    let bad = |m: String| FormatError::tensor(path, name, m);
    if t.shape.len() != t.stride.len() {
        return Err(bad(format!(
            "has size {:?} but stride {:?}",
            t.shape, t.stride
        )));
    }
    let size = t.storage.dtype.size();
    let elements = t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    // The last element the view reads, past its offset.
    let reach = t.shape.iter().zip(&t.stride).try_fold(0u64, |a, (&n, &s)| {
        a.checked_add(n.saturating_sub(1).checked_mul(s)?)
    });
    let (Some(elements), Some(reach)) = (elements, reach) else {
        return Err(bad(format!("size {:?} overflows", t.shape)));
    };
    // Contiguous, row-major: each stride the product of the sizes after it (a size-1
    // dimension may have any stride).
    let mut expected = 1u64;
    let mut contiguous = true;
    for (&n, &s) in t.shape.iter().zip(&t.stride).rev() {
        contiguous &= n == 1 || s == expected;
        expected = expected.saturating_mul(n);
    }
    let span = if contiguous || elements == 0 {
        elements
    } else {
        reach + 1
    };
    let end = t.offset.checked_add(span);
    if end.is_none_or(|e| e > t.storage.elements)
        || t.storage.elements.saturating_mul(size) > member.len
    {
        return Err(bad(format!(
            "needs elements {}..{} of a storage of {} ({} bytes in data/{})",
            t.offset,
            t.offset.saturating_add(span),
            t.storage.elements,
            member.len,
            t.storage.key
        )));
    }
    let offset = member.offset + t.offset * size;
    if contiguous || elements == 0 {
        return Ok(Stored::Whole(HeaderTensor {
            name: name.into(),
            dtype: t.storage.dtype,
            shape: crate::types::shape::Shape::new(&t.shape),
            offset,
            len: elements * size,
        }));
    }
    let moving = |d: usize| t.shape[d] > 1;
    if (0..t.shape.len()).any(|d| moving(d) && t.stride[d] == 0)
        || !(0..t.shape.len()).any(|d| moving(d) && t.stride[d] == 1)
    {
        return Err(FormatError::tensor_as(
            Kind::Unsupported,
            path,
            name,
            format!(
                "is a view (size {:?}, stride {:?}) with no dimension whose elements are next to each other in its storage, or one repeated (stride 0); devmap reads views that have one (a transposed weight, a slice of a wider one)",
                t.shape, t.stride
            ),
        ));
    }
    Ok(Stored::Strided(PiecedTensor {
        name: name.to_owned(),
        dtype: t.storage.dtype,
        shape: crate::types::shape::Shape::new(&t.shape),
        pieces: vec![Piece {
            range: crate::types::range::ByteRange {
                file: 0,
                offset,
                len: span * size,
            },
            offsets: vec![0; t.shape.len()].into(),
            sizes: t.shape.clone().into(),
            stride: Some(t.stride.clone().into()),
        }],
    }))
}
