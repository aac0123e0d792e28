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

/// Output elements per band (before rounding the band to whole words of columns).
const BAND_ELEMENTS: u64 = 1 << 21;

/// Working memory of one stream at most: a band's packed words, zero points, scales,
/// products and output, and the group of every input row.
pub const BAND_BYTES: u64 = BAND_ELEMENTS * (1 + 4 + 4) + (4 << 20);

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

/// Each input row's group: `g_idx` (checked in range), else `i / group_size`.
fn groups_of(input: &TransposedInt<'_>) -> Result<Vec<u32>, CopyError> {
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

/// Output rows per band: whole words of columns, at least one word.
fn band_rows(layout: TransposedIntLayout) -> u64 {
    let p = layout.per_word().max(8);
    ((BAND_ELEMENTS / layout.inputs.max(1)) / p * p).max(p)
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
    let unit = band_rows(layout);
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
    groups: &[u32],
    rows: std::ops::Range<u64>,
    to: DType,
    cancel: &dyn Stop,
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> Result<(), CopyError> {
    let step = band_rows(input.layout);
    let mut band = Band::default();
    let mut o0 = rows.start;
    while o0 < rows.end {
        if cancel.stop() {
            return Err(CopyError::Cancelled);
        }
        let o1 = (o0 + step).min(rows.end);
        band.read(input, o0..o1)?;
        band.dequantize(input.layout, groups, o0..o1, to);
        if let Some(merge) = input.merge {
            merge.merge(o0 as usize, to, &mut band.output)?;
        }
        sink(&band.output).map_err(CopyError::Io)?;
        o0 = o1;
    }
    Ok(())
}

/// One band's inputs and output buffers.
#[derive(Default)]
struct Band {
    /// The band's words of every packed row, row after row.
    packed: Vec<u8>,
    /// Zero points, `[groups, band]`, unpacked.
    zeros: Vec<i32>,
    zero_words: Vec<u8>,
    /// Scales, `[groups, band]`, as f32.
    scales: Vec<f32>,
    scale_bytes: Vec<u8>,
    wide: Vec<u8>,
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
        self.packed
            .resize((packed_rows * band_words * 4) as usize, 0);
        for r in 0..packed_rows {
            let at = input.qweight.1.offset + (r * row_words + first_word) * 4;
            let dst = &mut self.packed
                [(r * band_words * 4) as usize..((r + 1) * band_words * 4) as usize];
            read_exact_at(input.qweight.0, dst, at)?;
        }
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

    /// The band's output rows `cols` (output features) of every input column.
    fn dequantize(
        &mut self,
        layout: TransposedIntLayout,
        groups: &[u32],
        cols: std::ops::Range<u64>,
        to: DType,
    ) {
        let p = layout.per_word();
        let n = (cols.end - cols.start) as usize;
        let inputs = layout.inputs as usize;
        let size = to.size() as usize;
        let bits = u32::from(layout.bits);
        let mask = (1u32 << bits) - 1;
        self.output.resize(n * inputs * size, 0);
        let band_words = match layout.packing {
            Packing::Gptq { .. } => n,
            Packing::Awq => n.div_ceil(p as usize),
        };
        for (local, o) in cols.clone().enumerate() {
            let out = &mut self.output[local * inputs * size..(local + 1) * inputs * size];
            let slot = layout.column_slot(o);
            for (i, &g) in groups.iter().enumerate() {
                let q = match layout.packing {
                    Packing::Gptq { .. } => {
                        let w = word(&self.packed, (i / p as usize) * band_words + local);
                        (w >> ((i as u32 % p as u32) * bits)) & mask
                    }
                    Packing::Awq => {
                        let w = word(&self.packed, i * band_words + local / p as usize);
                        (w >> (slot * bits)) & mask
                    }
                };
                let at = g as usize * n + local;
                let product = (q as i32 - self.zeros[at]) as f32 * self.scales[at];
                let value = super::packed_int::output_bits(product, layout.scale_dtype, to);
                out[i * size..(i + 1) * size].copy_from_slice(&value.to_le_bytes()[..size]);
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

    /// 16 inputs × 8 outputs, 4 bits, 2 groups of 8; codes `(i·3 + o·5) mod 16`;
    /// zero points 0 and 15 in group 0's first columns (a v1 word then carries).
    fn case(packing: Packing) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<f32>) {
        let (inputs, outputs, groups) = (16usize, 8usize, 2usize);
        let code = |i: usize, o: usize| ((i * 3 + o * 5) % 16) as u32;
        let zero = |g: usize, o: usize| match (g, o) {
            (0, 0) => 0,
            (0, 1) => 15,
            _ => ((g * 7 + o * 3) % 16) as u32,
        };
        let scale = |g: usize, o: usize| half::f16::from_f32(0.01 + (g * 8 + o) as f32 * 0.003);
        let v1 = packing == Packing::Gptq { v1: true };
        // Column k of a word of eight: AWQ interleaves them.
        let slot = |o: usize| match packing {
            Packing::Awq => [0, 4, 1, 5, 2, 6, 3, 7][o % 8],
            Packing::Gptq { .. } => o % 8,
        };
        let qweight: Vec<u32> = match packing {
            Packing::Gptq { .. } => (0..inputs / 8)
                .flat_map(|r| {
                    (0..outputs)
                        .map(move |o| (0..8).fold(0, |w, k| w | code(r * 8 + k, o) << (4 * k)))
                })
                .collect(),
            Packing::Awq => (0..inputs)
                .map(|i| (0..outputs).fold(0, |w, o| w | code(i, o) << (4 * slot(o))))
                .collect(),
        };
        let stored = |g, o| {
            if v1 {
                zero(g, o).wrapping_sub(1) & 0xF
            } else {
                zero(g, o)
            }
        };
        let qzeros: Vec<u32> = (0..groups)
            .map(|g| (0..outputs).fold(0, |w, o| w | stored(g, o) << (4 * slot(o))))
            .collect();
        let scales: Vec<u8> = (0..groups)
            .flat_map(|g| (0..outputs).map(move |o| scale(g, o)))
            .flat_map(half::f16::to_le_bytes)
            .collect();
        // What GPTQModel reads: v1 words plus one in every value, carries included.
        let read_zero = |g: usize, o: usize| {
            let w = if v1 {
                qzeros[g].wrapping_add(0x1111_1111)
            } else {
                qzeros[g]
            };
            (w >> (4 * slot(o))) & 0xF
        };
        let expected: Vec<f32> = (0..outputs)
            .flat_map(|o| {
                (0..inputs).map(move |i| {
                    let g = i / 8;
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
        for packing in [
            Packing::Gptq { v1: true },
            Packing::Gptq { v1: false },
            Packing::Awq,
        ] {
            let (qweight, qzeros, scales, expected) = case(packing);
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
                    inputs: 16,
                    outputs: 8,
                    bits: 4,
                    groups: 2,
                    group_size: 8,
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
            assert_eq!(got, expected, "{packing:?}");
        }
        // v1's carry: zero point 0 is stored as 15, whose +1 carries into column 1.
        let (_, qzeros, _, _) = case(Packing::Gptq { v1: true });
        let word = u32::from_le_bytes([qzeros[0], qzeros[1], qzeros[2], qzeros[3]]);
        assert_eq!((word.wrapping_add(0x1111_1111) >> 4) & 0xF, 0);
    }
}
