//! The members of a zip archive as byte ranges of the file: just enough of the format
//! for `torch.save`'s archives, which store every member uncompressed. The central
//! directory (zip64 included) is read from the end of the file; each member's data
//! starts after its local header. A compressed member, or one whose bytes lie outside
//! the file, is an error naming the archive and the member.

use super::Kind;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::FormatError;

/// One stored member: its name and where its bytes are in the archive file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub offset: u64,
    pub len: u64,
    /// The member's bytes, when they were read with the directory (a small member at
    /// either end of the archive).
    pub bytes: Option<Box<[u8]>>,
}

const END: u32 = 0x0605_4b50;
const END64: u32 = 0x0606_4b50;
const END64_LOCATOR: u32 = 0x0706_4b50;
const ENTRY: u32 = 0x0201_4b50;
const LOCAL: u32 = 0x0403_4b50;
/// The end record is 22 bytes plus a comment of at most 65,535.
const TAIL: u64 = 22 + 65_535;
/// Central directories larger than this are refused (a million members is ~100 MB).
const MAX_DIRECTORY: u64 = 256 << 20;

fn u16_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from(u16::from_le_bytes(
        b.get(at..at + 2)?.try_into().ok()?,
    )))
}

fn u32_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from(u32::from_le_bytes(
        b.get(at..at + 4)?.try_into().ok()?,
    )))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn read_at(file: &File, path: &Path, offset: u64, len: u64) -> Result<Vec<u8>, FormatError> {
    let mut bytes = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
    file.read_exact_at(&mut bytes, offset)
        .map_err(|e| FormatError::io(path, e))?;
    Ok(bytes)
}

/// The bytes of `member` of the archive at `path` (`file` open on it).
pub fn read_member(path: &Path, file: &File, member: &Member) -> Result<Vec<u8>, FormatError> {
    match &member.bytes {
        Some(bytes) => Ok(bytes.to_vec()),
        None => read_at(file, path, member.offset, member.len),
    }
}

/// Bytes read from each end of an archive before anything else: a `torch.save`
/// archive's end record, central directory, local headers and small members
/// (`data.pkl`, `byteorder`) lie there, so listing one of the thousands of chunk
/// archives a distributed checkpoint holds takes two reads, not one per header.
struct Ends {
    head: Vec<u8>,
    /// Where `tail` starts in the archive.
    tail_start: u64,
    tail: Vec<u8>,
}

/// The bytes [`Ends`] reads at each end.
const END_BYTES: u64 = 4096;

impl Ends {
    fn read(file: &File, path: &Path, base: u64, len: u64) -> Result<Ends, FormatError> {
        let head = read_at(file, path, base, len.min(END_BYTES))?;
        let tail_start = len.saturating_sub(END_BYTES);
        let tail = if tail_start == 0 {
            head.clone()
        } else {
            read_at(file, path, base + tail_start, len - tail_start)?
        };
        Ok(Ends {
            head,
            tail_start,
            tail,
        })
    }

    /// Bytes `offset..offset + len` of the archive, when they lie in one of its ends.
    fn get(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end <= self.head.len() as u64 {
            return self.head.get(offset as usize..end as usize);
        }
        let from = offset.checked_sub(self.tail_start)?;
        self.tail.get(from as usize..(from + len) as usize)
    }
}

/// The stored members of the zip archive at `path` (`file` open on it, `file_len`
/// bytes long), in the central directory's order.
pub fn members(path: &Path, file: &File, file_len: u64) -> Result<Vec<Member>, FormatError> {
    members_in(path, file, 0, file_len)
}

/// [`members`] of an archive that is bytes `base..base + file_len` of `file` (each
/// chunk of a torch.distributed.checkpoint `.distcp` file is a `torch.save` archive):
/// offsets inside the archive are relative to `base`, the members' are absolute.
pub fn members_in(
    path: &Path,
    file: &File,
    base: u64,
    file_len: u64,
) -> Result<Vec<Member>, FormatError> {
    let bad = |m: String| FormatError::invalid(path, m);
    let ends = Ends::read(file, path, base, file_len)?;
    // Bytes of the archive: from its ends when they lie there.
    let read = |offset: u64, len: u64| match ends.get(offset, len) {
        Some(bytes) => Ok(bytes.to_vec()),
        None => read_at(file, path, base + offset, len),
    };
    let find_end = |tail: &[u8]| {
        (0..tail.len().saturating_sub(21))
            .rev()
            .find(|&i| u32_at(tail, i) == Some(u64::from(END)))
    };
    // The end record is in the last few KiB unless a long comment follows it.
    let (tail, end) = if let Some(end) = find_end(&ends.tail) {
        (std::borrow::Cow::Borrowed(&ends.tail[..]), end)
    } else {
        let tail_start = file_len.saturating_sub(TAIL);
        let tail = read(tail_start, file_len - tail_start)?;
        let end = find_end(&tail)
            .ok_or_else(|| bad("is not a zip archive (no end of central directory)".into()))?;
        (std::borrow::Cow::Owned(tail), end)
    };
    let field = |at: usize| u32_at(&tail, end + at);
    let (mut count, mut size, mut start) = (
        u16_at(&tail, end + 10).unwrap_or(0),
        field(12).unwrap_or(0),
        field(16).unwrap_or(0),
    );
    if count == 0xFFFF || size == 0xFFFF_FFFF || start == 0xFFFF_FFFF {
        // zip64: the locator just before the end record says where its record is.
        let locator = end
            .checked_sub(20)
            .filter(|&l| u32_at(&tail, l) == Some(u64::from(END64_LOCATOR)))
            .ok_or_else(|| bad("has a zip64 end record without its locator".into()))?;
        let record_at = u64_at(&tail, locator + 8).unwrap_or(u64::MAX);
        if record_at.checked_add(56).is_none_or(|e| e > file_len) {
            return Err(bad("its zip64 end record lies outside the file".into()));
        }
        let record = read(record_at, 56)?;
        if u32_at(&record, 0) != Some(u64::from(END64)) {
            return Err(bad(
                "its zip64 end record is not where the locator says".into()
            ));
        }
        count = u64_at(&record, 32).unwrap_or(0);
        size = u64_at(&record, 40).unwrap_or(0);
        start = u64_at(&record, 48).unwrap_or(0);
    }
    if size > MAX_DIRECTORY || start.checked_add(size).is_none_or(|e| e > file_len) {
        return Err(bad(format!(
            "its central directory ({size} bytes at {start}) does not fit the file"
        )));
    }
    let directory = read(start, size)?;
    let mut members = Vec::with_capacity(usize::try_from(count.min(1 << 20)).unwrap_or(0));
    let mut at = 0usize;
    for _ in 0..count {
        let entry = |o: usize| at + o;
        if u32_at(&directory, at) != Some(u64::from(ENTRY)) {
            return Err(bad("its central directory is damaged".into()));
        }
        let truncated = || bad("its central directory is cut short".into());
        let method = u16_at(&directory, entry(10)).ok_or_else(truncated)?;
        let mut compressed = u32_at(&directory, entry(20)).ok_or_else(truncated)?;
        let mut stored = u32_at(&directory, entry(24)).ok_or_else(truncated)?;
        let name_len = u16_at(&directory, entry(28)).ok_or_else(truncated)? as usize;
        let extra_len = u16_at(&directory, entry(30)).ok_or_else(truncated)? as usize;
        let comment_len = u16_at(&directory, entry(32)).ok_or_else(truncated)? as usize;
        let mut local = u32_at(&directory, entry(42)).ok_or_else(truncated)?;
        let name_bytes = directory
            .get(entry(46)..entry(46) + name_len)
            .ok_or_else(truncated)?;
        let name = String::from_utf8_lossy(name_bytes).into_owned();
        let extra = directory
            .get(entry(46) + name_len..entry(46) + name_len + extra_len)
            .ok_or_else(truncated)?;
        // zip64 sizes and offset, in that order, for the fields that overflowed.
        let mut e = 0;
        while e + 4 <= extra.len() {
            let (id, len) = (
                u16_at(extra, e).unwrap_or(0),
                u16_at(extra, e + 2).unwrap_or(0),
            );
            if id == 1 {
                let mut f = e + 4;
                for value in [&mut stored, &mut compressed, &mut local] {
                    if *value == 0xFFFF_FFFF {
                        *value = u64_at(extra, f).ok_or_else(truncated)?;
                        f += 8;
                    }
                }
            }
            e += 4 + len as usize;
        }
        at = entry(46) + name_len + extra_len + comment_len;
        if method != 0 || compressed != stored {
            return Err(FormatError::tensor_as(
                Kind::Unsupported,
                path,
                &name,
                "is a compressed zip member; devmap reads the uncompressed archives torch.save writes",
            ));
        }
        if local.checked_add(30).is_none_or(|e| e > file_len) {
            return Err(FormatError::tensor_as(
                Kind::Truncated,
                path,
                &name,
                "its local header lies outside the file",
            ));
        }
        let header = read(local, 30)?;
        if u32_at(&header, 0) != Some(u64::from(LOCAL)) {
            return Err(FormatError::tensor(
                path,
                &name,
                "its local header is damaged",
            ));
        }
        let skip = 30 + u16_at(&header, 26).unwrap_or(0) + u16_at(&header, 28).unwrap_or(0);
        let offset = local + skip;
        if offset.checked_add(stored).is_none_or(|e| e > file_len) {
            return Err(FormatError::tensor(
                path,
                &name,
                format!("its {stored} bytes at {offset} lie outside the file ({file_len} bytes)"),
            ));
        }
        let bytes = ends.get(offset, stored).map(Box::from);
        members.push(Member {
            name,
            offset: base + offset,
            len: stored,
            bytes,
        });
    }
    Ok(members)
}
