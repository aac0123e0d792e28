//! GPTQ (`quant_method: gptq`, GPTQModel / AutoGPTQ) and AWQ (`quant_method: awq`,
//! AutoAWQ's GEMM packing) integer weights dequantized while streaming. Both store a
//! linear layer's weight transposed, `[in, out]`, as I32 words:
//!
//! - GPTQ: `M.qweight` `[in·bits/32, out]`, values packed down the input rows (value
//!   `i` of column `o` at bit `(i mod p)·bits` of word `[i / p, o]`, `p = 32/bits`);
//!   `M.qzeros` `[groups, out·bits/32]`, packed along the columns; `M.scales`
//!   `[groups, out]`; `M.g_idx` `[in]`, each input row's group (`desc_act` reorders
//!   them; without it, `i / group_size`). The `gptq` (v1) format stores every zero
//!   point minus one: GPTQModel reads it by adding `0x11111111` (4 bits; `0x01010101`
//!   for 8, `0x55555555` for 2) to each I32 word, carries between values included,
//!   which is what devmap computes.
//! - AWQ: `M.qweight` `[in, out·bits/32]` and `M.qzeros` `[groups, out·bits/32]`,
//!   packed along the columns in AWQ's order (the word's values are columns
//!   0, 2, 4, 6, 1, 3, 5, 7 of its eight); `M.scales` `[groups, out]`; group `i /
//!   group_size`.
//!
//! `w[o, i] = (q − z) · s` with `z` and `s` of row `i`'s group and column `o`, the
//! multiply in the scale's dtype (one rounding of the exact product, as torch's
//! `int * half` rounds it), converted to the dtype asked, written `[out, in]` as
//! `M.weight`. A band of output rows reads its columns of every packed row: memory is a
//! band, whatever the layer.

mod band;
mod decode;
mod direct;
mod kernels;
mod read;
mod shared;
mod streams;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use band::{Band, Groups};

use super::copy::{CopyError, Stop, invalid_data as invalid, read_exact_at};
use super::hand_off::HandOff;
use crate::types::DType;
use crate::types::range::ByteRange;

/// Output elements per band (before rounding the band to whole words of columns); a
/// small band in unit tests, so small weights cross band and read-band edges.
const BAND_ELEMENTS: u64 = if cfg!(test) { 1 << 10 } else { 1 << 21 };

/// AWQ's and GPTQ's read band: the packed words of this many bytes at most (a read is
/// one packed row's words of the band: the wider the band, the fewer and longer the
/// reads). In unit tests four bytes an element of a band, so a 4-bit read band holds
/// eight sub-bands (fourteen outside tests) and small weights still cross its edges.
const READ_BYTES: u64 = if cfg!(test) { 1 << 12 } else { 14 << 20 };

/// AWQ's sub-bands are at least this many output rows: sixteen words of a packed row,
/// twice the transposition's vector width, and 64-byte runs of each packed row to deal
/// out to the sub-band.
const AWQ_MIN_ROWS: u64 = if cfg!(test) { 8 } else { 128 };

/// AWQ's (in order) and 4-bit GPTQ's output is made and written this many bytes at a
/// time at most (a few output rows; GPTQ's a multiple of 16), so the write copies from
/// the cache what was just made.
const OUTPUT_BYTES: u64 = if cfg!(test) { 1 << 9 } else { 512 << 10 };

/// Working memory of one stream at most: a read band's packed words (`READ_BYTES`, or
/// for GPTQ four sub-bands where those are more: at most a byte an output element of
/// the sub-band), the sub-band's values gathered in input order (a byte an element at
/// most), a sub-band's output (at most 4 bytes an element), its table (16 entries a
/// group and column, in f32, rounded and converted: at most 5 bytes an element for
/// groups of 32 or more), and each input row's group.
pub const BAND_BYTES: u64 = READ_BYTES + BAND_ELEMENTS * (2 + 4 + 5) + (4 << 20);

/// How the values are packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// GPTQ; `v1`: zero points stored minus one (`checkpoint_format: gptq`).
    Gptq { v1: bool },
    /// AWQ's GEMM packing.
    Awq,
}

/// A GPTQ or AWQ weight's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransposedIntLayout {
    /// Input features (the written weight's columns) and output features (its rows).
    pub inputs: u64,
    pub outputs: u64,
    /// 2, 4 or 8.
    pub bits: u8,
    /// Rows of scales and zero points.
    pub groups: u64,
    /// Input rows a group holds, when there is no `g_idx`.
    pub group_size: u64,
    pub packing: Packing,
    pub scale_dtype: DType,
}

impl TransposedIntLayout {
    /// Values an I32 word holds.
    pub fn per_word(&self) -> u64 {
        32 / u64::from(self.bits)
    }

    /// The shape written: `[out, in]`.
    pub fn shape(&self) -> [u64; 2] {
        [self.outputs, self.inputs]
    }

    pub fn elements(&self) -> u64 {
        self.inputs * self.outputs
    }

    /// Bytes `M.qweight` holds.
    pub fn qweight_bytes(&self) -> u64 {
        self.inputs * self.outputs / self.per_word() * 4
    }

    /// Bytes `M.qzeros` holds.
    pub fn qzeros_bytes(&self) -> u64 {
        self.groups * (self.outputs / self.per_word()) * 4
    }

    /// Whether the shapes fit the packing (whole words, a group for every row).
    pub fn check(&self) -> Result<(), String> {
        if !matches!(self.bits, 2 | 4 | 8) {
            return Err(format!(
                "{} bits: devmap reads 2, 4 and 8-bit GPTQ/AWQ weights",
                self.bits
            ));
        }
        let p = self.per_word();
        if !self.outputs.is_multiple_of(p)
            || (matches!(self.packing, Packing::Gptq { .. }) && !self.inputs.is_multiple_of(p))
        {
            return Err(format!(
                "[{}, {}] does not pack into whole I32 words of {p} values",
                self.inputs, self.outputs
            ));
        }
        if self.groups == 0 {
            return Err("no scales".to_owned());
        }
        Ok(())
    }

    /// Word `k`'s value-position of column `o` (AWQ's interleaved order, or in turn).
    fn column_slot(&self, o: u64) -> u32 {
        let p = self.per_word();
        let within = o % p;
        match self.packing {
            // AWQ packs columns 0, 2, 4, 6, 1, 3, 5, 7 of each eight: column j sits at
            // position [0, 4, 1, 5, 2, 6, 3, 7][j] (AutoAWQ's reverse order).
            Packing::Awq if p == 8 => [0, 4, 1, 5, 2, 6, 3, 7][within as usize],
            _ => within as u32,
        }
    }

    /// What GPTQ v1 adds to each zero-point word: one to every value in it.
    fn zero_carry(&self) -> u32 {
        match self.packing {
            Packing::Gptq { v1: true } => match self.bits {
                2 => 0x5555_5555,
                4 => 0x1111_1111,
                _ => 0x0101_0101,
            },
            _ => 0,
        }
    }
}

/// A GPTQ or AWQ weight's inputs. `name` names the weight in errors.
pub struct TransposedInt<'a> {
    pub name: &'a str,
    pub qweight: (&'a File, ByteRange),
    pub qzeros: (&'a File, ByteRange),
    pub scales: (&'a File, ByteRange),
    pub g_idx: Option<(&'a File, ByteRange)>,
    pub layout: TransposedIntLayout,
    /// LoRA merges into the dequantized weight, applied to each band of output rows.
    pub merge: Option<&'a super::lora_kernel::RowMerger>,
}

/// Checks the stored sizes against the layout before anything is read.
fn check_sizes(input: &TransposedInt<'_>) -> Result<(), CopyError> {
    let (layout, name) = (input.layout, input.name);
    layout
        .check()
        .map_err(|why| invalid(format!("`{name}`: {why}")))?;
    if input.qweight.1.len != layout.qweight_bytes() {
        return Err(invalid(format!(
            "`{name}` holds {} bytes, but [{}, {}] values of {} bits pack into {}",
            input.qweight.1.len,
            layout.inputs,
            layout.outputs,
            layout.bits,
            layout.qweight_bytes()
        )));
    }
    if input.qzeros.1.len != layout.qzeros_bytes() {
        return Err(invalid(format!(
            "the zero points of `{name}` hold {} bytes, but {} groups of {} columns pack into {}",
            input.qzeros.1.len,
            layout.groups,
            layout.outputs,
            layout.qzeros_bytes()
        )));
    }
    let scales = layout.groups * layout.outputs * layout.scale_dtype.size();
    if input.scales.1.len != scales {
        return Err(invalid(format!(
            "the scales of `{name}` hold {} bytes, but [{}, {}] {} scales take {scales}",
            input.scales.1.len, layout.groups, layout.outputs, layout.scale_dtype
        )));
    }
    if let Some((_, g)) = input.g_idx
        && g.len != layout.inputs * 4
    {
        return Err(invalid(format!(
            "the g_idx of `{name}` holds {} bytes, but {} input rows need {}",
            g.len,
            layout.inputs,
            layout.inputs * 4
        )));
    }
    Ok(())
}

/// Each input row's group: `g_idx` (checked in range), else `i / group_size`; in order
/// when they are `i / group_size` with whole words to a group.
fn groups_of(input: &TransposedInt<'_>) -> Result<Groups, CopyError> {
    let layout = input.layout;
    let of = group_list(input)?;
    let size = layout.group_size.max(1);
    let in_order = size.is_multiple_of(layout.per_word())
        && of
            .iter()
            .enumerate()
            .all(|(i, &g)| u64::from(g) == i as u64 / size);
    Ok(Groups { of, in_order })
}

fn group_list(input: &TransposedInt<'_>) -> Result<Vec<u32>, CopyError> {
    let layout = input.layout;
    let Some((file, range)) = input.g_idx else {
        let size = layout.group_size.max(1);
        return (0..layout.inputs)
            .map(|i| {
                let g = i / size;
                if g < layout.groups {
                    Ok(g as u32)
                } else {
                    Err(invalid(format!(
                        "`{}`: input row {i} falls in group {g} of {} (group_size {size} does not divide the rows into the stored scales)",
                        input.name, layout.groups
                    )))
                }
            })
            .collect();
    };
    let mut bytes = vec![0u8; range.len as usize];
    read_exact_at(file, &mut bytes, range.offset)?;
    bytes
        .chunks_exact(4)
        .enumerate()
        .map(|(i, b)| {
            let g = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if g >= 0 && (g as u64) < layout.groups {
                Ok(g as u32)
            } else {
                Err(invalid(format!(
                    "the g_idx of `{}` gives input row {i} group {g}, outside the {} stored",
                    input.name, layout.groups
                )))
            }
        })
        .collect()
}

/// Output rows per sub-band (the output made at a time): whole words of columns, and
/// for GPTQ whole blocks of rows (`band::BLOCK_ROWS`).
fn band_rows(layout: TransposedIntLayout) -> u64 {
    let p = match layout.packing {
        Packing::Gptq { .. } => band::BLOCK_ROWS as u64,
        Packing::Awq => layout.per_word().max(8),
    };
    let rows = ((BAND_ELEMENTS / layout.inputs.max(1)) / p * p).max(p);
    match layout.packing {
        Packing::Gptq { .. } => rows,
        Packing::Awq => rows.max(AWQ_MIN_ROWS),
    }
}

/// Output rows per read band: as many sub-bands as `READ_BYTES` holds (for GPTQ at
/// least four). AWQ's packed rows hold a word per eight columns: 512-byte reads for a
/// 28,672-input weight, 1,792 for an 8,192-input one; GPTQ's a word per column: 2 KB
/// reads at 8 bits for a 28,672-input weight, 4 KB at 4. (The output goes out a few
/// rows at a time, so the read band has the room a sub-band's output took.)
fn read_rows(layout: TransposedIntLayout) -> u64 {
    read_rows_in(layout, READ_BYTES)
}

/// [`read_rows`] for a read band of `bytes` of packed words (AWQ's shared band holds
/// two bands' bytes: `shared.rs`).
fn read_rows_in(layout: TransposedIntLayout, bytes: u64) -> u64 {
    let band = band_rows(layout);
    // Packed bytes per output row.
    let row_bytes = (layout.inputs * u64::from(layout.bits)).div_ceil(8).max(1);
    match layout.packing {
        // Each read is a system call and a page look-up, whatever its length: 2 KB
        // reads took an 8-bit save from 2.13x to 1.86x cp (AMD EPYC VM), and 4 KB
        // reads instead of 1 KB a 4-bit one from 740 to 680 ms of CPU (47 MiB peak,
        // where it was 22).
        Packing::Gptq { .. } => band * (bytes / row_bytes / band).max(4),
        Packing::Awq => band * (bytes / row_bytes / band).max(1),
    }
}

/// Reads the weight and hands `sink` it dequantized to `to`, `[out, in]`, a band of
/// output rows at a time.
pub fn stream(
    input: &TransposedInt<'_>,
    to: DType,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    check_sizes(input)?;
    let groups = groups_of(input)?;
    stream_rows(input, &groups, 0..input.layout.outputs, to, cancel, sink)
}

/// [`stream`] on `threads` threads, each taking the next read band (AWQ's threads
/// share each band instead: `shared.rs`) and handing its rows to whichever thread is
/// writing, to their place in `dst` from `dst_offset` on. Returns the bytes written.
pub fn write_in_parallel(
    input: &TransposedInt<'_>,
    to: DType,
    (dst, dst_offset): (&File, u64),
    threads: u64,
    cancel: &(dyn Stop + Sync),
) -> Result<u64, CopyError> {
    check_sizes(input)?;
    let groups = groups_of(input)?;
    let layout = input.layout;
    if layout.packing == Packing::Awq && threads > 1 {
        shared::write_awq(input, &groups, to, (dst, dst_offset), threads, cancel)?;
        return Ok(layout.elements() * to.size());
    }
    // Each thread reads a band of its own, the next one not taken, and hands its rows
    // to whichever thread is writing (`save::hand_off`): one thread's band is read
    // while the other's rows are written, and no thread spins on the file's lock.
    let unit = read_rows(layout);
    let units = layout.outputs.div_ceil(unit);
    let threads = threads.clamp(1, units.max(1)) as usize;
    let row_bytes = layout.inputs * to.size();
    let next = AtomicU64::new(0);
    let hand_off = HandOff::new(dst, vec![Vec::new(); threads * shared::SPARES_A_THREAD]);
    let made = super::copy::join_all((0..threads).map(|_| {
        let (groups, hand_off, next) = (&groups, &hand_off, &next);
        move || {
            super::compute::permits().run(|| {
                super::compute::with_scratch(|band: &mut Band| {
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= units {
                            return Ok(());
                        }
                        let rows = k * unit..((k + 1) * unit).min(layout.outputs);
                        let write = &mut |at: u64, made: band::Made<'_>| {
                            hand_off.hand(dst_offset + at * row_bytes, made.buffer, made.range)
                        };
                        let made = stream_rows_into(band, input, groups, rows, to, cancel, write);
                        if made.is_err() {
                            // The save fails: the other threads take no further band.
                            next.store(units, Ordering::Relaxed);
                            return made;
                        }
                    }
                })
            })?;
            hand_off.flush().map_err(CopyError::Io)
        }
    }));
    made?;
    Ok(layout.elements() * to.size())
}

fn stream_rows(
    input: &TransposedInt<'_>,
    groups: &Groups,
    rows: std::ops::Range<u64>,
    to: DType,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    // The band's buffers (a read band of up to 14 MiB) are kept for the next weight.
    super::compute::with_scratch(|band: &mut Band| {
        stream_rows_into(band, input, groups, rows, to, cancel, &mut |_, mut made| {
            sink(made.rows())
        })
    })
}

/// Output rows `rows`, a read band at a time in `band`, each sub-band's rows handed to
/// `write` (the first row's index, and the rows made).
fn stream_rows_into(
    band: &mut Band,
    input: &TransposedInt<'_>,
    groups: &Groups,
    rows: std::ops::Range<u64>,
    to: DType,
    cancel: &dyn Stop,
    write: &mut dyn FnMut(u64, band::Made<'_>) -> io::Result<()>,
) -> Result<(), CopyError> {
    let read_step = read_rows(input.layout);
    band.shared.from_words = direct::rows_from_words(input.layout, groups, to);
    let mut r0 = rows.start;
    while r0 < rows.end {
        let r1 = (r0 + read_step).min(rows.end);
        band.read(input, r0..r1)?;
        let Band { shared, work } = &mut *band;
        make_rows(
            (work, shared),
            input,
            groups,
            (r0, r0..r1),
            to,
            cancel,
            &mut *write,
        )?;
        r0 = r1;
    }
    Ok(())
}

/// Output rows `rows` of the read band `read` (whose first row is `first`), a sub-band
/// at a time in `work`'s buffers, LoRA merges applied, handed to `write` (the first
/// row's index, and the rows); stops between sub-bands when asked.
fn make_rows(
    (work, read): (&mut band::Work, &band::Shared),
    input: &TransposedInt<'_>,
    groups: &Groups,
    (first, rows): (u64, std::ops::Range<u64>),
    to: DType,
    cancel: &dyn Stop,
    write: &mut dyn FnMut(u64, band::Made<'_>) -> io::Result<()>,
) -> Result<(), CopyError> {
    let step = band_rows(input.layout);
    let mut o0 = rows.start;
    while o0 < rows.end {
        if cancel.stop() {
            return Err(CopyError::Cancelled);
        }
        let o1 = (o0 + step).min(rows.end);
        let band = (first, o0..o1);
        work.dequantize(read, input.layout, groups, band, to, &mut |at, mut made| {
            if let Some(merge) = input.merge {
                merge.merge(at as usize, to, made.rows())?;
            }
            write(at, made).map_err(CopyError::Io)
        })?;
        o0 = o1;
    }
    Ok(())
}
