//! compressed-tensors `pack-quantized` integer weights (W4A16, W8A16: llm-compressor's
//! GPTQ and RTN output, Kimi K2's INT4 release) dequantized while streaming, as
//! compressed-tensors' `PackedQuantizationCompressor.decompress` computes them:
//!
//! - `M.weight_packed` (I32 `[rows, ⌈cols·bits/32⌉]`) holds each row's values densely:
//!   value `c` at bit `c·bits` of the row's little-endian words (a value may straddle two
//!   words), stored plus `2^(bits−1)`;
//! - `M.weight_scale` holds one scale per group of `group` columns of a row (`group`),
//!   per row (`channel`), or one for the tensor (`tensor`);
//! - `M.weight_zero_point` (asymmetric only) holds one zero point per scale, packed the
//!   same way but down the rows (I32 `[⌈rows·bits/32⌉, groups]`).
//!
//! - `M.weight_g_idx` (activation order, `actorder: group`; I32 `[cols]`), when stored,
//!   names each column's group: the scales of group `g_idx[c]` apply to column `c`, as
//!   compressed-tensors 0.18's `dequantize` computes it (it sorts the columns by
//!   `g_idx`, cuts them into groups of `group` and puts them back). The two readings agree
//!   only when each group holds exactly `group` columns; another `g_idx` is refused.
//!
//! `w = (q − z) · s`, the subtraction and the multiply in the scale's dtype (torch's
//! `x_q.to(scale.dtype)`: one rounding of the exact product), then converted to the
//! dtype the model is loaded in. Rows stream a band at a time (a multiple of 32 rows, so
//! a band's zero points are whole words): memory is a few bands, whatever the tensor.

use std::fs::File;
use std::io;

use super::copy::{CopyError, Stop, invalid_data as invalid, read_exact_at, resize_exact};
use super::lookup::{expand_by_input, expand_nibbles, fill_table, round_and_convert};
use crate::types::DType;
use crate::types::range::ByteRange;

/// Output elements per band (before rounding up to 32 rows).
const BAND_ELEMENTS: u64 = 1 << 20;

/// Working memory of one dequantizing stream at most: a band's packed words, values,
/// scale-dtype bytes and output, and its scales and zero points.
pub const BAND_BYTES: u64 = BAND_ELEMENTS * (1 + 4 + 4 + 4) + (1 << 20);

/// A packed integer weight's geometry and scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedIntLayout {
    /// The dequantized weight's shape, `[rows, cols]`.
    pub rows: u64,
    pub cols: u64,
    /// Bits per value, 1 to 8.
    pub bits: u8,
    /// Columns sharing a scale: the group size, `cols` for one scale per row; 0 for one
    /// scale for the whole tensor.
    pub group: u64,
    pub scale_dtype: DType,
    /// Whether zero points are stored (an asymmetric scheme).
    pub zero_points: bool,
}

impl PackedIntLayout {
    /// I32 words per packed row.
    pub fn packed_cols(&self) -> u64 {
        (self.cols * u64::from(self.bits)).div_ceil(32)
    }

    /// Scales per row (1 for one per row or per tensor).
    pub fn groups(&self) -> u64 {
        match self.group {
            0 => 1,
            g => self.cols / g,
        }
    }

    /// Columns a scale covers (all of a row's for one scale per row or per tensor).
    fn group_width(&self) -> usize {
        match self.group {
            0 => self.cols as usize,
            g => g as usize,
        }
    }

    /// Scales stored.
    pub fn scale_count(&self) -> u64 {
        if self.group == 0 {
            1
        } else {
            self.rows * self.groups()
        }
    }

    /// Rows of I32 words the zero points take (packed down the rows).
    pub fn zero_rows(&self) -> u64 {
        (self.rows * u64::from(self.bits)).div_ceil(32)
    }

    /// Values the weight dequantizes to.
    pub fn elements(&self) -> u64 {
        self.rows * self.cols
    }

    /// The shape written.
    pub fn shape(&self) -> [u64; 2] {
        [self.rows, self.cols]
    }

    /// The offset values are stored plus.
    fn offset(&self) -> i32 {
        1 << (self.bits - 1)
    }
}

/// A packed weight's inputs. `name` names the weight in errors.
pub struct PackedInt<'a> {
    pub name: &'a str,
    pub packed: (&'a File, ByteRange),
    pub scales: (&'a File, ByteRange),
    pub zeros: Option<(&'a File, ByteRange)>,
    /// `M.weight_g_idx`: each column's group (activation order), I32 `[cols]`.
    pub g_idx: Option<(&'a File, ByteRange)>,
    pub layout: PackedIntLayout,
    /// LoRA merges into the dequantized weight, applied in `to` to each band as peft
    /// merges into the model transformers loads dequantized.
    pub merge: Option<&'a super::lora_kernel::RowMerger>,
}

/// Scales stored as `dtype` (`bytes`) widened to f32 into `scales` (`wide` holds the
/// f32 bytes on the way); the index of the first that is not finite, if one is not.
pub(crate) fn widen_scales(
    dtype: DType,
    bytes: &[u8],
    wide: &mut Vec<u8>,
    scales: &mut Vec<f32>,
) -> Option<usize> {
    scales.clear();
    widen_scales_onto(dtype, bytes, wide, scales)
}

/// [`widen_scales`] appending to `scales`; the index among those appended of the first
/// that is not finite, if one is not.
pub(crate) fn widen_scales_onto(
    dtype: DType,
    bytes: &[u8],
    wide: &mut Vec<u8>,
    scales: &mut Vec<f32>,
) -> Option<usize> {
    resize_exact(wide, bytes.len() / dtype.size() as usize * 4, 0);
    super::cast::cast(dtype, DType::F32, bytes, wide);
    let from = scales.len();
    scales.extend(
        wide.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
    scales[from..].iter().position(|s| !s.is_finite())
}

/// Bit `at` of a little-endian run of I32 words, `bits` wide: the value there.
fn value_at(word: impl Fn(usize) -> u32, at: u64, bits: u8) -> u32 {
    let mask = (1u32 << bits) - 1;
    let (index, shift) = ((at / 32) as usize, (at % 32) as u32);
    let mut v = word(index) >> shift;
    if shift + u32::from(bits) > 32 {
        v |= word(index + 1) << (32 - shift);
    }
    v & mask
}

fn word_of(bytes: &[u8], i: usize) -> u32 {
    bytes
        .get(i * 4..i * 4 + 4)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Stored value `c` of a packed row (its little-endian bytes): a nibble or a byte read
/// directly for 4 and 8 bits (each whole in one byte, the low nibble first), else by
/// its bit position.
fn stored_value(row: &[u8], c: usize, bits: u8) -> u32 {
    match bits {
        8 => u32::from(row[c]),
        4 => u32::from(row[c / 2] >> ((c % 2) * 4)) & 0xF,
        _ => value_at(|w| word_of(row, w), c as u64 * u64::from(bits), bits),
    }
}

/// Checks the stored sizes against the layout before anything is read.
fn check_sizes(input: &PackedInt<'_>) -> Result<(), CopyError> {
    let layout = input.layout;
    let name = input.name;
    if input.packed.1.len != layout.rows * layout.packed_cols() * 4 {
        return Err(invalid(format!(
            "`{name}` holds {} bytes, but [{}, {}] values of {} bits pack into {} I32 words a row",
            input.packed.1.len,
            layout.rows,
            layout.cols,
            layout.bits,
            layout.packed_cols()
        )));
    }
    if input.scales.1.len != layout.scale_count() * layout.scale_dtype.size() {
        return Err(invalid(format!(
            "the scales of `{name}` hold {} bytes, but {} {} scales are needed",
            input.scales.1.len,
            layout.scale_count(),
            layout.scale_dtype
        )));
    }
    if let Some((_, z)) = input.zeros
        && z.len != layout.zero_rows() * layout.groups() * 4
    {
        return Err(invalid(format!(
            "the zero points of `{name}` hold {} bytes, but [{}, {}] I32 words are needed",
            z.len,
            layout.zero_rows(),
            layout.groups()
        )));
    }
    if let Some((_, g)) = input.g_idx
        && g.len != layout.cols * 4
    {
        return Err(invalid(format!(
            "the g_idx of `{name}` holds {} bytes, but {} columns need {} (I32 each)",
            g.len,
            layout.cols,
            layout.cols * 4
        )));
    }
    Ok(())
}

/// Each column's group from `input.g_idx`, checked; `None` where the columns run in
/// order (no `g_idx`, one that is `c / group` throughout, or compressed-tensors' "not
/// set", all −1).
fn column_groups(input: &PackedInt<'_>) -> Result<Option<Vec<u32>>, CopyError> {
    let Some((file, range)) = input.g_idx else {
        return Ok(None);
    };
    let layout = input.layout;
    let name = input.name;
    let mut bytes = vec![0u8; range.len as usize];
    read_exact_at(file, &mut bytes, range.offset)?;
    let stored: Vec<i32> = bytes
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if stored.iter().all(|&g| g == -1) {
        return Ok(None);
    }
    let groups = layout.groups();
    let mut count = vec![0u64; groups as usize];
    for (c, &g) in stored.iter().enumerate() {
        if g < 0 || g as u64 >= groups {
            return Err(invalid(format!(
                "the g_idx of `{name}` gives column {c} group {g}, outside the {groups} stored"
            )));
        }
        count[g as usize] += 1;
    }
    // compressed-tensors cuts the columns, sorted by group, into runs of `group`: that
    // is group `g_idx[c]` only when every group has `group` columns.
    if let Some((g, n)) = count.iter().enumerate().find(|(_, n)| **n != layout.group) {
        return Err(invalid(format!(
            "the g_idx of `{name}` puts {n} columns in group {g}, not the group size {}: compressed-tensors would take such columns into their neighbours' groups, and devmap does not guess which",
            layout.group
        )));
    }
    let in_order = stored
        .iter()
        .enumerate()
        .all(|(c, &g)| g as u64 == c as u64 / layout.group);
    Ok((!in_order).then(|| stored.into_iter().map(|g| g as u32).collect()))
}

/// Rows per band: a multiple of 32 (a band's zero points are whole words).
fn band_rows(layout: PackedIntLayout) -> u64 {
    ((BAND_ELEMENTS / layout.cols.max(1)) / 32 * 32).max(32)
}

/// One band's inputs, read, and the buffers its output is made in.
#[derive(Default)]
struct Band {
    packed: Vec<u8>,
    scale_bytes: Vec<u8>,
    wide: Vec<u8>,
    scales: Vec<f32>,
    zero_words: Vec<u8>,
    /// Products in f32 (exact), as bytes, and those rounded to the scale's dtype.
    floats: Vec<u8>,
    rounded: Vec<u8>,
    output: Vec<u8>,
}

/// Reads `input`'s packed values, scales and zero points, and hands `sink` the
/// dequantized weight converted to `to`, a band of rows at a time.
pub fn stream(
    input: &PackedInt<'_>,
    to: DType,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    check_sizes(input)?;
    let of = column_groups(input)?;
    stream_rows(input, of.as_deref(), 0..input.layout.rows, to, cancel, sink)
}

/// [`stream`] with the bands split among `threads` threads, each writing its rows'
/// output at their place in `dst` from `dst_offset` on (the work is arithmetic, not
/// I/O). Returns the bytes written.
pub fn write_in_parallel(
    input: &PackedInt<'_>,
    to: DType,
    (dst, dst_offset): (&File, u64),
    threads: u64,
    cancel: &(dyn Stop + Sync),
) -> Result<u64, CopyError> {
    check_sizes(input)?;
    let of = column_groups(input)?;
    let layout = input.layout;
    let unit = 32;
    let units = layout.rows.div_ceil(unit);
    super::copy::write_parts_in_parallel(
        units,
        unit * layout.cols * to.size(),
        threads,
        (dst, dst_offset),
        &|range, sink| {
            let rows = range.start * unit..(range.end * unit).min(layout.rows);
            stream_rows(input, of.as_deref(), rows, to, cancel, sink)
        },
    )?;
    Ok(layout.elements() * to.size())
}

/// [`stream`] of rows `rows` only (`rows.start` a multiple of 32), each column in
/// group `of[c]` where `of` is given (activation order).
fn stream_rows(
    input: &PackedInt<'_>,
    of: Option<&[u32]>,
    rows: std::ops::Range<u64>,
    to: DType,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let step = band_rows(input.layout);
    let mut band = Band::default();
    let mut r0 = rows.start;
    while r0 < rows.end {
        if cancel.stop() {
            return Err(CopyError::Cancelled);
        }
        let r1 = (r0 + step).min(rows.end);
        band.read(input, r0..r1)?;
        band.dequantize(input.layout, of, r1 - r0, to);
        if let Some(merge) = input.merge {
            merge.merge(r0 as usize, to, &mut band.output)?;
        }
        sink(&band.output).map_err(CopyError::Io)?;
        r0 = r1;
    }
    Ok(())
}

impl Band {
    /// Reads rows `rows` of the packed values, their scales (checked finite) and their
    /// zero points' words.
    fn read(&mut self, input: &PackedInt<'_>, rows: std::ops::Range<u64>) -> Result<(), CopyError> {
        let layout = input.layout;
        let packed_row = layout.packed_cols() * 4;
        let n = rows.end - rows.start;
        resize_exact(&mut self.packed, (n * packed_row) as usize, 0);
        read_exact_at(
            input.packed.0,
            &mut self.packed,
            input.packed.1.offset + rows.start * packed_row,
        )?;
        let groups = layout.groups();
        let (first_scale, count) = if layout.group == 0 {
            (0, 1)
        } else {
            (rows.start * groups, n * groups)
        };
        let size = layout.scale_dtype.size();
        resize_exact(&mut self.scale_bytes, (count * size) as usize, 0);
        read_exact_at(
            input.scales.0,
            &mut self.scale_bytes,
            input.scales.1.offset + first_scale * size,
        )?;
        if let Some(bad) = widen_scales(
            layout.scale_dtype,
            &self.scale_bytes,
            &mut self.wide,
            &mut self.scales,
        ) {
            return Err(invalid(format!(
                "the scales of `{}` hold {} at element {}: the weight cannot be dequantized",
                input.name,
                self.scales[bad],
                first_scale + bad as u64
            )));
        }
        if let Some((file, z)) = input.zeros {
            // rows.start is a multiple of 32: the band's zero points are whole words.
            let bits = u64::from(layout.bits);
            let first = rows.start * bits / 32;
            let words = (rows.end * bits).div_ceil(32) - first;
            resize_exact(&mut self.zero_words, (words * groups * 4) as usize, 0);
            read_exact_at(file, &mut self.zero_words, z.offset + first * groups * 4)?;
        }
        Ok(())
    }

    /// The band's `n` rows dequantized into `output`, in `to`; column `c` in group
    /// `of[c]` where `of` is given (activation order), else in group `c / group`.
    fn dequantize(&mut self, layout: PackedIntLayout, of: Option<&[u32]>, n: u64, to: DType) {
        let n = n as usize;
        // Where a group holds many more values than a value has patterns (4 bits in
        // groups of 32 or more), each pattern's output is made once and looked up.
        if (1usize << layout.bits) * 2 <= layout.group_width() {
            let mut output = std::mem::take(&mut self.output);
            resize_exact(
                &mut output,
                n * layout.cols as usize * to.size() as usize,
                0,
            );
            if to.size() == 2 {
                self.decode_by_table::<2>(layout, of, n, to, &mut output);
            } else {
                self.decode_by_table::<4>(layout, of, n, to, &mut output);
            }
            self.output = output;
        } else {
            self.dequantize_each(layout, of, n, to);
        }
    }

    /// The scale and zero point of row `i` (of the band), group `g`.
    fn scale_and_zero(&self, layout: PackedIntLayout, i: usize, g: usize) -> (f32, i32) {
        let groups = layout.groups() as usize;
        let s = if layout.group == 0 {
            self.scales[0]
        } else {
            self.scales[i * groups + g]
        };
        let z = if layout.zero_points {
            let word = |w: usize| word_of(&self.zero_words, w * groups + g);
            value_at(word, i as u64 * u64::from(layout.bits), layout.bits) as i32 - layout.offset()
        } else {
            0
        };
        (s, z)
    }

    /// Each value computed: `(q − z) · s` in f32 (exact: q − z is a small integer, and
    /// the product of values of at most 11 significant bits each fits f32's 24), then
    /// rounded once to the scale's dtype — as torch's multiply in that dtype rounds it —
    /// and converted to `to` as `.to(dtype)` does.
    fn dequantize_each(
        &mut self,
        layout: PackedIntLayout,
        of: Option<&[u32]>,
        n: usize,
        to: DType,
    ) {
        let cols = layout.cols as usize;
        let groups = layout.groups() as usize;
        let group = layout.group_width();
        let packed_row = layout.packed_cols() as usize * 4;
        let mut floats = std::mem::take(&mut self.floats);
        resize_exact(&mut floats, n * cols * 4, 0);
        let mut params = Vec::with_capacity(groups);
        for i in 0..n {
            let row = &self.packed[i * packed_row..(i + 1) * packed_row];
            let out = &mut floats[i * cols * 4..(i + 1) * cols * 4];
            params.clear();
            params.extend((0..groups).map(|g| self.scale_and_zero(layout, i, g)));
            for (c, o) in out.chunks_exact_mut(4).enumerate() {
                let (s, z) = params[of.map_or(c / group, |of| of[c] as usize)];
                let q = stored_value(row, c, layout.bits) as i32 - layout.offset();
                o.copy_from_slice(&((q - z) as f32 * s).to_le_bytes());
            }
        }
        self.floats = floats;
        resize_exact(
            &mut self.output,
            self.floats.len() / 4 * to.size() as usize,
            0,
        );
        round_and_convert(
            &self.floats,
            layout.scale_dtype,
            to,
            &mut self.rounded,
            &mut self.output,
        );
    }

    /// [`Band::dequantize_each`]'s values, each stored pattern's computed once a group
    /// and looked up, into `output`, of elements of `SIZE` bytes (the sizes are
    /// constants, so each store is one move, not a call).
    fn decode_by_table<const SIZE: usize>(
        &self,
        layout: PackedIntLayout,
        of: Option<&[u32]>,
        n: usize,
        to: DType,
        output: &mut [u8],
    ) {
        let cols = layout.cols as usize;
        let groups = layout.groups() as usize;
        let group = layout.group_width();
        let packed_row = layout.packed_cols() as usize * 4;
        let entries = 1usize << layout.bits;
        // Each group's table of the row: `entries` outputs, one per stored pattern.
        let mut tables = vec![[0u8; SIZE]; groups * entries];
        for i in 0..n {
            let row = &self.packed[i * packed_row..(i + 1) * packed_row];
            let out = &mut output[i * cols * SIZE..(i + 1) * cols * SIZE];
            for (g, table) in tables.chunks_exact_mut(entries).enumerate() {
                let (s, z) = self.scale_and_zero(layout, i, g);
                fill_table(table, -layout.offset() - z, s, (layout.scale_dtype, to));
            }
            let Some(of) = of else {
                for (g, table) in tables.chunks_exact(entries).enumerate() {
                    let span = g * group..((g + 1) * group).min(cols);
                    decode_span(
                        row,
                        span.clone(),
                        layout.bits,
                        table,
                        &mut out[span.start * SIZE..span.end * SIZE],
                    );
                }
                continue;
            };
            if layout.bits == 4 && cols.is_multiple_of(2) {
                // Two values a byte, the low nibble first, each by its own group.
                expand_by_input::<SIZE>(
                    (row, 0),
                    (0, 1),
                    (of, groups),
                    tables.as_chunks::<16>().0,
                    out,
                );
            } else {
                for (c, o) in out.chunks_exact_mut(SIZE).enumerate() {
                    let v = stored_value(row, c, layout.bits) as usize;
                    o.copy_from_slice(&tables[of[c] as usize * entries + (v & (entries - 1))]);
                }
            }
        }
    }
}

/// Values `span` of a packed row, all of one group, each looked up in its `table`.
fn decode_span<const SIZE: usize>(
    row: &[u8],
    span: std::ops::Range<usize>,
    bits: u8,
    table: &[[u8; SIZE]],
    dst: &mut [u8],
) {
    if bits == 4 && span.start.is_multiple_of(2) && span.len().is_multiple_of(2) {
        // Two values a byte, the low nibble first.
        let nibbles: &[[u8; SIZE]; 16] = table.try_into().unwrap_or(&[[0; SIZE]; 16]);
        expand_nibbles(&row[span.start / 2..span.end / 2], nibbles, dst);
    } else if bits == 8 {
        for (b, o) in row[span].iter().zip(dst.chunks_exact_mut(SIZE)) {
            o.copy_from_slice(&table[usize::from(*b)]);
        }
    } else {
        for (c, o) in span.zip(dst.chunks_exact_mut(SIZE)) {
            let v = stored_value(row, c, bits) as usize;
            o.copy_from_slice(&table[v & (table.len() - 1)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_straddling_words_unpack_for_every_width() {
        for bits in 1..=8u8 {
            let half = 1i32 << (bits - 1);
            let values: Vec<i32> = (0..70).map(|i| (i * 5 % (2 * half)) - half).collect();
            let words = crate::fixtures::pack_int32(&values, u32::from(bits));
            for (i, v) in values.iter().enumerate() {
                let got = value_at(
                    |w| words.get(w).copied().unwrap_or(0),
                    i as u64 * u64::from(bits),
                    bits,
                ) as i32
                    - half;
                assert_eq!(got, *v, "bits {bits}, value {i}");
            }
        }
    }
}
