//! `pytorch_model.bin` and its shards: the zip archives `torch.save` writes for a state
//! dict, read without torch and without running anything (`formats::pickle`). Each
//! tensor becomes a byte range of the archive (its storage member, from its offset),
//! described like a safetensors header so the loader treats both the same. Views that
//! are not contiguous in their storage are refused by name.

use super::Kind;
use std::path::Path;

use super::FormatError;
use super::pickle::{self, TensorRef, Value};
use super::safetensors::{Header, HeaderTensor};
use super::zip;

/// The legacy transformers names: one file, or shards listed by an index.
pub const SINGLE_BIN: &str = "pytorch_model.bin";
pub const BIN_INDEX: &str = "pytorch_model.bin.index.json";

/// The largest `data.pkl` devmap reads (a state dict of millions of tensors is a few
/// hundred MB of pickle; anything larger is not one).
const MAX_PICKLE: u64 = 1 << 30;

/// Reads the state dict saved at `path` as a [`Header`]: its tensors with absolute
/// byte ranges, in the order their bytes appear in the file.
pub fn read_bin(path: &Path) -> Result<Header, FormatError> {
    let file = super::input::open_regular(path)?;
    let file_len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    let members = zip::members(path, &file, file_len)?;
    let (prefix, value) = read_archive(
        path,
        &file,
        &members,
        pickle::Allow::StateDict,
        &|kind, message| FormatError::invalid_as(kind, path, message),
    )?;
    let Value::Dict(items) = value else {
        return Err(FormatError::invalid_as(
            Kind::NotTheFormat,
            path,
            "holds something other than a state dict (a dict of tensors)",
        ));
    };
    let mut tensors = Vec::with_capacity(items.len());
    for (key, value) in items {
        let Value::Str(name) = key else {
            return Err(FormatError::invalid(
                path,
                format!("a state dict key {key:?} is not a string"),
            ));
        };
        let Value::Tensor(t) = value else {
            return Err(FormatError::tensor_as(
                Kind::Unsupported,
                path,
                &name,
                "is not a tensor; devmap reads state dicts of tensors",
            ));
        };
        let member = storage_member(&members, &prefix, &t.storage.key).ok_or_else(|| {
            FormatError::tensor_as(
                Kind::Missing,
                path,
                &name,
                format!("its storage data/{} is not in the archive", t.storage.key),
            )
        })?;
        tensors.push(byte_range(path, &name, &t, member)?);
    }
    tensors.sort_by_key(|t| (t.offset, t.len));
    Ok(Header {
        data_start: 0,
        file_len,
        tensors,
        metadata: None,
    })
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
    let bad = |m: String| FormatError::tensor(path, name, m);
    if t.shape.len() != t.stride.len() {
        return Err(bad(format!(
            "has size {:?} but stride {:?}",
            t.shape, t.stride
        )));
    }
    // Contiguous, row-major: each stride the product of the sizes after it (a size-1
    // dimension may have any stride).
    let mut expected = 1u64;
    for (&size, &stride) in t.shape.iter().zip(&t.stride).rev() {
        if size != 1 && stride != expected {
            return Err(bad(format!(
                "is a non-contiguous view (size {:?}, stride {:?}); devmap reads contiguous tensors of a .bin",
                t.shape, t.stride
            )));
        }
        expected = expected.saturating_mul(size);
    }
    let size = t.storage.dtype.size();
    let elements = t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    let (Some(elements), Some(end)) = (elements, elements.and_then(|e| t.offset.checked_add(e)))
    else {
        return Err(bad(format!("size {:?} overflows", t.shape)));
    };
    if end > t.storage.elements || t.storage.elements.saturating_mul(size) > member.len {
        return Err(bad(format!(
            "needs elements {}..{end} of a storage of {} ({} bytes in data/{})",
            t.offset, t.storage.elements, member.len, t.storage.key
        )));
    }
    Ok(HeaderTensor {
        name: name.to_owned(),
        dtype: t.storage.dtype,
        shape: crate::types::shape::Shape::new(&t.shape),
        offset: member.offset + t.offset * size,
        len: elements * size,
    })
}
