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

use std::fs::File;
use std::io;

use super::copy::{CopyError, Stop, read_exact_at};
use crate::types::dtype::DType;
use crate::types::range::ByteRange;

/// Output elements per band (before rounding the band to whole words of columns); a
/// small band in unit tests, so small weights cross band and read-band edges.
const BAND_ELEMENTS: u64 = if cfg!(test) { 1 << 10 } else { 1 << 21 };

/// Working memory of one stream at most: a read band's packed words, as read and as
/// words (AWQ's, eight sub-bands wide: 8 bytes an output element of the sub-band), a
/// sub-band's output (at most 4 bytes an element), its table (16 entries a group and
/// column, in f32, rounded and converted: at most 5 bytes an element for groups of 32
/// or more), and each input row's group.
pub const BAND_BYTES: u64 = BAND_ELEMENTS * (8 + 4 + 5) + (4 << 20);

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

fn invalid(message: String) -> CopyError {
    CopyError::Io(io::Error::new(io::ErrorKind::InvalidData, message))
}

fn word(bytes: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([
        bytes[i * 4],
        bytes[i * 4 + 1],
        bytes[i * 4 + 2],
        bytes[i * 4 + 3],
    ])
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

/// Output rows per sub-band (the output made at a time): whole words of columns.
fn band_rows(layout: TransposedIntLayout) -> u64 {
    let p = layout.per_word().max(8);
    ((BAND_ELEMENTS / layout.inputs.max(1)) / p * p).max(p)
}

/// Output rows per read band: a sub-band for GPTQ (whose packed rows hold a word per
/// column: a kilobyte a read at 256 rows), eight for AWQ (whose packed rows hold a word
/// per eight columns), so each read is long enough for the reads not to dominate.
fn read_rows(layout: TransposedIntLayout) -> u64 {
    match layout.packing {
        Packing::Gptq { .. } => band_rows(layout),
        Packing::Awq => band_rows(layout) * 8,
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

/// [`stream`] with the bands split among `threads` threads, each writing its rows at
/// their place in `dst` from `dst_offset` on. Returns the bytes written.
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
    let unit = read_rows(layout);
    let units = layout.outputs.div_ceil(unit);
    super::copy::write_parts_in_parallel(
        units,
        unit * layout.inputs * to.size(),
        threads,
        (dst, dst_offset),
        &|range, sink| {
            let rows = range.start * unit..(range.end * unit).min(layout.outputs);
            stream_rows(input, &groups, rows, to, cancel, sink)
        },
    )?;
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
    let (read_step, step) = (read_rows(input.layout), band_rows(input.layout));
    let mut band = Band::default();
    let mut r0 = rows.start;
    while r0 < rows.end {
        let r1 = (r0 + read_step).min(rows.end);
        band.read(input, r0..r1)?;
        let mut o0 = r0;
        while o0 < r1 {
            if cancel.stop() {
                return Err(CopyError::Cancelled);
            }
            let o1 = (o0 + step).min(r1);
            band.dequantize(input.layout, groups, (r0, o0..o1), to);
            if let Some(merge) = input.merge {
                merge.merge(o0 as usize, to, &mut band.output)?;
            }
            sink(&band.output).map_err(CopyError::Io)?;
            o0 = o1;
        }
        r0 = r1;
    }
    Ok(())
}

/// One read band's inputs and a sub-band's output.
#[derive(Default)]
struct Band {
    /// The read band's words of every packed row, row after row: as read, and as
    /// words.
    packed: Vec<u8>,
    words: Vec<u32>,
    /// Words of the read band in a packed row.
    words_a_row: usize,
    /// Zero points, `[groups, band]`, unpacked.
    zeros: Vec<i32>,
    zero_words: Vec<u8>,
    /// Scales, `[groups, band]`, as f32.
    scales: Vec<f32>,
    scale_bytes: Vec<u8>,
    wide: Vec<u8>,
    /// The output of each of the `2^bits` values, per group and column of the
    /// sub-band (`(q − z) · s` is one of 16, or 256, for a group and column), as f32
    /// bytes, rounded to the scale's dtype, and converted.
    floats: Vec<u8>,
    rounded: Vec<u8>,
    table: Vec<u8>,
    output: Vec<u8>,
}

impl Band {
    /// Reads output columns `cols` of every packed row, zero point and scale.
    fn read(
        &mut self,
        input: &TransposedInt<'_>,
        cols: std::ops::Range<u64>,
    ) -> Result<(), CopyError> {
        let layout = input.layout;
        let p = layout.per_word();
        let n = cols.end - cols.start;
        // Words of the band in a packed row, and the first.
        let (row_words, band_words, first_word, packed_rows) = match layout.packing {
            Packing::Gptq { .. } => (layout.outputs, n, cols.start, layout.inputs / p),
            Packing::Awq => (
                layout.outputs / p,
                n.div_ceil(p),
                cols.start / p,
                layout.inputs,
            ),
        };
        self.words_a_row = band_words as usize;
        self.packed
            .resize((packed_rows * band_words * 4) as usize, 0);
        for (r, dst) in self
            .packed
            .chunks_exact_mut((band_words * 4) as usize)
            .enumerate()
        {
            let at = input.qweight.1.offset + (r as u64 * row_words + first_word) * 4;
            read_exact_at(input.qweight.0, dst, at)?;
        }
        self.words.clear();
        self.words.extend(
            self.packed
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        // Zero points: their words for the band's columns, a group at a time.
        let zero_row = layout.outputs / p;
        let zero_words = n.div_ceil(p);
        self.zero_words.resize((zero_words * 4) as usize, 0);
        self.zeros.clear();
        let carry = layout.zero_carry();
        let mask = (1u32 << layout.bits) - 1;
        for g in 0..layout.groups {
            let at = input.qzeros.1.offset + (g * zero_row + cols.start / p) * 4;
            read_exact_at(input.qzeros.0, &mut self.zero_words, at)?;
            for o in cols.clone() {
                let w = word(&self.zero_words, ((o - cols.start) / p) as usize).wrapping_add(carry);
                let slot = layout.column_slot(o);
                self.zeros
                    .push(((w >> (slot * u32::from(layout.bits))) & mask) as i32);
            }
        }
        // Scales, checked finite.
        let size = layout.scale_dtype.size();
        self.scale_bytes
            .resize((layout.groups * n * size) as usize, 0);
        for g in 0..layout.groups {
            let at = input.scales.1.offset + (g * layout.outputs + cols.start) * size;
            let dst = &mut self.scale_bytes[(g * n * size) as usize..((g + 1) * n * size) as usize];
            read_exact_at(input.scales.0, dst, at)?;
        }
        self.wide
            .resize(self.scale_bytes.len() / size as usize * 4, 0);
        super::cast::cast(
            layout.scale_dtype,
            DType::F32,
            &self.scale_bytes,
            &mut self.wide,
        );
        self.scales.clear();
        self.scales.extend(
            self.wide
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        if let Some(bad) = self.scales.iter().position(|s| !s.is_finite()) {
            let (g, o) = (bad as u64 / n, cols.start + bad as u64 % n);
            return Err(invalid(format!(
                "the scales of `{}` hold {} at [{g}, {o}]: the weight cannot be dequantized",
                input.name, self.scales[bad]
            )));
        }
        Ok(())
    }

    /// Output rows `cols` (of the read band starting at `first`) of every input column.
    fn dequantize(
        &mut self,
        layout: TransposedIntLayout,
        groups: &Groups,
        (first, cols): (u64, std::ops::Range<u64>),
        to: DType,
    ) {
        let n = (cols.end - cols.start) as usize;
        let read_n = self.zeros.len() / layout.groups as usize;
        let skip = (cols.start - first) as usize;
        let inputs = layout.inputs as usize;
        let size = to.size() as usize;
        let values = 1usize << layout.bits;
        // Every output a value can have, per group and column: `(v − z) · s` for each
        // of the 2^bits values v, exact in f32, then rounded to the scale's dtype and
        // converted to `to` by the vectorized casts: `[groups, n, values]` elements.
        // (A group holds many values a pattern: 4 bits in groups of 32 or more.)
        self.floats.clear();
        for g in 0..layout.groups as usize {
            for local in 0..n {
                let at = g * read_n + skip + local;
                let (z, s) = (self.zeros[at], self.scales[at]);
                self.floats
                    .extend((0..values as i32).flat_map(|v| ((v - z) as f32 * s).to_le_bytes()));
            }
        }
        super::packed_int::round_and_convert(
            &self.floats,
            layout.scale_dtype,
            to,
            &mut self.rounded,
            &mut self.table,
        );
        self.output.resize(n * inputs * size, 0);
        let band = Decode {
            layout,
            groups,
            packed: &self.words,
            band_words: self.words_a_row,
            skip,
            n,
            table: &self.table,
        };
        if size == 2 {
            band.decode::<2>(&mut self.output);
        } else {
            band.decode::<4>(&mut self.output);
        }
    }
}

/// Each input row's group: `g_idx`'s, and whether they run in order (`i / group_size`),
/// so a word's values share one.
pub(crate) struct Groups {
    of: Vec<u32>,
    in_order: bool,
}

/// A sub-band's packed values, where they are in the read band, and its table.
struct Decode<'a> {
    layout: TransposedIntLayout,
    groups: &'a Groups,
    packed: &'a [u32],
    band_words: usize,
    /// Columns of the read band before the sub-band, and the sub-band's columns.
    skip: usize,
    n: usize,
    /// `[groups, n, values]` outputs of `SIZE` bytes.
    table: &'a [u8],
}

impl Decode<'_> {
    /// Every value of the sub-band written into `output` (`[n, inputs]` elements of
    /// `SIZE` bytes), looked up in the table.
    fn decode<const SIZE: usize>(&self, output: &mut [u8]) {
        let Decode {
            layout,
            groups,
            packed,
            band_words,
            skip,
            n,
            table,
        } = *self;
        let per_word = layout.per_word() as usize;
        let inputs = layout.inputs as usize;
        let bits = u32::from(layout.bits);
        let mask = (1u32 << bits) - 1;
        let values = 1usize << bits;
        // The outputs of group g, column `local`.
        let row_of = |g: usize, local: usize| {
            let at = (g * n + local) * values * SIZE;
            &table[at..at + values * SIZE]
        };
        let word_at = |at: usize| packed[at];
        match layout.packing {
            Packing::Gptq { .. } => {
                // Output row by output row, along it: a word a packed row, p inputs a
                // word (of one group when the groups run in order).
                for local in 0..n {
                    let row = &mut output[local * inputs * SIZE..(local + 1) * inputs * SIZE];
                    for (r, dst) in row.chunks_exact_mut(per_word * SIZE).enumerate() {
                        let word = word_at(r * band_words + skip + local);
                        let first = r * per_word;
                        if groups.in_order {
                            let outputs = row_of(groups.of[first] as usize, local);
                            for (k, out) in dst.chunks_exact_mut(SIZE).enumerate() {
                                let q = ((word >> (k as u32 * bits)) & mask) as usize;
                                out.copy_from_slice(&outputs[q * SIZE..(q + 1) * SIZE]);
                            }
                        } else {
                            for (k, out) in dst.chunks_exact_mut(SIZE).enumerate() {
                                let q = ((word >> (k as u32 * bits)) & mask) as usize;
                                let outputs = row_of(groups.of[first + k] as usize, local);
                                out.copy_from_slice(&outputs[q * SIZE..(q + 1) * SIZE]);
                            }
                        }
                    }
                }
            }
            Packing::Awq => {
                // A transposition: tiles of TILE input rows, each input row's words for
                // the sub-band decoded into the tile (a column of it a column of the
                // weight), then the tile's rows copied along the output rows.
                const TILE: usize = 64;
                let first_word = skip / per_word;
                let slots: Vec<u32> = (0..per_word as u64)
                    .map(|c| layout.column_slot(c))
                    .collect();
                let mut tile = vec![0u8; n * TILE * SIZE];
                for i0 in (0..inputs).step_by(TILE) {
                    let rows = TILE.min(inputs - i0);
                    for t in 0..rows {
                        let i = i0 + t;
                        let g = groups.of[i] as usize;
                        let words = i * band_words + first_word;
                        for j in 0..n / per_word {
                            let word = word_at(words + j);
                            for (c, &slot) in slots.iter().enumerate() {
                                let local = j * per_word + c;
                                let q = ((word >> (slot * bits)) & mask) as usize;
                                let at = (local * TILE + t) * SIZE;
                                tile[at..at + SIZE]
                                    .copy_from_slice(&row_of(g, local)[q * SIZE..(q + 1) * SIZE]);
                            }
                        }
                    }
                    for local in 0..n {
                        let at = (local * inputs + i0) * SIZE;
                        output[at..at + rows * SIZE].copy_from_slice(
                            &tile[local * TILE * SIZE..(local * TILE + rows) * SIZE],
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    struct NeverStop;
    impl Stop for NeverStop {
        fn stop(&self) -> bool {
            false
        }
    }

    fn file_of(words: &[u8]) -> (tempfile::NamedTempFile, ByteRange) {
        let mut f = tempfile::NamedTempFile::new().expect("tmp");
        f.write_all(words).expect("write");
        let range = ByteRange {
            file: 0,
            offset: 0,
            len: words.len() as u64,
        };
        (f, range)
    }

    fn le(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// Packs eight 4-bit values into a word, value `k` at `slot(k)`.
    fn pack8(value: impl Fn(usize) -> u32, slot: impl Fn(usize) -> u32) -> u32 {
        (0..8).fold(0, |w, k| w | value(k) << (4 * slot(k)))
    }

    /// `inputs` × `outputs`, 4 bits, 2 groups; codes `(i·3 + o·5) mod 16`;
    /// zero points 0 and 15 in group 0's first columns (a v1 word then carries). The
    /// stored words and the weight expected, `[out, in]`.
    fn case(
        packing: Packing,
        (inputs, outputs): (usize, usize),
    ) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<f32>) {
        let groups = 2;
        let code = |i: usize, o: usize| ((i * 3 + o * 5) % 16) as u32;
        let zero = |g: usize, o: usize| match (g, o) {
            (0, 0) => 0,
            (0, 1) => 15,
            _ => ((g * 7 + o * 3) % 16) as u32,
        };
        let scale =
            |g: usize, o: usize| half::f16::from_f32(0.01 + ((g * 8 + o) % 97) as f32 * 0.003);
        let v1 = packing == Packing::Gptq { v1: true };
        // Column k of a word of eight: AWQ interleaves them.
        let slot = |k: usize| match packing {
            Packing::Awq => [0, 4, 1, 5, 2, 6, 3, 7][k % 8],
            Packing::Gptq { .. } => (k % 8) as u32,
        };
        let in_turn = |k: usize| k as u32;
        let qweight: Vec<u32> = match packing {
            Packing::Gptq { .. } => (0..inputs / 8)
                .flat_map(|r| (0..outputs).map(move |o| pack8(|k| code(r * 8 + k, o), in_turn)))
                .collect(),
            Packing::Awq => (0..inputs)
                .flat_map(|i| (0..outputs / 8).map(move |j| pack8(|k| code(i, j * 8 + k), slot)))
                .collect(),
        };
        let stored = |g: usize, o: usize| {
            if v1 {
                zero(g, o).wrapping_sub(1) & 0xF
            } else {
                zero(g, o)
            }
        };
        let qzeros: Vec<u32> = (0..groups)
            .flat_map(|g| (0..outputs / 8).map(move |j| pack8(|k| stored(g, j * 8 + k), slot)))
            .collect();
        let scales: Vec<u8> = (0..groups)
            .flat_map(|g| (0..outputs).map(move |o| scale(g, o)))
            .flat_map(half::f16::to_le_bytes)
            .collect();
        // What GPTQModel reads: v1 words plus one in every value, carries included.
        let read_zero = |g: usize, o: usize| {
            let word = qzeros[g * outputs / 8 + o / 8];
            let word = if v1 {
                word.wrapping_add(0x1111_1111)
            } else {
                word
            };
            (word >> (4 * slot(o))) & 0xF
        };
        let expected: Vec<f32> = (0..outputs)
            .flat_map(|o| {
                (0..inputs).map(move |i| {
                    let g = i / (inputs / groups);
                    let product =
                        (code(i, o) as i32 - read_zero(g, o) as i32) as f32 * scale(g, o).to_f32();
                    half::f16::from_f32(product).to_f32()
                })
            })
            .collect();
        (le(&qweight), le(&qzeros), scales, expected)
    }

    #[test]
    fn gptq_and_awq_words_unpack_to_the_weight_transposed() {
        // 8 outputs: one band; 1024: several sub-bands and read bands. Groups of 8
        // values are computed value by value, groups of 32 through the table.
        let packings = [
            Packing::Gptq { v1: true },
            Packing::Gptq { v1: false },
            Packing::Awq,
        ];
        let sizes = [(16, 8), (16, 1024), (64, 8), (64, 1024)];
        for (packing, (inputs, outputs)) in packings
            .into_iter()
            .flat_map(|p| sizes.map(|size| (p, size)))
        {
            let (qweight, qzeros, scales, expected) = case(packing, (inputs, outputs));
            let (w, wr) = file_of(&qweight);
            let (z, zr) = file_of(&qzeros);
            let (s, sr) = file_of(&scales);
            let input = TransposedInt {
                name: "m.qweight",
                qweight: (w.as_file(), wr),
                qzeros: (z.as_file(), zr),
                scales: (s.as_file(), sr),
                g_idx: None,
                layout: TransposedIntLayout {
                    inputs: inputs as u64,
                    outputs: outputs as u64,
                    bits: 4,
                    groups: 2,
                    group_size: inputs as u64 / 2,
                    packing,
                    scale_dtype: DType::F16,
                },
                merge: None,
            };
            let mut out = Vec::new();
            stream(&input, DType::F32, &NeverStop, &mut |b| {
                out.extend_from_slice(b);
                Ok(())
            })
            .expect("dequantized");
            let got: Vec<f32> = out
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            assert_eq!(got, expected, "{packing:?} {inputs} × {outputs}");
            // The same bytes from threads writing their bands in place.
            let dst = tempfile::tempfile().expect("tmp");
            write_in_parallel(&input, DType::F32, (&dst, 0), 3, &NeverStop).expect("written");
            let mut written = vec![0u8; out.len()];
            crate::save::copy::read_exact_at(&dst, &mut written, 0).expect("read back");
            assert_eq!(written, out, "{packing:?} × {outputs} in parallel");
        }
        // v1's carry: zero point 0 is stored as 15, whose +1 carries into column 1.
        let (_, qzeros, _, _) = case(Packing::Gptq { v1: true }, (16, 8));
        let word = u32::from_le_bytes([qzeros[0], qzeros[1], qzeros[2], qzeros[3]]);
        assert_eq!((word.wrapping_add(0x1111_1111) >> 4) & 0xF, 0);
    }
}
