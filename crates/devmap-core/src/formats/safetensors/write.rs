//! Writing a safetensors header: the length prefix, the JSON (`__metadata__` first,
//! tensors in the order given) and the space padding to a multiple of 8.

use std::collections::BTreeMap;

use crate::types::DType;

/// One tensor to be written into a header. Offsets are relative to the data region.
#[derive(Debug, Clone)]
pub struct HeaderEntry<'a> {
    pub name: std::borrow::Cow<'a, str>,
    pub dtype: DType,
    pub shape: std::borrow::Cow<'a, [u64]>,
    pub begin: u64,
    pub end: u64,
}

/// Encodes a header (length prefix, JSON, space padding to a multiple of 8) with
/// `__metadata__` first and tensors in the order given.
pub fn encode_header<'a>(
    entries: impl Iterator<Item = HeaderEntry<'a>> + Clone,
    metadata: &BTreeMap<String, String>,
) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = write_header(&mut out, entries, metadata);
    out
}

/// Writes a header to `out` and returns its length. Entries stream in twice (once to
/// measure the JSON for the length prefix, once to write it): nothing but `out`'s own
/// buffer is held, so a shard of a million tensors costs no header-sized memory.
pub fn write_header<'a>(
    out: &mut impl std::io::Write,
    entries: impl Iterator<Item = HeaderEntry<'a>> + Clone,
    metadata: &BTreeMap<String, String>,
) -> std::io::Result<u64> {
    let mut counter = Counter(0);
    write_header_json(&mut counter, entries.clone(), metadata)?;
    let padded = counter.0.div_ceil(8) * 8;
    out.write_all(&padded.to_le_bytes())?;
    write_header_json(out, entries, metadata)?;
    // Lossless: the padding is under 8 bytes.
    out.write_all(&b"        "[..(padded - counter.0) as usize])?;
    Ok(8 + padded)
}

/// The length of the header [`write_header`] would write, length prefix and padding
/// included: one counting pass (writing it encodes the JSON twice).
pub fn header_len<'a>(
    entries: impl Iterator<Item = HeaderEntry<'a>>,
    metadata: &BTreeMap<String, String>,
) -> u64 {
    let mut counter = Counter(0);
    // A Counter never fails; only a name serde_json cannot encode could, and `&str`
    // always can.
    let _ = write_header_json(&mut counter, entries, metadata);
    8 + counter.0.div_ceil(8) * 8
}

/// Counts bytes written through it.
struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn write_header_json<'a>(
    out: &mut impl std::io::Write,
    entries: impl Iterator<Item = HeaderEntry<'a>>,
    metadata: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    out.write_all(b"{")?;
    let mut first = true;
    if !metadata.is_empty() {
        out.write_all(b"\"__metadata__\":")?;
        serde_json::to_writer(&mut *out, metadata)?;
        first = false;
    }
    for e in entries {
        if !first {
            out.write_all(b",")?;
        }
        first = false;
        // serde_json escapes the name exactly as JSON requires.
        serde_json::to_writer(&mut *out, &*e.name)?;
        write!(
            out,
            ":{{\"dtype\":\"{}\",\"shape\":[",
            e.dtype.safetensors_name()
        )?;
        for (i, d) in e.shape.iter().enumerate() {
            write!(out, "{}{d}", if i == 0 { "" } else { "," })?;
        }
        write!(out, "],\"data_offsets\":[{},{}]}}", e.begin, e.end)?;
    }
    out.write_all(b"}")
}
